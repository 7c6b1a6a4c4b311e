"""Passages: reading a corpus, naming it by content, and a memory-mapped store of it.

A corpus is JSONL, one passage per line: ``{"id", "title", "text"}`` (the suite's format) or
``{"id", "contents"}`` (Search-R1's and FlashRAG's wiki-18, the quoted title on the first line of
``contents``). The store an index keeps beside it (``passages.jsonl`` + ``offsets.npy``) reads
one passage by a seek, so a server over 21M passages holds only the offsets it touches.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

STORE, OFFSETS = "passages.jsonl", "offsets.npy"


def _passage(row: object, place: str) -> dict:
    if isinstance(row, dict) and "contents" in row and "title" not in row and isinstance(row["contents"], str):
        title, _, text = row["contents"].partition("\n")
        row = {"id": row.get("id"), "title": title.strip().strip('"'), "text": text.strip()}
    if not isinstance(row, dict) or not all(isinstance(row.get(f), str) for f in ("title", "text")):
        raise ValueError(f"{place}: a passage needs string fields 'title' and 'text' (or Search-R1's "
                         f"'contents'), got {row!r:.200}")
    if row.get("id") is None:
        raise ValueError(f"{place}: a passage needs an 'id'")
    return {"id": str(row["id"]), "title": row["title"], "text": row["text"]}


def iter_passages(source: str | Path | Iterable[dict]) -> Iterator[dict]:
    """Passages one at a time from a JSONL file or an iterable of rows, checked (strings,
    an id, no id twice); the error names the file and line."""
    if isinstance(source, (str, Path)):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"search corpus {path} does not exist")

        def rows() -> Iterator[tuple[object, str]]:
            with path.open(encoding="utf-8") as handle:
                for lineno, line in enumerate(handle, 1):
                    if not line.strip():
                        continue
                    try:
                        yield json.loads(line), f"{path}:{lineno}"
                    except json.JSONDecodeError as error:
                        raise ValueError(f"{path}:{lineno}: not valid JSON ({error})") from None

        numbered = rows()
    else:
        numbered = ((row, f"passage {i}") for i, row in enumerate(source))
    seen: set[str] = set()
    for row, place in numbered:
        passage = _passage(row, place)
        if passage["id"] in seen:
            raise ValueError(f"{place}: duplicate passage id {passage['id']!r}")
        seen.add(passage["id"])
        yield passage


def load_corpus(source: str | Path | Iterable[dict]) -> list[dict]:
    """Every passage of ``source`` (``iter_passages``); an empty corpus is an error."""
    passages = list(iter_passages(source))
    if not passages:
        raise ValueError(f"search corpus {source if isinstance(source, (str, Path)) else '(given as rows)'} is empty")
    return passages


class CorpusDigest:
    """A corpus's content hash, fed one passage at a time: the JSON of ``[[id, title, text], …]``
    hashed as it is written, so 21M passages never sit in memory at once."""

    def __init__(self) -> None:
        self._hash, self.size = hashlib.sha256(b"["), 0

    def add(self, passage: dict) -> None:
        item = json.dumps([passage["id"], passage["title"], passage["text"]], ensure_ascii=False)
        self._hash.update(((", " if self.size else "") + item).encode("utf-8"))
        self.size += 1

    def hexdigest(self) -> str:
        final = self._hash.copy()
        final.update(b"]")
        return final.hexdigest()[:16]


def corpus_digest(passages: Iterable[dict]) -> str:
    """Short content hash of a corpus: names its cache entries, embedding files and indexes."""
    digest = CorpusDigest()
    for passage in passages:
        digest.add(passage)
    return digest.hexdigest()


class PassageWriter:
    """Writes the store of an index folder while the corpus streams by."""

    def __init__(self, folder: Path):
        self._handle = (folder / STORE).open("wb")
        self._offsets = [0]

    def add(self, passage: dict) -> None:
        line = (json.dumps(passage, ensure_ascii=False) + "\n").encode("utf-8")
        self._handle.write(line)
        self._offsets.append(self._offsets[-1] + len(line))

    def close(self) -> None:
        self._handle.close()
        np.save(Path(self._handle.name).with_name(OFFSETS), np.asarray(self._offsets, dtype=np.int64))


class PassageStore:
    """Passage ``i`` of an index folder, read by one ``pread`` (offsets memory-mapped)."""

    def __init__(self, folder: str | Path):
        folder = Path(folder)
        self._offsets = np.load(folder / OFFSETS, mmap_mode="r")
        self._fd = os.open(folder / STORE, os.O_RDONLY)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i: int) -> dict:
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        return json.loads(os.pread(self._fd, end - start, start))

    def close(self) -> None:
        os.close(self._fd)
