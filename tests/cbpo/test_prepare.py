"""``python -m cbpo.prepare target=corpus``: the retrieval server's small corpus."""
import json

from cbpo.prepare import small_corpus
from cbpo.retriever.corpus import load_corpus
from cbpo.tasks.twohop import corpus as twohop_corpus


def test_the_small_corpus_is_the_two_hop_world_plus_arpos_distinct_pages(tmp_path):
    world = twohop_corpus(0)
    assert list(small_corpus(0, tmp_path)) == world  # no ARPO cache in this data root
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / "arpo_search_cache.json").write_text(json.dumps({
        "q1": "Page 1: Alpha page.\nPage 2: Beta page.", "q2": "Page 1: Beta page.", "q3": "No search results found."}))
    passages = load_corpus(list(small_corpus(0, tmp_path)))  # valid: unique ids, string fields
    assert passages[: len(world)] == world
    assert [p["text"] for p in passages[len(world):]] == ["Alpha page.", "Beta page."]
