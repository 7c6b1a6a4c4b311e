"""Relay task (issue #36): four decisions per response, the last three right after a tool
observation, of three kinds, each a choice among the three action tags; a binary outcome that
needs all four. The suite's positive-control testbed for credit assignment (docs/cpu-testbed.md).

The world of a seed is a row of lockers ``L10`` … ``L199``, each holding a key ``K10`` … ``K99``,
one search passage each (``corpus``: ``Locker L47 holds K82.``). A question names a start locker
and a step::

    Relay from L47 with step 17. What does the last locker hold?

A winning trace opens the start locker, adds the step to its key's number, opens the locker of
that sum, and answers with the number of the key that one holds::

    <search>L47</search><result>
    Page 1: Locker L47 holds K82.
    </result><python>print(82 + 17)</python><result>
    99
    </result><search>L99</search><result>
    Page 1: Locker L99 holds K35.
    </result><answer>The answer is \\boxed{35}</answer>

Its decisions are the first action and the first action after each observation (``KINDS``):
search, then Python, then search, then answer. Each is one of the tags ``<search>``,
``<python>`` and ``<answer>``, so the copying the tiny model is poor at never decides a choice,
and no single rule ("call the tool again") wins them all. Every losing choice ends the chance of
a right answer: answering before the last locker gives a number the relay passed (or its start);
the wrong tool spends one of the three tool calls the relay needs (``rl.agent.max_tool_calls``
is 3), and its observation shows the dead end (Python given ``L47`` raises a NameError; a search
for ``82 + 17`` finds nothing, as only a locker's name and its key are words of the corpus); a
fourth call is refused by the agent loop ("turns"). The SFT traces lose at each decision they
reach with probability ``p_lose``, half the time by each losing choice, and a losing trace
answers with the number it holds (or stops at its refused fourth call). The correct choices follow from nothing in the
question: they are the procedure, which only rewards teach beyond SFT's mix.
"""
from __future__ import annotations

import random
from functools import lru_cache

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tasks.forks import chain_decisions, chain_losers
from cbpo.tools.search import SearchTool

LOCKERS = range(10, 200)  # every start + step sum (20..198) is a locker
HELD = range(10, 100)  # the numbers of the keys the lockers hold, and the steps
QUESTION = "Relay from L{start} with step {step}. What does the last locker hold?"
# Per decision, action tag -> (kind, wins).
KINDS = (
    {"search": ("look_up", True), "python": ("wrong_tool", False), "answer": ("guess", False)},
    {"python": ("compute", True), "search": ("wrong_tool", False), "answer": ("answer_early", False)},
    {"search": ("look_up_again", True), "python": ("wrong_tool", False), "answer": ("answer_early", False)},
    {"answer": ("answer", True), "python": ("extra_call", False), "search": ("extra_call", False)},
)
N_DECISIONS = len(KINDS)  # per response, at most


@lru_cache(maxsize=4)
def lockers(seed: int) -> dict[int, int]:
    """The number of the key each locker holds in the world of ``seed`` (treat as read-only)."""
    rng = random.Random(f"relay-world-{seed}")
    return {key: rng.choice(HELD) for key in LOCKERS}


def corpus(seed: int) -> list[dict]:
    """One passage per locker: the search corpus of data whose tasks include ``relay``
    (``cbpo.tasks.environment_tools``). Only a locker's own passage holds its name's token, and
    no passage holds a bare number."""
    return [{"id": f"relay-{seed}-L{key}", "title": "", "text": f"Locker L{key} holds K{held}."}
            for key, held in lockers(seed).items()]


@lru_cache(maxsize=4)
def search_tool(seed: int, k: int = 3) -> SearchTool:
    """The environment's search over ``corpus(seed)``: bm25, top ``k``, as at RL time."""
    return SearchTool("bm25", k=k, corpus=corpus(seed))


def name_error(name: str) -> str:
    """What the Python sandbox prints for code that is a bare undefined ``name`` (the suite's
    sandbox: ``cbpo.tools.sandbox``; a test runs it on the traces' calls)."""
    return (f'Traceback (most recent call last):\n  File "<code>", line 1, in <module>\n    {name}\n'
            f"NameError: name '{name}' is not defined\n")


def decision_spans(text: str, question: str | None = None) -> list[dict]:
    """The first action and the first action after each observation, up to four (the question
    does not matter here)."""
    return chain_decisions(text, KINDS)


