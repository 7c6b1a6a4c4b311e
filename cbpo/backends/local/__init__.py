"""The local backend: one process on this machine (CPU or one GPU) trains with the suite's own
loops, SFT (``sft.py``) and RL (``rl.py``), and resumes from its last step checkpoint
(``state.py``); ``launch.py`` takes a run from ``python -m cbpo.train``."""
from cbpo.schema import register_backend

register_backend("local", launch="cbpo.backends.local.launch:run_local")
