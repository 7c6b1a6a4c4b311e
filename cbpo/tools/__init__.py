"""The agent's tools: a sandboxed Python interpreter and search (Sec. 5.1: both available to
every task). ``build_tools`` makes the name -> callable map the agent loop takes."""
from __future__ import annotations

import threading
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from cbpo.data import shared_data_dir
from cbpo.tools.search_cache import SearchCache

# CountedSearch.stats's keys: the search counts of evaluation summaries and training metrics lines
SEARCH_STATS = ("search_calls", "search_cache_hits", "search_cache_misses")
ARPO_SEED = Path("search") / "arpo_search_cache.json"  # under the data root


class CountedSearch:
    """A search tool that counts its calls and reports them with its cache's hits and misses
    (this process's), for evaluation summaries and training logs."""

    def __init__(self, tool: Callable[[str], str], cache: SearchCache | None):
        self.tool, self.cache, self.calls = tool, cache, 0
        # verl's agent-loop worker calls one tool from several rollout groups' threads at once
        self._lock = threading.Lock()
        self._reported = self.stats()

    def __call__(self, query: str) -> str:
        with self._lock:
            self.calls += 1
        return self.tool(query)

    def stats(self) -> dict[str, int | None]:
        cache = self.cache
        return dict(zip(SEARCH_STATS, (self.calls, None if cache is None else cache.hits,
                                       None if cache is None else cache.misses)))

    def since_last(self) -> dict[str, int | None]:
        """``stats()`` counted from the previous call (a training step's own searches)."""
        with self._lock:
            now, before = self.stats(), self._reported
            self._reported = now
        return {k: None if v is None else v - before[k] for k, v in now.items()}


def step_search_stats(tools: Mapping[str, Callable[[str], str]]) -> dict[str, int | None]:
    """A training step's search counts (``CountedSearch.since_last``); none without search."""
    search = tools.get("search")
    return search.since_last() if isinstance(search, CountedSearch) else {}


@dataclass
class ToolsConfig:
    """The ``tools_cfg`` section: what :func:`build_tools` reads."""

    python_timeout: float  # sandbox wall seconds per call
    search_k: int  # snippets per search
    search_backend: str | None = None  # None: bm25 over the task's own corpus (build_tools' corpus)
    search_options: dict[str, Any] = field(default_factory=dict)
    search_cache: str | None = None  # SQLite file every job searching this backend shares; None: no cache
    search_cache_seed: str | None = None  # ARPO cache JSON imported into it; None: the data root's, if any

    def __post_init__(self) -> None:
        if not self.python_timeout > 0:
            raise ValueError(f"python_timeout must be > 0, got {self.python_timeout}")
        if self.search_k < 1:
            raise ValueError(f"search_k must be >= 1, got {self.search_k}")


def open_search_cache(tools_cfg: ToolsConfig, data_root: str | Path | None = None) -> SearchCache | None:
    """The SQLite cache the configured search backend shares with every other job
    (``search_cache``), seeded from ARPO's cache of real web results (``search_cache_seed``,
    else ``<data root>/search/arpo_search_cache.json`` when present; known queries are kept).
    None for the built-in corpus or ``search_cache: null``."""
    if tools_cfg.search_backend is None or not tools_cfg.search_cache:
        return None
    seed = tools_cfg.search_cache_seed
    if seed is not None and not Path(seed).is_file():
        raise FileNotFoundError(f"search_cache_seed {seed} does not exist")
    seed = Path(seed) if seed is not None else shared_data_dir(data_root) / ARPO_SEED
    cache = SearchCache(tools_cfg.search_cache)
    if seed.is_file():
        # Every job imports: first writer wins per query, so racing jobs store the same rows.
        cache.import_arpo(seed)
    return cache


def build_tools(names: Sequence[str], tools_cfg: ToolsConfig, corpus: Sequence[Mapping[str, str]] | None = None,
                cache: SearchCache | None = None, data_root: str | Path | None = None) -> dict[str, Callable[[str], str]]:
    """``python``: the sandbox with ``python_timeout`` seconds of wall time (raises
    ``SandboxRefused`` here if it would run the code as root). ``search``: bm25 (top
    ``search_k``) over ``corpus``, the task's own passages (``cbpo.tasks.environment_tools``
    gives the built-in tasks'), unless ``search_backend`` names another backend with its options
    in ``search_options``; that backend searches through
    ``cache``, else the shared cache of ``open_search_cache``. An unusable backend (no API key,
    an unreachable retrieval server) fails here, never inside a rollout. The search tool is a
    ``CountedSearch``."""
    tools: dict[str, Callable[[str], str]] = {}
    for name in names:
        if name == "python":
            from cbpo.tools.sandbox import SandboxLimits, resolve_containment, run_python

            resolve_containment()  # a refusal fails the run now, not every tool call as an observation
            limits = SandboxLimits(wall_seconds=float(tools_cfg.python_timeout))
            tools["python"] = lambda code, _limits=limits: run_python(code, _limits).output
        elif name == "search":
            from cbpo.tools.search import SearchTool

            k, backend = tools_cfg.search_k, tools_cfg.search_backend
            if backend is None:
                if corpus is None:
                    raise ValueError("search without a search_backend searches a task's corpus, and none was given")
                tools["search"] = CountedSearch(SearchTool("bm25", k=k, corpus=corpus), None)
            else:
                cache = cache if cache is not None else open_search_cache(tools_cfg, data_root)
                tool = SearchTool(backend, k=k, cache=cache, **dict(tools_cfg.search_options or {}))
                if backend == "http":
                    _probe(tool)
                tools["search"] = CountedSearch(tool, cache)
        else:
            raise KeyError(f"unknown tool {name!r}; known tools: python, search")
    return tools


def _probe(tool) -> None:
    # One uncached query: a retrieval server that is down stops the run at start instead of
    # turning every search of every rollout into "Search error".
    try:
        tool.backend.search("reachability check", 1)
    except Exception as error:
        raise RuntimeError(f"search backend {tool.backend.cache_id} is not reachable: {error}") from None