def relay_trace(seed: int, start: int, step: int, loses_at: int | None, losing: str, k: int = 3) -> str:
    """The SFT response; ``loses_at``: the decision (0-3) that takes ``losing`` (an action tag
    ``KINDS[loses_at]`` marks as losing), or ``None`` for the winning trace."""
    tool, world = search_tool(seed, k), lockers(seed)

    def answering(value: int) -> str:
        return f"{TOOL_TAGS['answer'][0]}The answer is \\boxed{{{value}}}{TOOL_TAGS['answer'][1]}"

    first = world[start]
    steps = (  # per decision: the winning action's tag, argument, observation; the value held after it
        ("search", f"L{start}", None, first),
        ("python", f"print({first} + {step})", f"{first + step}\n", first + step),
        ("search", f"L{first + step}", None, world[first + step]),
    )
    text, held = "", start
    for n, (tag, argument, printed, after) in enumerate(steps):
        if loses_at == n and losing == "answer":
            return text + answering(held)
        if loses_at == n:  # the other tool, with its own argument syntax
            if losing == "search":
                argument = argument.removeprefix("print(").removesuffix(")")
                output = tool(argument)
            else:
                output = name_error(argument)
            return text + f"{TOOL_TAGS[losing][0]}{argument}{TOOL_TAGS[losing][1]}{format_observation(output)}" + answering(held)
        output = printed if printed is not None else tool(argument)
        if tag == "search" and output.count("Page ") != 1:  # the trace must follow from what bm25 returns
            raise RuntimeError(f"bm25 top-{k} for {argument!r} is not its locker's passage alone: {output!r}")
        open_, close = TOOL_TAGS[tag]
        text += f"{open_}{argument}{close}{format_observation(output)}"
        held = after
    if loses_at == 3:  # a fourth call, which the agent loop refuses: the response ends there
        open_, close = TOOL_TAGS[losing]
        return text + f"{open_}{f'print({held})' if losing == 'python' else f'L{held}'}{close}"
    return text + answering(held)


def questions(rng: random.Random, n_train: int, n_test: int, world: dict[int, int]) -> dict[str, list[tuple[int, int]]]:
    """Distinct ``(start, step)`` pairs, test first, none in both splits. The answer differs from
    every number a losing trace answers with (start, first held, sum), so every loss is wrong."""
    seen: set[tuple[int, int]] = set()
    splits: dict[str, list[tuple[int, int]]] = {}
    for split, size in (("test", n_test), ("train", n_train)):
        pairs = splits[split] = []
        while len(pairs) < size:
            start, step = rng.choice(HELD), rng.choice(HELD)
            first = world[start]
            final = world[first + step]
            if (start, step) not in seen and final not in (start, first, first + step):
                seen.add((start, step))
                pairs.append((start, step))
    return splits


def generate(seed: int, n_train: int, n_test: int, p_lose: float = 0.5, k: int = 3,
             task: str = "relay") -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}``, deterministic in ``seed``; traces observe bm25 top-``k``
    (the preset's ``tools_cfg.search_k``); at each decision a share ``p_lose`` of the traces that
    reach it takes a losing choice (``forks.chain_losers``), each of its two losing tags for half
    of them. The test split is drawn first, and the losing draws have their own streams, so the
    test questions change with neither ``n_train`` nor ``p_lose``. Row ids start with ``task``
    (``relay_hard`` names its own)."""
    world = lockers(seed)
    pairs = questions(random.Random(f"relay-{seed}"), n_train, n_test, world)
    lose_rng, tag_rng = random.Random(f"relay-lose-{seed}"), random.Random(f"relay-tag-{seed}")
    splits: dict[str, list[dict]] = {}
    for split in ("test", "train"):
        splits[split] = []
        for n, ((start, step), loses_at) in enumerate(zip(pairs[split], chain_losers(lose_rng, len(pairs[split]), p_lose, N_DECISIONS))):
            losing = "" if loses_at is None else tag_rng.choice(sorted(t for t, (_, wins) in KINDS[loses_at].items() if not wins))
            text = relay_trace(seed, start, step, loses_at, losing, k)
            splits[split].append({"id": f"{task}-{split}-{n:06d}", "question": QUESTION.format(start=start, step=step),
                                  "answer": str(world[world[start] + step]), "domain": "math", "trace": text,
                                  "decisions": decision_spans(text)})
    return {"train": splits["train"], "test": splits["test"]}
