"""A problem's whole rollout group inside verl's agent loop, through verl's LLM server.

verl asks its agent loop for one output per batch row, and repeats each problem
``rollout.n`` = M times under one uid. ``GroupRollouts`` turns those M calls into one group: the
first call for a uid runs the method's own ``collect`` (parents, exact-prefix branches,
fillers, in-loop scoring) with the suite's agent loop and tools, the M calls share it, and
call k returns rollout k. The rollouts are therefore built by the same code as on the local
backend; only the engine differs: ``ServerEngine`` serves ``SamplingEngine.sample``'s contract from
verl's server, one request per context, so a branch is its parent's token ids up to the
boundary (never re-tokenised text) and a copied tool call is never run again.

Server contract. verl 0.9's vLLM server returns the sampled token's log-prob only and folds the
finish reason into "completed". Eq. 6 needs top-K entropies while the parents are still being
sampled (they decide where branches start), before the actor ever sees the batch, so they
cannot come from the actor's forward pass. The suite's server (``server.py``, which verl runs in
place of its own) is asked for ``logprobs=K`` and reduces them on its side to one entropy per
token (``cbpo.rollout.vllm_engine.top_k_entropy``), sent back in ``TokenOutput.extra_fields``
with vLLM's finish and stop reasons (``ENTROPIES``, ``FINISH``, ``STOP``): one float per token
crosses Ray instead of K pairs.

Replacement problems. A method offered more problems than it trains on (``registry.prompt_pool``
= P > 1: DAPO's dynamic sampling) chooses per batch row here: verl's v0 trainer has a fixed
batch, so the choice that verl's v1 replay buffer makes by refilling evicted groups happens
inside the group. The method is offered the row's problem and P - 1 replacements from the run's
training rows, draws them lazily and keeps the first informative group, which is what verl trains
under the row's uid; the rollouts it drew and does not return are counted (``DRAW_STATS``).

A method's own random draws (``rng``: Tree-GRPO's nodes, ARPO's and AEPO's branches) come, for
each group, from a generator of its own seeded by the method's seed, the training step and the
row's index (``GroupRollouts.method_rng``): every agent-loop worker builds the method with the
same seed and groups collect at once in threads, so one shared generator would give the
workers identical streams and each group draws that depend on thread timing. Keyed so, a
resumed run redraws exactly what the first run drew at that step with no generator state to
checkpoint; the local trainer, one process, checkpoints its method's generator instead.
"""
from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any, Awaitable, Callable, Mapping, Sequence

import numpy as np

from cbpo import registry
from cbpo.rollout.agent import AgentConfig, run_agent
from cbpo.rollout.engine import Sample, SamplingEngine, check_sampling_settings
from cbpo.rollout.vllm_engine import stop_reason
from cbpo.tools import step_search_stats
from cbpo.trajectory import Trajectory

ENTROPIES, FINISH, STOP = "cbpo_entropies", "cbpo_finish_reason", "cbpo_stop_reason"
CACHED = "cbpo_cached_tokens"  # the prompt tokens vLLM's prefix cache served for the request
# A group's prefill counts (ServerEngine.rollout_counts), under the local vLLM engine's names.
PREFILL_STATS = ("prefill_tokens", "prefill_cached_tokens", "prefill_computed_tokens")
TOP_K = "cbpo_top_k_entropy"  # the sampling parameter that asks the server for them
STEP = "cbpo_step"  # verl's training step, a column of each generation row (SuiteTrainer._get_gen_batch)
BATCH_ROWS = "cbpo_batch_rows"  # the training-row indices of the step's whole batch, a column of each row
# A group's draws of replacement problems, under the local trainer's names (DAPO.step_stats): 1 if
# the method kept an informative group, and the rollouts drawn and not returned to verl.
DRAW_STATS = ("kept_groups", "extra_rollouts", "extra_generated_tokens", "extra_tool_calls")


