"""A corpus whose BM25 scores rarely tie (words drawn from a Zipf law, seeded) and its index."""
import json

import numpy as np
import pytest

from cbpo.retriever.index import build_index

WORDS = [f"w{i:03d}" for i in range(400)]


def zipf_corpus(n: int = 300, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    weights = 1 / np.arange(1, len(WORDS) + 1)
    weights /= weights.sum()
    return [{"id": f"p{i}", "title": f"Title {i}",
             "text": " ".join(rng.choice(WORDS, size=int(rng.integers(8, 40)), p=weights))}
            for i in range(n)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "zipf.jsonl", zipf_corpus())


@pytest.fixture(scope="module")
def bm25_index(corpus_file, tmp_path_factory):
    folder = tmp_path_factory.mktemp("index") / "bm25"
    build_index(corpus_file, folder, "bm25")
    return folder
