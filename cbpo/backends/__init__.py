"""Where training runs: ``backend=local`` (``cbpo.backends.local``: the suite's own loops on one device) or
``backend=verl`` (``cbpo.backends.verl``: Ray, FSDP and vLLM across GPUs and nodes). Both write
the same run layout: ``step_*`` checkpoints, ``metrics.jsonl`` and ``final/DONE.json``."""
