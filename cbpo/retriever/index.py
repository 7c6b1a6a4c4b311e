"""Retrieval indexes: built once from a corpus into a folder, opened memory-mapped.

- ``bm25``: bm25s (Lucene BM25, English stopwords removed); its sparse matrix is saved as
  ``.npy`` files and loaded with ``mmap``.
- ``dense``: all-MiniLM-L6-v2 embeddings (``encoder``) in FAISS: an exact inner-product index
  (``flat``) or, for large corpora, an approximate HNSW graph (``hnsw``: about 1.1x the flat
  index's bytes, sub-linear search); ``auto`` takes flat up to ``HNSW_FROM`` passages.

A folder holds ``meta.json`` (kind, name, size, the corpus's content hash, build settings and
time), the passage store (``corpus.PassageStore``) and the index's own files. Ranking is the same
as the in-process search backends': best score first, ties in corpus order, and for bm25 only
passages sharing a term with the query (score > 0).
"""
from __future__ import annotations

import itertools
import json
import os
import shutil
import time
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import numpy as np

from cbpo.retriever.corpus import CorpusDigest, PassageStore, PassageWriter, iter_passages

KINDS = ("bm25", "dense")
META = "meta.json"
STUDY_INDEX = "data/retriever/{corpus}-{kind}"  # where the DAG builds a study's index (workflow/rules/retriever.smk)
HNSW_FROM = 1_000_000  # auto: an exact index below this many passages, HNSW from here
HNSW_M, HNSW_EF_SEARCH = 32, 128  # graph degree; search breadth (recall vs speed)
_CHUNK = 4096  # passages tokenized or embedded at a time while building


def rank(scores: np.ndarray, k: int, min_score: float = -np.inf) -> list[int]:
    """Indices of the ``k`` best scores above ``min_score``; ties keep corpus order, so an
    observation is reproducible (SFT traces are built from it)."""
    if k <= 0 or scores.size == 0:
        return []
    threshold = np.partition(scores, -min(k, scores.size))[-min(k, scores.size)]
    candidates = np.flatnonzero((scores >= threshold) & (scores > min_score))
    order = candidates[np.lexsort((candidates, -scores[candidates]))]
    return order[:k].tolist()


def _chunks(texts: Iterable[str]) -> Iterator[list[str]]:
    iterator = iter(texts)
    while chunk := list(itertools.islice(iterator, _CHUNK)):
        yield chunk


def passage_text(passage: dict) -> str:
    """What an index reads of a passage: its title, then its text."""
    return f"{passage['title']}\n{passage['text']}"


class BM25Ranker:
    """bm25s scores, ranked by :func:`rank`."""

    def __init__(self, model, stopwords: str | None = "en"):
        import bm25s

        self._bm25s, self.model, self.stopwords = bm25s, model, stopwords

    @classmethod
    def build(cls, texts: Iterable[str], stopwords: str | None = "en") -> "BM25Ranker":
        import bm25s

        tokens: list[list[str]] = []
        for chunk in _chunks(texts):
            tokens += bm25s.tokenize(chunk, stopwords=stopwords, return_ids=False, show_progress=False)
        model = bm25s.BM25()
        model.index(tokens, show_progress=False)
        return cls(model, stopwords)

    @classmethod
    def load(cls, folder: Path, stopwords: str | None) -> "BM25Ranker":
        import bm25s

        return cls(bm25s.BM25.load(folder, mmap=True, show_progress=False), stopwords)

    def save(self, folder: Path) -> None:
        self.model.save(folder, show_progress=False)

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        tokens = self._bm25s.tokenize(queries, stopwords=self.stopwords, return_ids=False, show_progress=False)
        hits = []
        for query in tokens:
            if not query:  # only stopwords or punctuation: nothing can match
                hits.append([])
                continue
            scores = self.model.get_scores(query)
            hits.append([(i, float(scores[i])) for i in rank(scores, k, min_score=0.0)])
        return hits


