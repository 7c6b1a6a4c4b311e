"""Chain task, search domain (issue #25): ``twohop``'s two-hop questions, each followed by a
wrong claimed answer, with a decision before each search, the second one after the first
search's observation::

    In which country is the city where Bakoli was born? A forum post says the answer is Xan.

A winning trace looks the start entity up, restates the sentence that names the bridge,
looks the bridge up, restates the sentence that names the answer, and answers::

    <think>I need the city where Bakoli was born.</think><search>Bakoli</search><result>…</result>
    <think>Bakoli was born in Tarun.</think><search>Tarun</search><result>…</result>
    <think>Tarun is a city in Kesh.</think><answer>The answer is \\boxed{Kesh}</answer>

A trace loses at one decision: at the first by trusting the claim (``trust_claim``, as
SearchFork), or after the first observation by answering with the bridge it just found
(``answer_early``: a city where a country is asked, never the answer)::

    <think>I need the city where Bakoli was born.</think><search>Bakoli</search><result>…</result>
    <think>Bakoli was born in Tarun.</think><answer>The answer is \\boxed{Tarun}</answer>

Both decisions are the same for every question (search), so what RL learns on the training
problems carries over to held-out ones; the second is taken mid-response, after a tool
observation, where SearchFork's only decision is the first action. The world, its search tool
and the train/test split by start entity are ``twohop``'s.
"""
from __future__ import annotations

import random

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks.forks import chain_decisions, chain_losers
from cbpo.tasks.search_fork import CLAIM, wrong_claim
from cbpo.tasks.twohop import CHAINS, Chain, World, mentions, page_of, fact_sentence, search_tool, split_questions, world

# Per decision, first action tag -> (kind, wins). Python cannot find a fact.
KINDS = (
    {"search": ("look_up", True), "answer": ("trust_claim", False), "python": ("wrong_tool", False)},
    {"search": ("follow_bridge", True), "answer": ("answer_early", False), "python": ("wrong_tool", False)},
)
N_DECISIONS = len(KINDS)  # per response, at most


def decision_spans(text: str, question: str | None = None) -> list[dict]:
    """The first action, and the first action after the first observation (the question does
    not matter here)."""
    return chain_decisions(text, KINDS)


def _row(seed: int, chain: Chain, start: str, claim: str, loses_at: int | None, w: World, tool) -> dict:
    bridge = chain.hop1(w, start)
    answer = chain.hop2(w, bridge)
    think, search, ans = TOOL_TAGS["think"], TOOL_TAGS["search"], TOOL_TAGS["answer"]
    text = f"{think[0]}{chain.plan.format(start=start)}{think[1]}"
    for n, (entity, found_name) in enumerate(((start, bridge), (bridge, answer))):
        if loses_at == n:
            text += f"{ans[0]}The answer is \\boxed{{{claim if n == 0 else bridge}}}{ans[1]}"
            break
        found = tool(entity)
        # The trace must follow from the observation the environment returns.
        if not (page_of(found, entity) and mentions(found, found_name)):
            raise RuntimeError(f"bm25 top-{tool.k} misses {entity!r}'s page for {chain.name} from {start!r}")
        text += (f"{search[0]}{entity}{search[1]}{format_observation(found)}"
                 f"{think[0]}{fact_sentence(found, entity, found_name)}{think[1]}")
    else:
        text += f"{ans[0]}The answer is \\boxed{{{answer}}}{ans[1]}"
    return {"id": f"search_chain-{seed}-{chain.name}-{start}",
            "question": chain.question.format(start=start) + CLAIM.format(claim=claim),
            "answer": answer, "domain": "search", "trace": text, "decisions": decision_spans(text)}


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5, k: int = 3) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` over ``twohop.world(seed)`` with no start entity in
    both splits (``twohop.split_questions``); traces observe bm25 top-``k``; at each decision a
    share ``p_lose`` of the traces that reach it takes the losing choice (``forks.chain_losers``).
    Claims and losing draws have their own streams, test split first, so the test rows do not
    change with ``n_train`` and ``p_lose`` changes only which traces lose."""
    w, tool = world(seed), search_tool(seed, k)
    claim_rng, lose_rng = random.Random(f"search_chain-claim-{seed}"), random.Random(f"search_chain-lose-{seed}")
    pairs = split_questions(seed, n_train, n_test, CHAINS)
    splits = {}
    for split in ("test", "train"):
        losers = chain_losers(lose_rng, len(pairs[split]), p_lose, len(KINDS))
        splits[split] = [_row(seed, chain, start, wrong_claim(claim_rng, lambda e: chain.hop2(w, chain.hop1(w, e)),
                                                                     chain.starts(w), start), loses_at, w, tool)
                         for (chain, start), loses_at in zip(pairs[split], losers)]
    return {"train": splits["train"], "test": splits["test"]}
