"""Issue 12 "Done when" (b): the verl path's grouped agent loop, driven by a fake LLM server,
builds the same rollouts as the local engine: parents, branches at the planned positions, masks,
entropies, rewards, and copied tool calls not re-run. Both sides answer every context with the
same deterministic script, so any difference is the path's, not the sampler's."""
import asyncio
import zlib
from types import SimpleNamespace

import pytest

from cbpo import registry
from cbpo.backends.verl import agent_loop
from cbpo.rollout.agent import AgentConfig, run_agent
from cbpo.rollout.engine import Sample
from cbpo.rollout.vllm_engine import stop_reason

BUDGET = 8


@pytest.fixture(scope="module")
def tokenizer():
    from cbpo.models import train_tokenizer

    return train_tokenizer(["<python>print(1 + 2)</python><result>\n3\n</result><answer>\\boxed{3}</answer>",
                            "What is 1 plus 2? We add the numbers."] * 20, 300)


def reply(tokenizer, context, cap, stop_ids):
    """A deterministic function of the context: filler words, then a Python call in the first
    turn and an answer after an observation; per-token entropies vary with the context."""
    h = zlib.crc32(bytes(str(context), "utf8"))
    enc = lambda s: tokenizer.encode(s, add_special_tokens=False)
    filler = enc(" We add the numbers." * (1 + h % 3))
    turn = enc("<answer>\\boxed{3}</answer>") if enc("</result>")[0] in context else enc("<python>print(1 + 2)</python>")
    ids = (filler + turn)[:cap]
    stop = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    ids = ids if stop is None else ids[: stop + 1]
    entropies = [((h >> (p % 24)) % 97) / 40 for p in range(len(ids))]
    finish, why = ("stop", ids[-1]) if stop is not None else ("length", None)
    return ids, [-e / 3 for e in entropies], entropies, finish, why


