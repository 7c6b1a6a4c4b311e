"""Evaluation under one protocol for every method (paper Sec. 5.1), in three parts, each
importing only the ones below it (docs/architecture.md):

- ``verifiers/``: what "correct" means, shared with training's reward: ``extract`` (the final
  ``<answer>``/``\\boxed{}``), ``verify`` (math_verify in a process pool), ``qa_metrics``
  (token F1 / EM), ``judge`` (an LLM judge over an OpenAI-compatible endpoint), ``scoring``
  (metric -> scorer), ``metrics`` (pass@k, macro averages, bootstrap), ``gold`` (answer aliases).
- the evaluation loop: ``benchmarks`` (YAML configs -> rows, a benchmark's scorer), ``runner``
  (resumable per-sample evaluation), ``run`` (``python -m eval.run``, one model on one benchmark).
- publishing: ``report`` (tables), ``figures``, ``forced`` (the forced-choice table),
  ``credit_lab``, ``index`` and ``site/`` (the results browser), each ``python -m eval.<name>``.

``python -m eval score`` scores a file of answers with the verifiers alone.
"""
