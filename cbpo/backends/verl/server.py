"""The suite's vLLM server for verl: verl 0.9.1's ``vLLMHttpServer`` that also serves Eq. 6.

A request whose sampling parameters carry ``cbpo_top_k_entropy`` = K (``ServerEngine``,
agent_loop.py) is run by verl's own ``generate`` with two differences: vLLM is asked for
``logprobs=K`` instead of verl's 0, and the returned ``TokenOutput`` carries, in
``extra_fields``, one truncated top-K entropy per generated token (``top_k_entropy``, the local
vLLM engine's reduction), vLLM's own finish and stop reasons, which verl folds into
"completed", and the prompt tokens vLLM's prefix cache served (``num_cached_tokens``). Every
other request, and every other field, is verl's. ``SuiteReplica`` runs this server; the trainer
(trainer.py) makes it the replica verl builds for ``rollout.name`` "vllm".

Checked in verl 0.9.1's source (``vllm_async_server.py``, ``llm_server.py``, ``replica.py``):

* ``generate`` builds ``SamplingParams(max_tokens=..., **sampling_params)`` (an unknown key is an
  error, so K is taken out first), sets ``logprobs`` to 0 or None, then calls
  ``self.engine.generate(prompt=, sampling_params=, request_id=, ...)`` once with the request id
  it was given and keeps the last ``RequestOutput``. The sampled token's log-prob is read as
  ``logprobs[token_ids[i]]``, which holds whatever the number of entries, so ``log_probs`` stay
  verl's. ``self.engine`` is set by ``run_server``; this class wraps whatever engine it is given.
* verl's client sends every call under a fresh uuid (the caller's id under full determinism), so
  a request id names one live request: concurrent requests are told apart by it.
* The engine's ``logprobs_mode`` is ``rollout.logprobs_mode`` (verl's default
  ``processed_logprobs``), and ``rollout.engine_kwargs.vllm`` is passed to ``vllm serve`` after
  verl's own arguments: config.py sets ``raw_logprobs`` (Eq. 6 is of the raw distribution, and
  ``log_probs`` are then the raw policy's, as on the local vLLM engine) and ``max_logprobs``.

Assumed about vLLM 0.24.0 (as in cbpo/rollout/vllm_engine.py, not run here): ``logprobs=K``
gives per position the K most likely tokens and the sampled one; ``raw_logprobs`` are taken
before temperature and top-p; ``SamplingParams`` may be changed after it is built and
``max_logprobs`` is checked when the engine adds the request; outputs are cumulative, so the
last one holds every position (verl relies on this too). A request verl aborts is an error, not
a sample (verl aborts for weight syncs, which its synchronous trainer makes between steps).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ray
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica

from cbpo.backends.verl.agent_loop import CACHED, ENTROPIES, FINISH, STOP, TOP_K
from cbpo.rollout.vllm_engine import top_k_entropy


@dataclass
class _Asked:
    """A request that asked for top-K entropies, and vLLM's last output for it."""

    k: int
    final: Any = None


class _TopKEngine:
    """vLLM's engine as verl's server sees it, except that ``generate`` gives the requests that
    asked for K their ``logprobs=K`` and keeps their last output."""

    def __init__(self, engine, asked: dict[str, _Asked]) -> None:
        self._engine, self._asked = engine, asked

    def __getattr__(self, name):  # pause, sleep, collective_rpc, ...: the engine's own
        return getattr(self._engine, name)

    async def generate(self, *, sampling_params, request_id, **kwargs):
        asked = self._asked.get(request_id)
        if asked is not None:
            sampling_params.logprobs = asked.k
        async for output in self._engine.generate(sampling_params=sampling_params, request_id=request_id, **kwargs):
            if asked is not None:
                asked.final = output
            yield output


class SuiteServer(vLLMHttpServer):
    """verl's vLLM server, plus top-K entropies and vLLM's finish and stop reasons for the
    requests that ask for them (``TOP_K`` in their sampling parameters)."""

    def __init__(self, *args, **kwargs) -> None:
        self._asked: dict[str, _Asked] = {}  # by request id: requests run concurrently
        super().__init__(*args, **kwargs)

    @property
    def engine(self):
        return self._engine

    @engine.setter
    def engine(self, engine) -> None:
        self._engine = _TopKEngine(engine, self._asked)

    async def generate(self, prompt_ids, sampling_params: dict[str, Any], request_id: str, **kwargs) -> TokenOutput:
        sampling_params = dict(sampling_params)
        k = sampling_params.pop(TOP_K, None)
        if k is None:
            return await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        asked = self._asked[request_id] = _Asked(int(k))
        try:
            out = await super().generate(prompt_ids, sampling_params, request_id, **kwargs)
        finally:
            del self._asked[request_id]
        if out.stop_reason == "aborted":
            raise RuntimeError(f"request {request_id} was aborted (verl paused generation): a rollout group "
                               "cannot go on from a cut-off sample")
        completion = asked.final.outputs[0]
        out.extra_fields.update({
            ENTROPIES: [top_k_entropy(entries, asked.k) for entries in completion.logprobs],
            FINISH: completion.finish_reason, STOP: completion.stop_reason,
            CACHED: asked.final.num_cached_tokens,  # None: nothing cached
        })
        return out


class SuiteReplica(vLLMReplica):
    """verl's vLLM replica, running ``SuiteServer`` on each of its nodes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(SuiteServer)
