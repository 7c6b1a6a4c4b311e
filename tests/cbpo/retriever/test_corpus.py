import hashlib
import json

import pytest

from cbpo.retriever.corpus import PassageStore, PassageWriter, corpus_digest, iter_passages, load_corpus

PASSAGES = [{"id": "a", "title": "Ada", "text": "Ada wrote the first program."},
            {"id": "b", "title": "Ünïcode", "text": "Text with ü and 日本."}]


def test_the_streamed_digest_is_the_hash_of_the_whole_corpus_json():
    whole = json.dumps([[p["id"], p["title"], p["text"]] for p in PASSAGES], ensure_ascii=False)
    assert corpus_digest(iter(PASSAGES)) == hashlib.sha256(whole.encode()).hexdigest()[:16]
    assert corpus_digest(PASSAGES[:1]) != corpus_digest(PASSAGES)


def test_search_r1_contents_rows_split_into_title_and_text(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text(json.dumps({"id": 7, "contents": '"Aaron"\nAaron is a prophet.'}) + "\n\n")
    assert load_corpus(path) == [{"id": "7", "title": "Aaron", "text": "Aaron is a prophet."}]


def test_load_corpus_reads_jsonl_and_names_bad_lines(tmp_path):
    good = tmp_path / "corpus.jsonl"
    good.write_text("\n".join(json.dumps(p) for p in PASSAGES) + "\n\n")
    assert load_corpus(good) == PASSAGES
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(PASSAGES[0]) + "\n{not json\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        list(iter_passages(bad))
    with pytest.raises(ValueError, match="'title' and 'text'"):
        load_corpus([{"id": 1, "text": "no title"}])
    with pytest.raises(ValueError, match="duplicate passage id 'a'"):
        load_corpus([PASSAGES[0], PASSAGES[0]])
    with pytest.raises(ValueError, match="is empty"):
        load_corpus([])
    with pytest.raises(FileNotFoundError, match="missing.jsonl"):
        load_corpus(tmp_path / "missing.jsonl")


def test_the_store_reads_each_passage_back_by_index(tmp_path):
    writer = PassageWriter(tmp_path)
    for passage in PASSAGES:
        writer.add(passage)
    writer.close()
    store = PassageStore(tmp_path)
    assert len(store) == 2 and [store[i] for i in (1, 0)] == PASSAGES[::-1]
    store.close()
