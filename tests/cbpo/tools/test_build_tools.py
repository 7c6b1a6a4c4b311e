"""``build_tools`` wires search to the shared cache the configuration names, seeded from ARPO's
cache, and refuses an unusable backend before any rollout."""
import json
import socket

import pytest

from cbpo.tools import ToolsConfig, build_tools, open_search_cache

ARPO = {"Amy Smart film debut": "Page 1: Amy Smart made her film debut in Campfire Tales (1997)."}


def web_cfg(tmp_path, **extra):
    seed = tmp_path / "arpo.json"
    seed.write_text(json.dumps(ARPO))
    # A key that no server would accept: any query that reaches the network fails.
    return ToolsConfig(**{"python_timeout": 10.0, "search_k": 10, "search_backend": "web",
                          "search_options": {"api_key": "not-a-key", "timeout": 0.5},
                          "search_cache": str(tmp_path / "cache" / "search_web.sqlite"), "search_cache_seed": str(seed), **extra})


def test_search_reads_the_seeded_shared_cache_and_counts_hits(tmp_path):
    search = build_tools(["search"], web_cfg(tmp_path))["search"]
    assert search("amy smart  FILM debut") == ARPO["Amy Smart film debut"]  # normalised query, no network
    assert search.stats() == {"search_calls": 1, "search_cache_hits": 1, "search_cache_misses": 0}


def test_every_job_opens_the_same_file(tmp_path):
    cfg = web_cfg(tmp_path)
    first, second = open_search_cache(cfg), open_search_cache(cfg)
    first.put("who wrote dune", "web", 10, "Page 1: Frank Herbert")
    assert second.get("Who wrote Dune", "web", 10).observation == "Page 1: Frank Herbert"


def test_the_built_in_corpus_has_no_cache(tmp_path):
    assert open_search_cache(ToolsConfig(python_timeout=10.0, search_k=10, search_cache=str(tmp_path / "c.sqlite"))) is None
    assert not (tmp_path / "c.sqlite").exists()


def test_a_missing_seed_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.json"):
        open_search_cache(web_cfg(tmp_path, search_cache_seed=str(tmp_path / "nowhere.json")))


def test_web_search_without_a_key_fails_at_start(tmp_path, monkeypatch):
    monkeypatch.delenv("SERPER_API_KEY", raising=False)
    cfg = web_cfg(tmp_path, search_options={})
    with pytest.raises(ValueError, match="SERPER_API_KEY"):
        build_tools(["search"], cfg)


def test_an_unreachable_retrieval_server_fails_at_start(tmp_path):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = web_cfg(tmp_path, search_backend="http", search_options={"url": f"http://127.0.0.1:{port}/retrieve", "timeout": 1.0})
    with pytest.raises(RuntimeError, match="not reachable"):
        build_tools(["search"], cfg)


def test_a_training_step_reports_its_own_searches(tmp_path):
    from cbpo.tools import step_search_stats

    tools = build_tools(["search"], web_cfg(tmp_path))
    tools["search"]("Amy Smart film debut")
    assert step_search_stats(tools) == {"search_calls": 1, "search_cache_hits": 1, "search_cache_misses": 0}
    tools["search"]("amy smart film debut")
    tools["search"]("Amy Smart film debut")
    assert step_search_stats(tools) == {"search_calls": 2, "search_cache_hits": 2, "search_cache_misses": 0}
    assert step_search_stats({"python": print}) == {}


def test_search_without_a_backend_needs_the_tasks_corpus():
    from cbpo.tasks import environment_tools
    from cbpo.tasks.twohop import corpus

    cfg = ToolsConfig(python_timeout=10.0, search_k=3)
    with pytest.raises(ValueError, match="corpus"):
        build_tools(["search"], cfg)
    tool = environment_tools(["search"], cfg, seed=0)["search"]  # the built-in tasks' world of seed 0
    person = corpus(0)[0]["title"]
    assert person in tool(f"{person} born") and tool.stats()["search_calls"] == 1