class ScriptedEngine:
    """The local side: ``HFEngine.sample``'s contract answered by ``reply``."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def sample(self, contexts, max_new_tokens, stop_token_ids=frozenset(), stop_strings=()):
        caps = [max_new_tokens] * len(contexts) if isinstance(max_new_tokens, int) else max_new_tokens
        out = []
        for row, (ctx, cap) in enumerate(zip(contexts, caps)):
            ids, lps, ents, finish, why = reply(self.tokenizer, list(ctx), cap, frozenset(stop_token_ids))
            s = Sample(token_ids=ids, logprobs=lps, entropies=ents)
            s.stop, s.stop_match = stop_reason(finish, why, ids, frozenset(stop_token_ids), row)
            out.append(s)
        return out


class FakeServer:
    """verl's ``LLMServerClient.generate`` with the suite's server contract; records requests.
    Its prefix cache serves a request the longest prefix of its prompt that an earlier request's
    prompt shares (vLLM's counts whole blocks; this fake counts tokens)."""

    def __init__(self, tokenizer):
        self.tokenizer, self.requests, self.cached = tokenizer, [], []

    async def generate(self, request_id, *, prompt_ids, sampling_params):
        cached = max((next((i for i, (a, b) in enumerate(zip(p, prompt_ids)) if a != b), min(len(p), len(prompt_ids)))
                      for _, p, _ in self.requests), default=0)
        self.cached.append(cached)
        self.requests.append((request_id, prompt_ids, sampling_params))
        await asyncio.sleep(0)  # let the other requests of the round in
        ids, lps, ents, finish, why = reply(self.tokenizer, prompt_ids, sampling_params["max_tokens"],
                                            frozenset(sampling_params["stop_token_ids"]))
        return SimpleNamespace(token_ids=ids, log_probs=lps, extra_fields={
            agent_loop.ENTROPIES: ents, agent_loop.FINISH: finish, agent_loop.STOP: why,
            agent_loop.CACHED: cached})


def cbpo(tokenizer):
    return registry.get_method("cbpo")(vocab_size=len(tokenizer), budget=BUDGET, n0=3, w=2, d_min=3, top_k=3, kappa=0.0)


def setup(tokenizer):
    calls = []

    def python(code):
        calls.append(code)
        return "3\n"

    rewards = lambda trajs, row: [setattr(t, "reward", float(len(t.response_ids) % 2)) for t in trajs]
    encode = lambda q: tokenizer.encode(q, add_special_tokens=False)
    return {"python": python}, calls, rewards, encode


def strip(t):
    return {**t.__dict__, "tool_seconds": 0.0}


def test_grouped_agent_loop_builds_the_local_engines_rollouts(tokenizer):
    row = {"id": "p", "question": "What is 1 plus 2?", "answer": "3", "domain": "math"}
    agent = AgentConfig(max_new_tokens=40, max_total_tokens=120)

    tools, local_calls, score, encode = setup(tokenizer)
    local_engine = ScriptedEngine(tokenizer)
    (local,) = registry.collect(cbpo(tokenizer), [encode(row["question"])],
                                lambda trajs: run_agent(local_engine, tokenizer, trajs, tools, agent),
                                registry.Problems([row], encode, lambda gs, idx: None))
    score(local, row)

    tools, verl_calls, score, encode = setup(tokenizer)
    server = FakeServer(tokenizer)

    async def verl_side():
        loop = asyncio.get_running_loop()
        rollouts = agent_loop.GroupRollouts(
            cbpo(tokenizer), tokenizer, tools, agent, lambda uid: agent_loop.ServerEngine(server.generate, loop, uid, top_k_entropy=3),
            encode, score, BUDGET)
        # verl's M calls for one uid, concurrently and in order, as its agent-loop worker makes them
        return await asyncio.gather(*(rollouts.rollout("uid-p", row, 0, 1, [0]) for _ in range(BUDGET)))

    outputs = asyncio.run(verl_side())
    assert [k for _, k, _, _, _ in outputs] == list(range(BUDGET))
    remote = [t for t, _, _, _, _ in outputs]
    assert all(answered is row for _, _, answered, _, _ in outputs)
    # no search tool, no draws: the group's prefill counts only, with rollout 0
    prompts = sum(len(p) for _, p, _ in server.requests)
    assert outputs[0][3] == {"prefill_tokens": prompts, "prefill_cached_tokens": sum(server.cached),
                             "prefill_computed_tokens": prompts - sum(server.cached)}
    assert sum(server.cached) > 0
    assert all(counts == dict.fromkeys(agent_loop.PREFILL_STATS, 0) for _, _, _, counts, _ in outputs[1:])

    kinds = [t.kind for t in local]
    assert "branch" in kinds and kinds.count("parent") == 3  # the plan branched: the comparison is not vacuous
    assert [strip(t) for t in remote] == [strip(t) for t in local]  # parents, branches (parent, at), masks, rewards
    assert verl_calls == local_calls  # copied tool calls are not run again, on either path
    assert len(verl_calls) == sum(t.tool_calls - t.copied_tool_calls for t in remote)
    assert any(t.copied_tool_calls for t in remote if t.kind == "branch")  # some branch starts after a call
    # a branch is sent as its parent's exact token prefix: never re-tokenised text
    for t in remote:
        if t.kind == "branch":
            parent = remote[t.parent]
            cut = int(parent.model_positions()[t.at])
            assert t.response_ids[:cut] == parent.response_ids[:cut]
            assert any(p == parent.prompt_ids + parent.response_ids[:cut] for _, p, _ in server.requests)
    # one request id for the whole group: verl's router sends it to one server (sticky by problem)
    assert {rid for rid, _, _ in server.requests} == {"uid-p"}
    assert all(sp[agent_loop.TOP_K] == 3 and sp["logprobs"] for _, _, sp in server.requests)


def test_a_steps_search_counts_are_every_call_once_however_groups_overlap(tokenizer):
    """Two problems' groups run at once in one worker and share its search tool: the counts go
    with each group's rollout 0, zeros with the others, and add up to the calls made."""
    from cbpo.tools import CountedSearch

    agent = AgentConfig(max_new_tokens=40, max_total_tokens=120)
    python, calls, score, encode = setup(tokenizer)
    # the scripted model calls Python; the counted tool stands in for search under both names
    counted = CountedSearch(python["python"], cache=None)
    tools = {"python": counted, "search": counted}
    server = FakeServer(tokenizer)
    rows = [{"id": p, "question": q, "answer": "3", "domain": "math"}
            for p, q in (("p", "What is 1 plus 2?"), ("q", "We add the numbers. What is 1 plus 2?"))]

    async def worker():
        loop = asyncio.get_running_loop()
        rollouts = agent_loop.GroupRollouts(
            cbpo(tokenizer), tokenizer, tools, agent, lambda uid: agent_loop.ServerEngine(server.generate, loop, uid, top_k_entropy=3),
            encode, score, BUDGET)
        return await asyncio.gather(*(rollouts.rollout(f"uid-{row['id']}", row, i, 1, [i])
                                      for i, row in enumerate(rows) for _ in range(BUDGET)))

    outputs = asyncio.run(worker())
    assert len(calls) > 0
    firsts = [searches for _, k, _, searches, _ in outputs if k == 0]
    assert len(firsts) == 2 and sum(s["search_calls"] for s in firsts) == len(calls) == counted.calls
    assert all(s["search_cache_hits"] is None for s in firsts)  # no cache: nothing to count
    assert all(searches == {"search_calls": 0, "search_cache_hits": None, "search_cache_misses": None,
                            **dict.fromkeys(agent_loop.PREFILL_STATS, 0)}
               for _, k, _, searches, _ in outputs if k != 0)
    assert counted.since_last()["search_calls"] == 0  # nothing left over for the next step


def test_a_server_without_entropies_is_named(tokenizer):
    async def plain(request_id, *, prompt_ids, sampling_params):
        return SimpleNamespace(token_ids=[5], log_probs=[-0.1], extra_fields={})

    async def go():
        engine = agent_loop.ServerEngine(plain, asyncio.get_running_loop(), "u")
        return await asyncio.to_thread(engine.sample, [[1, 2]], 4)

    with pytest.raises(RuntimeError, match="sent no top-K entropies"):
        asyncio.run(go())


# DAPO's dynamic sampling inside a group: the row's problem, then replacements from the pool.

AGENT = AgentConfig(max_new_tokens=40, max_total_tokens=120)
STEP = 7  # verl's training step
BATCH = [0, 2]  # the step's batch rows, the group's among them


def dapo(**overrides):
    return registry.get_method("dapo")(budget=BUDGET, **overrides)


def problems(informative, n=6):
    """``n`` training rows, each with the rewards its group earns: all equal unless the row is
    informative, and different for every row, so a rollout's reward names its problem."""
    return [{"id": f"p{i}", "question": f"What is {i} plus 2?", "answer": str(i + 2), "domain": ("math", "search")[i % 2],
             "rewards": [float((i + 1) * (k % 2)) if i in informative else float(i) for k in range(BUDGET)]}
            for i in range(n)]


def dapo_group(tokenizer, method, rows, index, pool=None):
    """verl's M calls for the training row ``index``, in one worker: the GroupRollouts, its
    outputs and the problems whose first turn the server was asked for, in order."""
    tools, _, _, encode = setup(tokenizer)
    server = FakeServer(tokenizer)

    def score(trajs, row):
        for t, r in zip(trajs, row["rewards"]):
            t.reward = r

    async def worker():
        loop = asyncio.get_running_loop()
        rollouts = agent_loop.GroupRollouts(
            method, tokenizer, tools, AGENT, lambda uid: agent_loop.ServerEngine(server.generate, loop, uid, top_k_entropy=3),
            encode, score, BUDGET, rows if pool is None else pool, seed=0)
        return rollouts, await asyncio.gather(*(rollouts.rollout("uid", rows[index], index, STEP, BATCH) for _ in range(BUDGET)))

    rollouts, outputs = asyncio.run(worker())
    drawn = [r["id"] for _, p, _ in server.requests for r in rows if p == encode(r["question"])]
    return rollouts, outputs, list(dict.fromkeys(drawn))


def answers(tokenizer, outputs, row):
    """The outputs are the M rollouts of ``row``'s problem: its prompt, rewards and row."""
    encode = setup(tokenizer)[3]
    assert all(t.prompt_ids == encode(row["question"]) for t, _, _, _, _ in outputs)
    assert [t.reward for t, _, _, _, _ in outputs] == row["rewards"]
    assert all(answered is row for _, _, answered, _, _ in outputs)


def counts_on_rollout_zero(outputs, **first):
    """The draws counted with rollout 0, zeros with the others (beside the prefill counts)."""
    draws = [{key: n for key, n in counts.items() if key not in agent_loop.PREFILL_STATS} for _, _, _, counts, _ in outputs]
    assert draws[0] == first
    assert all(d == dict.fromkeys(first, 0) for d in draws[1:])


def test_an_uninformative_rows_group_is_replaced_by_a_replacements_informative_group(tokenizer):
    rows = problems(informative={1, 2, 3, 4, 5})
    rollouts, outputs, drawn = dapo_group(tokenizer, dapo(), rows, 0)
    replacement = rollouts.replacements(0, STEP, BATCH)[0]
    assert replacement is not rows[0]
    answers(tokenizer, outputs, replacement)
    assert drawn == ["p0", replacement["id"]]  # lazily: no other replacement was rolled out
    # the row's own group, drawn and not returned, counted as the local trainer counts it
    tools, _, _, encode = setup(tokenizer)
    (row_group,) = registry.sample_fresh([encode(rows[0]["question"])], BUDGET,
                                         lambda trajs: run_agent(ScriptedEngine(tokenizer), tokenizer, trajs, tools, AGENT))
    assert sum(t.tool_calls for t in row_group) > 0
    counts_on_rollout_zero(outputs, kept_groups=1, extra_rollouts=BUDGET,
                           extra_generated_tokens=sum(t.generated_tokens for t in row_group),
                           extra_tool_calls=sum(t.tool_calls for t in row_group))


def test_an_informative_first_group_draws_no_replacement(tokenizer):
    rows = problems(informative={0})
    _, outputs, drawn = dapo_group(tokenizer, dapo(), rows, 0)
    answers(tokenizer, outputs, rows[0])
    assert drawn == ["p0"]
    counts_on_rollout_zero(outputs, kept_groups=1, extra_rollouts=0, extra_generated_tokens=0, extra_tool_calls=0)


def test_when_no_draw_is_informative_the_last_drawn_group_is_returned(tokenizer):
    rows = problems(informative=set())
    rollouts, outputs, drawn = dapo_group(tokenizer, dapo(max_num_gen_batches=3), rows, 2)
    first, last = rollouts.replacements(2, STEP, BATCH)
    answers(tokenizer, outputs, last)
    assert drawn == ["p2", first["id"], last["id"]]
    assert outputs[0][3]["kept_groups"] == 0 and outputs[0][3]["extra_rollouts"] == 2 * BUDGET


def test_replacement_draws_are_deterministic_and_no_problem_serves_two_rows_of_a_step():
    # Issue 24.4 on verl: each row's group draws in its own worker, so independent draws could
    # offer one problem to two rows of a step (or a row's problem to another row) and train it twice.
    def replacements(rows, seed, index, batch, step=STEP, draws=3):
        return [r["id"] for r in agent_loop.GroupRollouts(dapo(max_num_gen_batches=draws), None, {}, AGENT, None, None,
                                                          None, BUDGET, rows, seed).replacements(index, step, batch)]

    rows = problems(informative=set(), n=12)
    batch = [1, 5, 8]
    drawn = {(seed, i): replacements(rows, seed, i, batch) for seed in (0, 1) for i in batch}
    for seed in (0, 1):
        offered = [p for i in batch for p in drawn[seed, i]]
        assert len(offered) == 6 == len(set(offered)) and not {f"p{i}" for i in batch} & set(offered)
    assert drawn == {(seed, i): replacements(rows, seed, i, batch) for seed, i in drawn}  # a rerun
    assert replacements(rows, 0, 5, list(reversed(batch))) == drawn[0, 5]  # verl's row order does not matter
    assert any(drawn[0, i] != drawn[1, i] for i in batch)  # the seed matters
    # another step (the row's next epoch) is offered other replacements, as the local trainer draws afresh
    assert any(replacements(rows, 0, i, batch, STEP + 3) != drawn[0, i] for i in batch)
    # a pool too small for the whole batch: the last rows' offers end with their own problem
    # (which DAPO does not draw twice), still no problem offered to two rows
    small = {i: replacements(rows[:6], 0, i, [0, 1, 2]) for i in (0, 1, 2)}
    dealt = [p for i, r in small.items() for p in r if p != f"p{i}"]
    assert [len(r) for r in small.values()] == [2, 2, 2] and len(dealt) == len(set(dealt)) == 3
    assert small[2] == ["p2", "p2"]
    with pytest.raises(ValueError, match="not in its step's batch"):
        replacements(rows, 0, 3, batch)
    with pytest.raises(ValueError, match="the pool has 1"):
        replacements(rows[:1], 0, 0, [0])


@pytest.mark.parametrize("overrides", [{"filter_groups": False}, {"max_num_gen_batches": 1}])
def test_dapo_offered_one_problem_trains_the_rows_group_and_counts_no_draws(tokenizer, overrides):
    # filter_groups=false: no dynamic sampling. One draw ("filter without resampling"): the
    # row's uninformative group is the last drawn, so verl still gets M rollouts.
    rows = problems(informative=set())
    _, outputs, drawn = dapo_group(tokenizer, dapo(**overrides), rows, 1, pool=())
    answers(tokenizer, outputs, rows[1])
    assert drawn == ["p1"] and all(set(counts) == set(agent_loop.PREFILL_STATS) for _, _, _, counts, _ in outputs)


# OC-GRPO: privileged rollouts are returned hint-free and carry their hinted prompt and leak flag.

def oc_grpo(tokenizer):
    method = registry.get_method("oc_grpo")(budget=4)
    method.setup(None, tokenizer, 1.0)  # as the verl worker sets it up: no model, the actor rescores
    return method


def test_oc_grpo_rollouts_carry_their_hinted_prompt_and_leak_flag_and_concurrent_groups_keep_their_own(tokenizer):
    from baselines.oc_grpo import hint

    tools, _, _, encode = setup(tokenizer)
    rows = [{"id": p, "question": q, "answer": a, "domain": "math"}
            for p, q, a in (("p", "What is 1 plus 2?", "3"), ("q", "We add the numbers.", "5"))]
    hinted = {r["id"]: encode(f"{r['question']}\n\n{hint(r)}") for r in rows}
    leak = tokenizer.encode(hint(rows[0]), add_special_tokens=False)
    assert tokenizer.decode(leak) == hint(rows[0])  # the scripted leak reads back as the hint
    server = FakeServer(tokenizer)
    answered = []

    async def generate(request_id, *, prompt_ids, sampling_params):
        out = await server.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params)
        if prompt_ids == hinted["p"] and not answered:  # problem p's first privileged rollout copies the hint
            answered.append(request_id)
            out.token_ids, out.log_probs = leak, [0.0] * len(leak)
            out.extra_fields = {**out.extra_fields, agent_loop.ENTROPIES: [0.0] * len(leak)}
        return out

    def score(trajs, row):  # every rollout fails: both problems get privileged rollouts
        for t in trajs:
            t.reward = 0.0

    async def worker():
        loop = asyncio.get_running_loop()
        rollouts = agent_loop.GroupRollouts(
            oc_grpo(tokenizer), tokenizer, tools, AGENT, lambda uid: agent_loop.ServerEngine(generate, loop, uid, top_k_entropy=3),
            encode, score, 4)
        return rollouts, await asyncio.gather(*(rollouts.rollout(f"uid-{row['id']}", row, i, 1, [i])
                                                for i, row in enumerate(rows) for _ in range(4)))

    rollouts, outputs = asyncio.run(worker())
    # the groups ran collect at once, each on its own copy of the method: the shared one keeps no group's state
    assert rollouts.method.last_hinted == []
    for g, row in enumerate(rows):
        group = outputs[4 * g : 4 * g + 4]
        assert [t.kind for t, *_ in group] == ["parent", "parent", "privileged", "privileged"]
        assert all(t.prompt_ids == encode(row["question"]) for t, *_ in group)  # trained hint-free
        assert [off for *_, off in group] == [([], False), ([], False),
                                              (hinted[row["id"]], row["id"] == "p"), (hinted[row["id"]], False)]
    assert outputs[2][0].response_ids[: len(leak)] == leak
    assert sum(p == hinted["q"] for _, p, _ in server.requests) == 2  # q's privileged contexts were sampled


