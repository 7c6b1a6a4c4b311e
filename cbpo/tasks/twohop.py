"""Built-in search task: two-hop questions over a seeded, fictional mini-encyclopedia.

The world (``corpus(seed)``) has people, cities, countries and companies with invented,
syllable-made names, linked by ``born_in``, ``works_for``, ``located_in``, ``mayor_of``,
``capital_of``, ``based_in`` and ``founded_by``. Each entity has one passage of two short,
templated sentences that names it twice, e.g. ``Bakoli was born in Tarun. Bakoli works for
Zemco.`` Each question follows a chain of two relations (five templates), so it takes two
searches: the first for the entity named in the question, the second for the bridge entity
found in the first result. The SFT trace is the Tool-Star format::

    <think>…</think><search>Bakoli</search><result>\\nPage 1: …\\n</result>
    <think>…</think><search>Tarun</search><result>\\nPage 1: …\\n</result>
    <answer>The answer is \\boxed{Xan}</answer>

Each ``<result>`` is exactly what ``search_tool(seed, k)`` (bm25, top ``k``) returns for the
query, wrapped by ``cbpo.chat.format_observation`` as at RL time. Queries are bare entity
names: an entity's own passage names it twice, every other passage at most once, so BM25 ranks
it first (checked for every question). Train and test questions start from disjoint entities.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Callable, NamedTuple, Sequence

from bm25s.stopwords import STOPWORDS_EN

from cbpo.chat import TOOL_TAGS, format_observation
from cbpo.tools.search import SearchTool
from cbpo.tools.search_cache import SearchCache

N_PEOPLE, N_COUNTRIES, CITIES_PER_COUNTRY, N_COMPANIES = 2000, 24, 4, 300
CONSONANTS, VOWELS = "bdfgklmnprstvz", "aeiou"
# Words of the templates, and the stopwords the bm25 backend drops: a name must be neither.
RESERVED_WORDS = frozenset(
    "was born in works for is city the mayor of country capital company based founded by "
    "which where who what".split()
) | frozenset(STOPWORDS_EN)


@dataclass
class World:
    people: list[str]
    cities: list[str]
    countries: list[str]
    companies: list[str]
    born_in: dict[str, str] = field(default_factory=dict)  # person -> city
    works_for: dict[str, str] = field(default_factory=dict)  # person -> company
    located_in: dict[str, str] = field(default_factory=dict)  # city -> country
    mayor: dict[str, str] = field(default_factory=dict)  # city -> person
    capital: dict[str, str] = field(default_factory=dict)  # country -> city
    based_in: dict[str, str] = field(default_factory=dict)  # company -> city
    founder: dict[str, str] = field(default_factory=dict)  # company -> person


def _names(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct capitalised names of 2-3 consonant-vowel syllables."""
    names: set[str] = set()
    ordered = []
    while len(ordered) < count:
        name = "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.choice((2, 2, 3))))
        if name not in names and name not in RESERVED_WORDS:
            names.add(name)
            ordered.append(name.capitalize())
    return ordered


@lru_cache(maxsize=4)
def world(seed: int) -> World:
    """The entities and relations for ``seed`` (deterministic; treat as read-only)."""
    rng = random.Random(f"twohop-world-{seed}")
    n_cities = N_COUNTRIES * CITIES_PER_COUNTRY
    names = _names(rng, N_PEOPLE + n_cities + N_COUNTRIES + N_COMPANIES)
    people, cities = names[:N_PEOPLE], names[N_PEOPLE : N_PEOPLE + n_cities]
    countries = names[N_PEOPLE + n_cities : N_PEOPLE + n_cities + N_COUNTRIES]
    companies = names[N_PEOPLE + n_cities + N_COUNTRIES :]
    w = World(people, cities, countries, companies)
    for i, country in enumerate(countries):
        own = cities[i * CITIES_PER_COUNTRY : (i + 1) * CITIES_PER_COUNTRY]
        w.located_in.update(dict.fromkeys(own, country))
        w.capital[country] = rng.choice(own)
    for city in cities:
        w.mayor[city] = rng.choice(people)
    for company in companies:
        w.based_in[company] = rng.choice(cities)
        w.founder[company] = rng.choice(people)
    for person in people:
        w.born_in[person] = rng.choice(cities)
        w.works_for[person] = rng.choice(companies)
    return w


def corpus(seed: int) -> list[dict]:
    """One ``{"id", "title", "text"}`` passage per entity of ``world(seed)``."""
    w = world(seed)
    texts = {
        **{p: f"{p} was born in {w.born_in[p]}. {p} works for {w.works_for[p]}." for p in w.people},
        **{c: f"{c} is a city in {w.located_in[c]}. The mayor of {c} is {w.mayor[c]}." for c in w.cities},
        **{x: f"{x} is a country. The capital of {x} is {w.capital[x]}." for x in w.countries},
        **{c: f"{c} is a company based in {w.based_in[c]}. {c} was founded by {w.founder[c]}."
           for c in w.companies},
    }
    return [{"id": f"twohop-{seed}-{i:05d}", "title": name, "text": text}
            for i, (name, text) in enumerate(texts.items())]


def search_tool(seed: int, k: int = 3, cache: SearchCache | None = None) -> SearchTool:
    """The environment's search tool for this task: bm25 over ``corpus(seed)``, top ``k``."""
    return SearchTool("bm25", k=k, cache=cache, corpus=corpus(seed))


class Chain(NamedTuple):
    """A two-hop question template: start entity -> bridge -> answer."""

    name: str
    starts: Callable[[World], list[str]]
    hop1: Callable[[World, str], str]
    hop2: Callable[[World, str], str]
    question: str  # format fields: start
    plan: str  # first thought; fields: start
    bridge_note: str  # second thought; fields: start, bridge


