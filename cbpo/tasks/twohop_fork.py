"""Fork task, search domain: the two-hop questions of ``cbpo.tasks.twohop`` about a person,
asked by another person, whose decision is which name the first search looks up::

    Asked by Kovi: In which country is the city where Bakoli was born?

The good query is the question's subject (``Bakoli``); the misleading one is the asker
(``Kovi``), whose page leads the second hop to the asker's city and a wrong answer (askers
are drawn so that their chain ends elsewhere). Both traces have the same form, without a
first plan, so the choice is made at the query itself::

    <search>Bakoli</search><result>…</result><think>Bakoli was born in Tarun. Now I need the
    country of Tarun.</think><search>Tarun</search><result>…</result>
    <answer>The answer is \\boxed{Xan}</answer>

The rule (look up the person the question is about, not the asker) reads from the question
alone and holds for held-out subjects. Observations are what the environment's search tool
(``twohop.search_tool``, the world of the same seed) returns, checked for every trace.
"""
from __future__ import annotations

import random
import re

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks.forks import decision, first_action, losing_rows
from cbpo.tasks.twohop import CHAINS, Chain, World, _mentions, _page_of, search_tool, world
from cbpo.tools.search import SearchTool

# The chains that start from a person, so that the asker (a person) can be looked up instead.
FORK_CHAINS = tuple(c for c in CHAINS if c.name in ("birth_country", "employer_city", "birth_mayor"))
# The asker's name follows a space, as the subject's does: both tokenise alike, so neither is
# the easier one to copy into the query.
ASKS = "Asked by {asker}: "
_ASKER = re.compile(re.escape(ASKS).replace(r"\{asker\}", r"(?P<asker>\w+)"))
_SUBJECT = [re.compile(re.escape(c.question).replace(r"\{start\}", r"(?P<subject>\w+)") + r"\Z") for c in FORK_CHAINS]
_QUERY = re.compile(r"[^<]*")  # a query runs to its closing tag, or to the end of a cut response


def question_names(question: str) -> tuple[str, str]:
    """``(subject, asker)`` of a fork question."""
    asked = _ASKER.match(question)
    subject = next((m for p in _SUBJECT if (m := p.search(question))), None)
    if asked is None or subject is None:
        raise ValueError(f"not a twohop_fork question: {question!r}")
    return subject["subject"], asked["asker"]


def decision_spans(text: str, question: str) -> list[dict]:
    """The response's first action: the query of a first search (``good_query`` for the
    subject, ``misleading_query`` for the asker, ``other_query`` for anything else), else the
    opening tag of a direct answer or a Python call."""
    match = first_action(text)
    if match is None:
        return []
    if match.lastgroup != "search":
        kind = "answer_directly" if match.lastgroup == "answer" else "wrong_tool"
        return [decision(match.start(), match.end(), kind, False)]
    subject, asker = question_names(question)
    query = _QUERY.match(text, match.end())
    kind = {subject: "good_query", asker: "misleading_query"}.get(query[0].strip(), "other_query")
    return [decision(query.start(), query.end(), kind, kind == "good_query")]


def _answer(chain: Chain, w: World, person: str) -> str:
    return chain.hop2(w, chain.hop1(w, person))


def _trace(chain: Chain, w: World, tool: SearchTool, name: str) -> str:
    """The two searches from ``name`` (subject or asker) to its chain's answer."""
    bridge = chain.hop1(w, name)
    answer = chain.hop2(w, bridge)
    first, second = tool(name), tool(bridge)
    # The trace must follow from the observations the environment returns.
    if not (_page_of(first, name) and _page_of(second, bridge) and _mentions(first, bridge) and _mentions(second, answer)):
        raise RuntimeError(f"bm25 top-{tool.k} misses a passage for {chain.name} from {name!r} via {bridge!r}")
    think, search, ans = TOOL_TAGS["think"], TOOL_TAGS["search"], TOOL_TAGS["answer"]
    return (
        f"{search[0]}{name}{search[1]}{format_observation(first)}"
        f"{think[0]}{chain.bridge_note.format(start=name, bridge=bridge)}{think[1]}"
        f"{search[0]}{bridge}{search[1]}{format_observation(second)}"
        f"{ans[0]}The answer is \\boxed{{{answer}}}{ans[1]}"
    )


def _row(seed: int, chain: Chain, subject: str, asker: str, loses: bool, w: World, tool: SearchTool) -> dict:
    name = asker if loses else subject
    at = len(TOOL_TAGS["search"][0])  # the trace opens with the first search
    return {
        "id": f"twohop_fork-{seed}-{chain.name}-{subject}",
        "question": ASKS.format(asker=asker) + chain.question.format(start=subject),
        "answer": _answer(chain, w, subject),
        "domain": "search",
        "trace": _trace(chain, w, tool, name),
        "decisions": [decision(at, at + len(name), "misleading_query" if loses else "good_query", not loses)],
    }


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5, k: int = 3) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` over ``twohop.world(seed)``, traces observing bm25
    top-``k``; a share ``p_lose`` of each split's traces looks up the asker. Subjects are
    shuffled and assigned to the test split until it holds ``n_test`` questions, the rest to
    train, so no subject is shared between the splits."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_test={n_test}")
    w, tool = world(seed), search_tool(seed, k)
    rng = random.Random(f"twohop_fork-{seed}")
    # Own streams for the askers and the losing draws: the test rows do not change with n_train.
    ask_rng, lose_rng = random.Random(f"twohop_fork-ask-{seed}"), random.Random(f"twohop_fork-lose-{seed}")
    subjects = list(w.people)
    rng.shuffle(subjects)
    n_subjects = -(-n_test // len(FORK_CHAINS))
    test = [(c, s) for s in subjects[:n_subjects] for c in FORK_CHAINS][:n_test]
    train = [(c, s) for s in subjects[n_subjects:] for c in FORK_CHAINS]
    if len(test) < n_test or len(train) < n_train:
        raise ValueError(f"twohop_fork world {seed} has {len(subjects) * len(FORK_CHAINS)} questions; asked for "
                         f"n_train={n_train} + n_test={n_test} with disjoint subjects")
    rng.shuffle(test)
    train = rng.sample(train, n_train)
    splits = {}
    for split, pairs in (("test", test), ("train", train)):
        losers = losing_rows(lose_rng, len(pairs), p_lose)
        rows = splits[split] = []
        for n, (chain, subject) in enumerate(pairs):
            # An asker whose chain ends at the subject's answer would make losing harmless.
            while (asker := ask_rng.choice(w.people)) == subject or _answer(chain, w, asker) == _answer(chain, w, subject):
                pass
            rows.append(_row(seed, chain, subject, asker, n in losers, w, tool))
    return {"train": splits["train"], "test": splits["test"]}