class DenseRanker:
    """Inner products of normalised embeddings in a FAISS index (cosine similarity)."""

    FILE = "faiss.index"

    def __init__(self, index, encoder):
        self.index, self.encoder = index, encoder

    @classmethod
    def build(cls, texts: Iterable[str], size: int, encoder, faiss_kind: str = "auto") -> "DenseRanker":
        import faiss

        kind = ("hnsw" if size >= HNSW_FROM else "flat") if faiss_kind == "auto" else faiss_kind
        dim = encoder.model.config.hidden_size
        if kind == "flat":
            index = faiss.IndexFlatIP(dim)
        elif kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        else:
            raise ValueError(f"faiss index kind must be auto, flat or hnsw, got {faiss_kind!r}")
        for chunk in _chunks(texts):
            index.add(encoder.embed(chunk))
        return cls(index, encoder)

    @classmethod
    def load(cls, folder: Path, encoder) -> "DenseRanker":
        import faiss

        index = faiss.read_index(str(folder / cls.FILE), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        if hasattr(index, "hnsw"):
            index.hnsw.efSearch = HNSW_EF_SEARCH
        return cls(index, encoder)

    @property
    def faiss_kind(self) -> str:
        return "hnsw" if hasattr(self.index, "hnsw") else "flat"

    def save(self, folder: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(folder / self.FILE))

    def search(self, queries: list[str], k: int) -> list[list[tuple[int, float]]]:
        if not queries:
            return []
        scores, ids = self.index.search(self.encoder.embed(queries), min(k, self.index.ntotal))
        return [[(int(i), float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]


def build_index(corpus: str | Path, folder: str | Path, kind: str = "bm25", name: str | None = None,
                faiss_kind: str = "auto", model_path: str | Path | None = None,
                stopwords: str | None = "en") -> dict:
    """Index ``corpus`` (JSONL) into ``folder``, written whole or not at all (a sibling
    ``.partial`` folder renamed at the end); returns its meta."""
    if kind not in KINDS:
        raise ValueError(f"index kind must be one of {', '.join(KINDS)}, got {kind!r}")
    folder = Path(folder)
    partial = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        meta = _build(corpus, partial, kind, name, faiss_kind, model_path, stopwords)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
    return meta


def _build(corpus: str | Path, partial: Path, kind: str, name: str | None, faiss_kind: str,
           model_path: str | Path | None, stopwords: str | None) -> dict:
    started = time.perf_counter()
    writer, digest = PassageWriter(partial), CorpusDigest()
    for passage in iter_passages(corpus):
        writer.add(passage)
        digest.add(passage)
    writer.close()
    if digest.size == 0:
        raise ValueError(f"search corpus {corpus} is empty")
    store = PassageStore(partial)
    texts = (passage_text(store[i]) for i in range(len(store)))
    meta = {"name": name or Path(corpus).stem, "kind": kind, "size": digest.size,
            "corpus_sha": digest.hexdigest(), "corpus": str(Path(corpus).resolve())}
    if kind == "bm25":
        BM25Ranker.build(texts, stopwords).save(partial)
        meta["stopwords"] = stopwords
    else:
        from cbpo.retriever.encoder import MiniLMEncoder

        encoder = MiniLMEncoder(model_path)
        ranker = DenseRanker.build(texts, digest.size, encoder, faiss_kind)
        ranker.save(partial)
        # a model given by path is the one queries must be embedded with too (None: the shipped one)
        meta.update(model=encoder.name, model_path=str(Path(model_path).resolve()) if model_path else None,
                    faiss=ranker.faiss_kind)
    store.close()
    meta["build_seconds"] = round(time.perf_counter() - started, 2)
    meta["bytes"] = sum(f.stat().st_size for f in partial.iterdir())
    (partial / META).write_text(json.dumps(meta, indent=1) + "\n")
    return meta


def study_index(workflow: Mapping) -> str | None:
    """The index folder a study's jobs lease their server on, from the workflow config: with
    ``search_backend: http`` and no ``search_url``, ``retriever``'s corpus and kind; else None."""
    if workflow.get("search_backend") != "http" or workflow.get("search_url"):
        return None
    return STUDY_INDEX.format(**workflow["retriever"])


def read_meta(folder: str | Path) -> dict:
    """An index folder's ``meta.json``; a folder without one is no index (the error says how to
    build it)."""
    path = Path(folder) / META
    if not path.is_file():
        raise FileNotFoundError(f"{folder} is not a retrieval index (no {META}): "
                                f"python -m cbpo.retriever index CORPUS.jsonl {folder}")
    return json.loads(path.read_text())


class Index:
    """An index folder opened for search: ``search(queries, k)`` -> per query, the top-``k``
    passages as ``{"id", "title", "text", "score"}``, best first."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.meta = read_meta(self.folder)
        self.store = PassageStore(self.folder)
        if self.meta["kind"] == "bm25":
            self.ranker = BM25Ranker.load(self.folder, self.meta.get("stopwords", "en"))
        else:
            from cbpo.retriever.encoder import MiniLMEncoder

            self.ranker = DenseRanker.load(self.folder, MiniLMEncoder(self.meta.get("model_path")))

    def __len__(self) -> int:
        return len(self.store)

    def search(self, queries: list[str], k: int) -> list[list[dict]]:
        return [[{**self.store[i], "score": score} for i, score in hits]
                for hits in self.ranker.search(queries, k)]
