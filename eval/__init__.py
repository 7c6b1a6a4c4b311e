"""Evaluation under one protocol for every method (paper Sec. 5.1).

Modules: ``benchmarks`` (YAML configs → rows), ``extract`` (final ``<answer>``/``\\boxed{}``),
``verify`` (math_verify in a process pool), ``qa_metrics`` (token F1 / EM), ``judge`` (LLM judge
over an OpenAI-compatible endpoint), ``scoring`` (metric → scorer), ``metrics`` (pass@k,
macro averages, bootstrap), ``runner`` (resumable per-sample evaluation). CLI: ``python -m eval``.
"""