class ServerEngine(SamplingEngine):
    """``SamplingEngine.sample`` over an async ``generate(request_id, *, prompt_ids, sampling_params)``
    (verl's ``LLMServerClient``) running on ``loop``; ``sample`` is called from another thread
    (the method's collect) and waits for all of one round's requests, sent concurrently.

    Every request of the engine (one per problem) goes under one id, ``request_id``: verl's
    router keeps an id on the server it first chose (``GlobalRequestLoadBalancer``'s sticky
    session), so a problem's parents, branches and later turns reach the server whose prefix
    cache holds their prompt and prefixes; verl's client sends vLLM a fresh uuid per call
    (``LLMServerClient._vllm_request_id``; not under ``rollout.full_determinism``, which the suite
    never sets), so concurrent requests never share a vLLM id."""

    def __init__(self, generate: Callable[..., Awaitable[Any]], loop: asyncio.AbstractEventLoop, request_id: str,
                 top_k_entropy: int = 10, temperature: float = 1.0, top_p: float = 1.0) -> None:
        check_sampling_settings(top_k_entropy, temperature, top_p)
        self.generate, self.loop, self.request_id = generate, loop, request_id
        self.top_k_entropy, self.temperature, self.top_p = top_k_entropy, temperature, top_p
        self.prefill_tokens = self.prefill_cached_tokens = 0  # prompt tokens sent, and served by the prefix cache

    def _sample(self, contexts, budgets, stop_ids, stop_strings) -> list[Sample]:
        samples = [Sample() for _ in contexts]
        active = [i for i, cap in enumerate(budgets) if cap > 0]
        requests = [self._one(i, list(contexts[i]), budgets[i], stop_ids, stop_strings) for i in active]
        done = asyncio.run_coroutine_threadsafe(_gather(requests), self.loop).result()
        for i, s in zip(active, done):
            samples[i] = s
        return samples

    async def _one(self, row: int, context: list[int], cap: int, stop_ids: frozenset[int], stop_strings) -> Sample:
        out = await self.generate(self.request_id, prompt_ids=context, sampling_params={
            "temperature": self.temperature, "top_p": self.top_p, "top_k": -1, "max_tokens": cap,
            "stop_token_ids": sorted(stop_ids), "stop": list(stop_strings), "include_stop_str_in_output": True,
            "skip_special_tokens": False, "logprobs": True, TOP_K: self.top_k_entropy,
        })
        extra = out.extra_fields
        if ENTROPIES not in extra:
            raise RuntimeError("the LLM server sent no top-K entropies: it must be the suite's server "
                               f"(sampling parameter {TOP_K!r}, see cbpo/backends/verl/agent_loop.py)")
        self.prefill_tokens += len(context)
        self.prefill_cached_tokens += int(extra.get(CACHED) or 0)  # None: nothing cached
        ids = [int(t) for t in out.token_ids]
        s = Sample(token_ids=ids, logprobs=[float(x) for x in out.log_probs], entropies=[float(x) for x in extra[ENTROPIES]])
        s.stop, s.stop_match = stop_reason(extra[FINISH], extra[STOP], ids, stop_ids, row)
        return s

    def rollout_counts(self) -> dict[str, int]:
        """Since start: :meth:`VLLMEngine.rollout_counts`' prefill counts (vLLM's engine steps
        are the server's, not seen here)."""
        return {"prefill_tokens": self.prefill_tokens, "prefill_cached_tokens": self.prefill_cached_tokens,
                "prefill_computed_tokens": self.prefill_tokens - self.prefill_cached_tokens}


async def _gather(requests):
    return await asyncio.gather(*requests)