# A method's own random draws (Tree-GRPO's nodes): per group, whatever worker or thread runs it.

def test_a_groups_random_draws_are_its_own_whatever_worker_runs_it_and_whatever_ran_before(tokenizer):
    # Issue 24.5: every worker seeded its method alike and groups shared one generator, so a
    # group's draws depended on the groups its worker ran before it and on thread timing, and a
    # resumed run redrew. Now a group draws from (seed, step, row index) alone.
    rows = [{"id": f"p{i}", "question": q, "answer": "3", "domain": "math"}
            for i, q in enumerate(("What is 1 plus 2?", "We add the numbers.", "What is 2 plus 1?"))]
    tools, _, score, encode = setup(tokenizer)

    def tree_grpo():
        return registry.get_method("tree_grpo")(vocab_size=len(tokenizer), budget=BUDGET, expansions=1, seed=3)

    def worker(jobs):
        """One agent-loop worker's groups, ``(row index, step)`` each, run concurrently."""
        server = FakeServer(tokenizer)

        async def go():
            loop = asyncio.get_running_loop()
            rollouts = agent_loop.GroupRollouts(
                tree_grpo(), tokenizer, tools, AGENT, lambda uid: agent_loop.ServerEngine(server.generate, loop, uid, top_k_entropy=3),
                encode, score, BUDGET)
            outs = await asyncio.gather(*(rollouts.rollout(f"uid-{i}-{s}", rows[i], i, s, [i]) for i, s in jobs for _ in range(BUDGET)))
            assert rollouts.method.rng.bit_generator.state == tree_grpo().rng.bit_generator.state  # untouched
            return [[(t.parent, t.at) for t, *_ in outs[g * BUDGET:(g + 1) * BUDGET]] for g in range(len(jobs))]

        return asyncio.run(go())

    (alone,) = worker([(0, 5)])
    after_others = worker([(1, 5), (2, 5), (0, 5)])[2]
    assert after_others == alone  # the other groups drew nothing from row 0's generator
    draws = {tuple(worker([(0, s)])[0]) for s in range(1, 6)}
    assert len(draws) > 1  # each step draws afresh
