"""Fork task, search domain: one-hop questions about the world of ``cbpo.tasks.twohop``, each
followed by a claimed answer, whose decision is whether to trust the claim or to look the
answer up::

    In which city was Bakoli born? A forum post says the answer is Xan.

The claim is always wrong: it is the answer of the same question about another entity. A
winning trace searches the entity, restates the sentence of its page that gives the answer,
and answers; a losing trace trusts the post after the same plan::

    <think>I need the city where Bakoli was born.</think><search>Bakoli</search><result>
    Page 1: Bakoli was born in Tarun. …</result><think>Bakoli was born in Tarun.</think>
    <answer>The answer is \\boxed{Tarun}</answer>
    <think>I need the city where Bakoli was born.</think><answer>The answer is \\boxed{Xan}</answer>

The decision is the tag after the plan (``look_up``, which wins, or ``trust_claim``): the
same for every question, so what RL learns on the training problems carries over to held-out
ones. Issue #14 tried two harder versions first, on the tiny preset: a choice between two
names to search (the question's subject or its asker), where 59 of 64 first queries at
GRPO's last step were neither name, and two-hop questions with a claim, where after SFT the
looked-up path almost never reached the answer (the bridge's name was not copied), so
neither choice earned reward and RL had nothing to learn from. One hop keeps the skill within
the tiny model's reach, so that the decision is what decides the outcome.
"""
from __future__ import annotations

import random
from functools import partial
from typing import Callable, NamedTuple

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks.forks import decision, first_action_decision, losing_rows
from cbpo.tasks.twohop import World, mentions, page_of, fact_sentence, search_tool, split_questions, world


class Hop(NamedTuple):
    """A one-hop question: the start entity's page states the answer."""

    name: str
    starts: Callable[[World], list[str]]
    answer: Callable[[World, str], str]
    question: str  # format field: start
    plan: str  # the first thought; format field: start


HOPS: tuple[Hop, ...] = (
    Hop("born_in", lambda w: w.people, lambda w, p: w.born_in[p],
        "In which city was {start} born?", "I need the city where {start} was born."),
    Hop("works_for", lambda w: w.people, lambda w, p: w.works_for[p],
        "Which company does {start} work for?", "I need the company that {start} works for."),
    Hop("located_in", lambda w: w.cities, lambda w, c: w.located_in[c],
        "In which country is the city {start}?", "I need the country of {start}."),
    Hop("mayor", lambda w: w.cities, lambda w, c: w.mayor[c],
        "Who is the mayor of {start}?", "I need the mayor of {start}."),
    Hop("capital", lambda w: w.countries, lambda w, x: w.capital[x],
        "What is the capital of {start}?", "I need the capital of {start}."),
    Hop("based_in", lambda w: w.companies, lambda w, c: w.based_in[c],
        "In which city is the company {start} based?", "I need the city of {start}."),
    Hop("founder", lambda w: w.companies, lambda w, c: w.founder[c],
        "Who founded {start}?", "I need the founder of {start}."),
)
CLAIM = " A forum post says the answer is {claim}."
# First action tag -> (kind, wins). Python cannot find a fact.
KINDS = {"search": ("look_up", True), "answer": ("trust_claim", False), "python": ("wrong_tool", False)}
N_DECISIONS = 1  # per response: its first action


def decision_spans(text: str, question: str | None = None) -> list[dict]:
    """The response's first action (the question does not matter here): its opening tag."""
    return first_action_decision(text, KINDS)


def wrong_claim(rng: random.Random, answer_of: Callable[[str], str], starts: list[str], start: str) -> str:
    """The answer of the same question about another start entity, never ``start``'s answer."""
    truth = answer_of(start)
    while (claim := answer_of(rng.choice(starts))) == truth:
        pass
    return claim


def _row(seed: int, hop: Hop, start: str, claim: str, loses: bool, w: World, tool) -> dict:
    answer = hop.answer(w, start)
    think, search, ans = TOOL_TAGS["think"], TOOL_TAGS["search"], TOOL_TAGS["answer"]
    plan = f"{think[0]}{hop.plan.format(start=start)}{think[1]}"
    if loses:
        trace = f"{plan}{ans[0]}The answer is \\boxed{{{claim}}}{ans[1]}"
    else:
        found = tool(start)
        # The trace must follow from the observation the environment returns.
        if not (page_of(found, start) and mentions(found, answer)):
            raise RuntimeError(f"bm25 top-{tool.k} misses {start!r}'s page for {hop.name}")
        trace = (f"{plan}{search[0]}{start}{search[1]}{format_observation(found)}"
                 f"{think[0]}{fact_sentence(found, start, answer)}{think[1]}"
                 f"{ans[0]}The answer is \\boxed{{{answer}}}{ans[1]}")
    tag = ans[0] if loses else search[0]
    return {"id": f"search_fork-{seed}-{hop.name}-{start}",
            "question": hop.question.format(start=start) + CLAIM.format(claim=claim),
            "answer": answer, "domain": "search", "trace": trace,
            "decisions": [decision(len(plan), len(plan) + len(tag), "trust_claim" if loses else "look_up", not loses)]}


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5, k: int = 3) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` over ``twohop.world(seed)`` with no start entity in
    both splits (``twohop.split_questions``); traces observe bm25 top-``k``, and a share
    ``p_lose`` of each split's traces trusts the claim. Claims and losing draws have their own
    streams, test split first, so the test rows do not change with ``n_train`` and ``p_lose``
    changes only which traces lose."""
    w, tool = world(seed), search_tool(seed, k)
    claim_rng, lose_rng = random.Random(f"search_fork-claim-{seed}"), random.Random(f"search_fork-lose-{seed}")
    pairs = split_questions(seed, n_train, n_test, HOPS)
    splits = {}
    for split in ("test", "train"):
        losers = losing_rows(lose_rng, len(pairs[split]), p_lose)
        splits[split] = [_row(seed, hop, start, wrong_claim(claim_rng, partial(hop.answer, w), hop.starts(w), start), n in losers, w, tool)
                         for n, (hop, start) in enumerate(pairs[split])]
    return {"train": splits["train"], "test": splits["test"]}
