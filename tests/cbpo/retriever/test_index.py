import json

import numpy as np
import pytest

from cbpo.retriever.index import Index, build_index, rank, read_meta
from cbpo.retriever.corpus import corpus_digest, load_corpus
from cbpo.tools.search import SearchTool


def test_rank_breaks_ties_in_corpus_order_and_drops_scores_at_the_floor():
    scores = np.array([1.0, 3.0, 1.0, 3.0, 0.0])
    assert rank(scores, 3) == [1, 3, 0]
    assert rank(scores, 10, min_score=0.0) == [1, 3, 0, 2]
    assert rank(scores, 0) == []


def test_the_meta_names_the_corpus_by_content(bm25_index, corpus_file):
    meta = read_meta(bm25_index)
    assert meta["kind"] == "bm25" and meta["size"] == 300
    assert meta["corpus_sha"] == corpus_digest(load_corpus(corpus_file))
    assert not bm25_index.with_name("bm25.partial").exists()


def test_a_folder_without_meta_says_how_to_build_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m cbpo.retriever index"):
        read_meta(tmp_path)


def test_the_saved_index_ranks_as_the_in_process_bm25_backend(bm25_index, corpus_file):
    index, tool = Index(bm25_index), SearchTool("bm25", k=10, corpus=corpus_file)
    for query in ("w001 w017", "w200 w300 w399", "Title 12", "the of"):
        (served,) = index.search([query], 10)
        assert served == tool.search(query)
    assert index.search(["", "the"], 5) == [[], []]


def test_dense_index_finds_the_passage_it_was_given(tmp_path):
    rows = [{"id": str(i), "title": t, "text": x} for i, (t, x) in enumerate(
        [("Paris", "Paris is the capital of France."), ("Python", "Python is a programming language."),
         ("Nile", "The Nile is a river in Africa.")])]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    for faiss_kind in ("flat", "hnsw"):
        meta = build_index(corpus, tmp_path / faiss_kind, "dense", faiss_kind=faiss_kind)
        assert meta["faiss"] == faiss_kind and meta["model"]
        (hits,) = Index(tmp_path / faiss_kind).search(["which river flows through Africa"], 2)
        assert [h["id"] for h in hits][0] == "2" and hits[0]["score"] > hits[1]["score"]
    # a model given by path is recorded, and the index embeds its queries with it
    from cbpo.retriever.encoder import default_dense_model

    meta = build_index(corpus, tmp_path / "named", "dense", model_path=default_dense_model())
    assert meta["model_path"] == str(default_dense_model().resolve())
    assert Index(tmp_path / "named").ranker.encoder.model_dir == default_dense_model().resolve()


def test_a_bad_corpus_leaves_no_folder_and_the_command_names_its_line(tmp_path):
    import subprocess
    import sys

    corpus = tmp_path / "dup.jsonl"
    corpus.write_text('{"id": 1, "title": "a", "text": "b"}\n' * 2)
    done = subprocess.run([sys.executable, "-m", "cbpo.retriever", "index", str(corpus), str(tmp_path / "index")],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "dup.jsonl:2: duplicate passage id '1'" in done.stderr
    assert "Traceback" not in done.stderr and sorted(p.name for p in tmp_path.iterdir()) == ["dup.jsonl"]
