"""``backend=verl``: the RL stage on verl 0.9.x (Ray, FSDP, vLLM) for several GPUs and nodes.

``config.py`` turns the suite's Hydra config into verl's and checks it with verl's own
validation; ``agent_loop.py`` builds a problem's whole rollout group through verl's LLM server
with the method's own collect; ``credit.py`` computes every method's credit on verl's batch
(``DataProto``) with the method's own ``credit``; ``trainer.py`` holds the classes verl's Ray
processes build (task runner, trainer subclass, the registered agent loop); ``server.py`` is
verl's vLLM server plus the top-K entropies Eq. 6 needs (GPU only: it imports vLLM);
``launch.py`` is the entry (GPU only). Only ``trainer.py`` and ``server.py`` import verl and Ray
at module load (verl's import costs seconds), and only the launch and verl's workers import them.
"""
from cbpo.backends.verl.config import VerlConfig
from cbpo.schema import register_backend

register_backend("verl", launch="cbpo.backends.verl.launch:run_verl", sections={"verl": VerlConfig})