class GroupRollouts:
    """One method group per uid, shared by the M agent-loop calls verl makes for it.

    ``score(trajs, row)`` sets each rollout's reward (the suite's ``Rewarder``): the outputs
    carry it as ``reward_score``, so verl's reward stage scores nothing twice, and methods that
    score inside collect (DAPO, OC-GRPO) get it through ``Problems`` as locally. ``pool`` (the
    run's training rows, row i at the verl row's ``index`` i) and ``seed`` serve the
    replacement problems of a method with ``registry.prompt_pool`` > 1."""

    def __init__(self, method, tokenizer, tools: Mapping[str, Callable[[str], str]], agent: AgentConfig,
                 engine_for: Callable[[str], Any], encode: Callable[[str], list[int]],
                 score: Callable[[Sequence[Trajectory], Mapping[str, Any]], None], budget: int,
                 pool: Sequence[Mapping[str, Any]] = (), seed: int = 0) -> None:
        self.method, self.tokenizer, self.tools, self.agent = method, tokenizer, tools, agent
        self.engine_for, self.encode, self.score, self.budget = engine_for, encode, score, budget
        self.draws, self.pool, self.seed = registry.prompt_pool(method), pool, seed
        if self.draws > 1 and len(pool) < 2:
            raise ValueError(f"{method.name} offers {self.draws} problems per trained one, drawn from the training "
                             f"rows, but the pool has {len(pool)}")
        self._groups: dict[str, tuple[asyncio.Task, itertools.count]] = {}

    async def rollout(self, uid: str, row: Mapping[str, Any], index: int, step: int,
                      batch_rows: Sequence[int]) -> tuple[Trajectory, int, Mapping[str, Any], dict, tuple[list[int], bool]]:
        """Rollout k of the problem's group, k, the problem it answers (the row's, or the
        replacement the method kept), the group's counts and, for a privileged rollout
        (OC-GRPO), the hinted prompt it was sampled from and whether it leaked the hint
        (``([], False)`` for any other), for the k-th call with this uid at training ``step``, whose
        batch holds the training rows ``batch_rows``.

        The counts go with rollout 0, zeros with the others: the search counts
        (``CountedSearch.since_last`` of this worker's search tool, read as the group ends), the
        group's ``PREFILL_STATS`` (its engine's) and, for a method with replacement problems, its
        ``DRAW_STATS``. Groups running at once share
        the tool, so a group's search counts may hold another's calls, but every call is counted
        once, by a group of the step that made it (verl's trainer waits for all groups before it
        trains): summed over a step's batch they are the step's, as in the local trainer's line."""
        if uid not in self._groups:  # no await before this: the M calls start in order
            self._groups[uid] = (asyncio.ensure_future(asyncio.to_thread(self._collect, uid, row, index, step, batch_rows)),
                                 itertools.count())
        task, counter = self._groups[uid]
        k = next(counter)
        if k == self.budget - 1:
            del self._groups[uid]
        group, answered, counts, hinted = await task
        counts = counts if k == 0 else {key: None if n is None else 0 for key, n in counts.items()}
        return group[k], k, answered, counts, hinted.get(k, ([], False))

    def replacements(self, index: int, step: int, batch_rows: Sequence[int]) -> list[Mapping[str, Any]]:
        """The P - 1 problems offered after the pool's row ``index`` at training ``step``, whose
        batch holds the rows ``batch_rows``: never a row of the batch, and never a problem
        offered to another row of the step, as the local trainer offers each problem once per
        step. The pool's other rows are shuffled once per step (the run's seed and the step,
        not verl's uid, a fresh uuid every step: a rerun offers the same, every epoch others)
        and dealt out in turn, P - 1 to each of the batch's rows by its rank. Where the pool is
        too small for the whole batch, the last rows' offers end with their own problem again,
        which the method does not draw twice (DAPO's collect skips a prompt it has drawn)."""
        batch = sorted(set(int(i) for i in batch_rows))
        if index not in batch:
            raise ValueError(f"training row {index} is not in its step's batch rows {batch}")
        others = np.setdiff1d(np.arange(len(self.pool)), batch)
        order = np.random.default_rng([self.seed, step]).permutation(others)
        k, rank = self.draws - 1, batch.index(index)
        dealt = [self.pool[int(i)] for i in order[rank * k : (rank + 1) * k]]
        return dealt + [self.pool[index]] * (k - len(dealt))

    def method_rng(self, index: int, step: int) -> np.random.Generator:
        """The generator of the method's own draws for the group of the pool's row ``index`` at
        training ``step``: from the method's seed (the run's), never shared with another group."""
        return np.random.default_rng([getattr(self.method.cfg, "seed", self.seed), step, index, 1])

    def _collect(self, uid: str, row: Mapping[str, Any], index: int, step: int,
                 batch_rows: Sequence[int]) -> tuple[list[Trajectory], Mapping[str, Any], dict, dict[int, tuple[list[int], bool]]]:
        engine = self.engine_for(uid)
        # groups collect at once in threads: each on its own shallow copy, so what a method keeps
        # of its last collect (OC-GRPO's hinted prompts and leaks) is its group's
        method = copy.copy(self.method)
        if hasattr(method, "rng"):
            method.rng = self.method_rng(index, step)
        rows = [row, *self.replacements(index, step, batch_rows)] if self.draws > 1 else [row]
        drawn: list[tuple[Mapping[str, Any], list[Trajectory]]] = []  # in the order the method scores them

        def sample(trajs):
            return run_agent(engine, self.tokenizer, trajs, self.tools, self.agent)

        def score(groups, indices):
            for g, i in zip(groups, indices):
                self.score(g, rows[i])  # each problem's rollouts against its own answer
                drawn.append((rows[i], g))

        groups = registry.collect(method, [self.encode(r["question"]) for r in rows], sample,
                                  registry.Problems(rows, self.encode, score))
        kept = [(r, g) for r, g in zip(rows, groups) if g]
        # With no informative group in P draws the local trainer trains on fewer problems; verl's
        # batch has a fixed size, so the last drawn group goes back. Its outcome rewards are all
        # equal, so its advantage is zero, as if verl's DAPO recipe had left it out, unless the
        # overlong penalty differs within it; its tokens still count in token-mean's denominator.
        answered, group = kept[0] if kept else drawn[-1]
        if len(group) != self.budget:
            raise RuntimeError(f"{self.method.name} returned {len(group)} rollouts for {uid}, but verl asks for "
                               f"rollout.n = {self.budget} per problem")
        self.score([t for t in group if t.reward is None], answered)
        counts = step_search_stats(self.tools) | engine.rollout_counts()
        if self.draws > 1:  # the group returned to verl is trained even when no draw was informative
            counts |= {"kept_groups": len(kept), **registry.extra_stats((t for _, g in drawn for t in g), [group])}
        return group, answered, counts, privileged(method, groups, group)


def privileged(method, groups: Sequence[list[Trajectory]],
               group: list[Trajectory]) -> dict[int, tuple[list[int], bool]]:
    """The privileged rollouts of ``group``, one of ``groups`` from the method's last collect:
    slot -> (hinted prompt, leaked); none for a method without them."""
    if not method.off_context_credit:
        return {}
    x = next(i for i, g in enumerate(groups) if g is group)
    return {k: (list(p), k in method.last_leaks[x]) for k, p in method.last_hinted[x].items()}