CHAINS: tuple[Chain, ...] = (
    Chain("birth_country", lambda w: w.people, lambda w, p: w.born_in[p], lambda w, c: w.located_in[c],
          "In which country is the city where {start} was born?",
          "I need the city where {start} was born.",
          "{start} was born in {bridge}. Now I need the country of {bridge}."),
    Chain("employer_city", lambda w: w.people, lambda w, p: w.works_for[p], lambda w, c: w.based_in[c],
          "In which city is the company that {start} works for based?",
          "I need the company that {start} works for.",
          "{start} works for {bridge}. Now I need the city of {bridge}."),
    Chain("birth_mayor", lambda w: w.people, lambda w, p: w.born_in[p], lambda w, c: w.mayor[c],
          "Who is the mayor of the city where {start} was born?",
          "I need the city where {start} was born.",
          "{start} was born in {bridge}. Now I need the mayor of {bridge}."),
    Chain("founder_birth", lambda w: w.companies, lambda w, c: w.founder[c], lambda w, p: w.born_in[p],
          "In which city was the founder of {start} born?",
          "I need the founder of {start}.",
          "{start} was founded by {bridge}. Now I need the city where {bridge} was born."),
    Chain("capital_mayor", lambda w: w.countries, lambda w, x: w.capital[x], lambda w, c: w.mayor[c],
          "Who is the mayor of the capital of {start}?",
          "I need the capital of {start}.",
          "The capital of {start} is {bridge}. Now I need the mayor of {bridge}."),
)


def page_of(observation: str, entity: str) -> bool:
    """Whether the observation contains ``entity``'s own passage (it opens with the name)."""
    return any(line.split(": ", 1)[-1].startswith(f"{entity} ") for line in observation.splitlines())


def mentions(observation: str, entity: str) -> bool:
    return re.search(rf"\b{entity}\b", observation) is not None


def fact_sentence(observation: str, entity: str, answer: str) -> str:
    """The sentence of ``entity``'s page in ``observation`` that states ``answer``, to restate
    before the next step: a name then follows the same words as on the page, which a small
    model copies far more reliably than a name recalled across the observation."""
    page = next(line.split(": ", 1)[-1] for line in observation.splitlines() if page_of(line, entity))
    return next(s.strip() + "." for s in page.split(".") if mentions(s, entity) and mentions(s, answer))


def _row(seed: int, chain: Chain, start: str, w: World, tool: SearchTool) -> dict:
    bridge = chain.hop1(w, start)
    answer = chain.hop2(w, bridge)
    first, second = tool(start), tool(bridge)
    # Every question must be answerable from the observations the environment will return.
    if not (page_of(first, start) and page_of(second, bridge)
            and mentions(first, bridge) and mentions(second, answer)):
        raise RuntimeError(f"two-hop world {seed}: bm25 top-{tool.k} misses a passage for "
                           f"{chain.name} from {start!r} via {bridge!r}")
    think, search, ans = TOOL_TAGS["think"], TOOL_TAGS["search"], TOOL_TAGS["answer"]
    trace = (
        f"{think[0]}{chain.plan.format(start=start)}{think[1]}"
        f"{search[0]}{start}{search[1]}{format_observation(first)}"
        f"{think[0]}{chain.bridge_note.format(start=start, bridge=bridge)}{think[1]}"
        f"{search[0]}{bridge}{search[1]}{format_observation(second)}"
        f"{ans[0]}The answer is \\boxed{{{answer}}}{ans[1]}"
    )
    return {"id": f"twohop-{seed}-{chain.name}-{start}", "question": chain.question.format(start=start),
            "answer": answer, "domain": "search", "trace": trace}


def split_questions(seed: int, n_train: int, n_test: int, chains: Sequence = CHAINS) -> dict[str, list[tuple]]:
    """``{"train": pairs, "test": pairs}`` of (chain, start entity) over ``world(seed)``; a
    chain is any question template with ``starts(world)``.

    Start entities are shuffled and assigned to the test split until it holds ``n_test``
    questions, the rest to train, so no start entity is shared between the splits and the
    test split does not depend on ``n_train``.
    """
    if n_train < 0 or n_test < 0:
        raise ValueError(f"split sizes must be >= 0, got n_train={n_train}, n_test={n_test}")
    w = world(seed)
    rng = random.Random(f"twohop-split-{seed}")
    by_start: dict[str, list[Chain]] = {}
    for chain in chains:
        for start in chain.starts(w):
            by_start.setdefault(start, []).append(chain)
    starts = list(by_start)
    rng.shuffle(starts)
    test, train = [], []
    for start in starts:
        (test if len(test) < n_test else train).extend((chain, start) for chain in by_start[start])
    available = len(train)
    if len(test) < n_test or available < n_train:
        raise ValueError(f"two-hop world {seed} has {len(test) + available} questions; asked for "
                         f"n_train={n_train} + n_test={n_test} with disjoint start entities")
    test = test[:n_test]  # surplus questions of the last test entity are dropped, not moved
    rng.shuffle(test)
    return {"train": rng.sample(train, n_train), "test": test}


def generate(seed: int, n_train: int, n_test: int, k: int = 3) -> dict[str, list[dict]]:
    """``{"train": rows, "test": rows}`` over ``corpus(seed)`` (``split_questions``); traces
    observe bm25 top-``k``."""
    w, tool = world(seed), search_tool(seed, k)
    return {split: [_row(seed, chain, start, w, tool) for chain, start in pairs]
            for split, pairs in split_questions(seed, n_train, n_test).items()}
