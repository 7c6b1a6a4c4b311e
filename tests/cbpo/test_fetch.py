"""The paper study's hub inputs fetched once, resumably, checksummed; offline, one message.

The hub is a local folder here: huggingface_hub's download functions are replaced at the
module boundary by copies from it (``FakeHub``), and ``datasets.load_dataset`` reads a local
parquet folder where the hub id is asked for. The offline tests use the real library."""
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import transformers
import torch

from cbpo import fetch, models
from cbpo.data import read_rows
from cbpo.prepare import model_folder

ROOT = Path(__file__).resolve().parents[2]
SFT_ROWS = [
    {"instruction": "Solve it with tools.", "input": "What is 12 * 7?",
     "output": "<python>print(12 * 7)</python><result>\n84\n</result><answer>\\boxed{84}</answer>"},
    {"instruction": "Solve it with tools.", "input": "Capital of France?", "output": "<think>unsure</think>"},
]


class FakeHub:
    """``hub/<repo_type>s/<repo id>/...`` served as huggingface_hub would: each call recorded,
    ``fail_after`` files copied before a simulated dropped connection."""

    def __init__(self, folder: Path):
        self.folder, self.calls, self.fail_after = folder, [], None

    def repo(self, repo_id, repo_type):
        return self.folder / f"{repo_type}s" / repo_id

    def repo_info(self, repo_id, repo_type=None, timeout=None):
        if not self.repo(repo_id, repo_type).is_dir():
            raise RuntimeError(f"404: {repo_id} not found")
        return SimpleNamespace(sha="c0ffee")

    def _copy(self, src, dest):
        if self.fail_after is not None and self.fail_after <= 0:
            raise ConnectionError("connection dropped")
        if not dest.exists():  # what is already there is resumed from, not fetched again
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
            self.calls.append(dest.name)
        if self.fail_after is not None:
            self.fail_after -= 1

    def hf_hub_download(self, repo_id, filename, repo_type=None, revision=None, local_dir=None):
        assert revision == "c0ffee"  # pinned to the commit the hub named
        self._copy(self.repo(repo_id, repo_type) / filename, Path(local_dir) / filename)
        return str(Path(local_dir) / filename)

    def snapshot_download(self, repo_id, repo_type=None, revision=None, local_dir=None, allow_patterns=None):
        repo = self.repo(repo_id, repo_type)
        for src in sorted(p for p in repo.rglob("*") if p.is_file()):
            rel = str(src.relative_to(repo))
            if any(fnmatch.fnmatch(rel, pat) for pat in allow_patterns):
                self._copy(src, Path(local_dir) / rel)
        return str(local_dir)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    fake = FakeHub(tmp_path / "hub")
    sft = fake.repo("dongguanting/Tool-Star-SFT-54K", "dataset")
    sft.mkdir(parents=True)
    (sft / "final_sft_edition9_v2.json").write_text(json.dumps(SFT_ROWS))
    qwen = fake.repo("Qwen/Qwen3-1.7B", "model")
    tokenizer = models.train_tokenizer(["What is 12 * 7?", SFT_ROWS[0]["output"]] * 20, bpe_vocab=300)
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, pad_token_id=tokenizer.pad_token_id))
    model.save_pretrained(qwen)  # the hub layout: config.json, model.safetensors, generation_config.json
    tokenizer.save_pretrained(qwen)
    (qwen / "README.md").write_text("not a model file")
    monkeypatch.setattr(fetch, "HfApi", lambda: fake)
    monkeypatch.setattr(fetch, "hf_hub_download", fake.hf_hub_download)
    monkeypatch.setattr(fetch, "snapshot_download", fake.snapshot_download)
    return fake


def items(tmp_path, *names):
    return [fetch.parse_item(n, tmp_path / "data", tmp_path / "models") for n in names]


def test_sft_traces_are_downloaded_checksummed_and_converted(tmp_path, hub):
    (item,) = items(tmp_path, "sft=toolstar-math")
    assert item.target == tmp_path / "data" / "train" / "toolstar_sft.jsonl"
    fetch.fetch([item])
    (row,) = read_rows(item.target)  # one converted, one refused and named
    assert row["answer"] == "84" and row["question"] == "What is 12 * 7?"
    report = json.loads(item.target.with_name("toolstar_sft.report.json").read_text())
    assert report["rejected_rows"] == [{"id": "1", "reason": "no final <answer> block"}]
    upstream = tmp_path / "data" / "upstream" / "Tool-Star-SFT-54K"
    manifest = json.loads((upstream / fetch.MANIFEST).read_text())
    assert manifest["source"] == {"repo": "dongguanting/Tool-Star-SFT-54K", "repo_type": "dataset", "revision": "c0ffee"}
    assert manifest["files"]["final_sft_edition9_v2.json"]["sha256"] == fetch.sha256(upstream / "final_sft_edition9_v2.json")


def test_a_model_is_fetched_once_and_then_loads_offline(tmp_path, hub):
    (item,) = items(tmp_path, "model=qwen3-1.7b")
    assert fetch.fetch([item]) == [item]
    folder = tmp_path / "models" / "qwen3-1.7b"
    card = json.loads((folder / models.MODEL_CARD).read_text())
    assert card["hub_id"] == "Qwen/Qwen3-1.7B" and card["revision"] == "c0ffee"
    assert not (folder / "README.md").exists()  # only what loading needs
    assert fetch.verify(folder) == []
    assert set(json.loads((folder / fetch.MANIFEST).read_text())["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    # The jobs resolve the backbone to its folder, never to the hub id.
    assert models.resolve_model("qwen3-1.7b", tmp_path / "models") == folder
    model, _ = models.load_model(folder)
    assert model.config.num_hidden_layers == 1
    copied = list(hub.calls)
    assert fetch.fetch(items(tmp_path, "model=qwen3-1.7b")) == [] and hub.calls == copied  # once


def test_an_interrupted_download_resumes_into_the_same_folder(tmp_path, hub):
    hub.fail_after = 2
    with pytest.raises(ConnectionError):
        fetch.fetch(items(tmp_path, "model=qwen3-1.7b"))
    partial = tmp_path / "models" / ".qwen3-1.7b.partial"
    first = sorted(p.name for p in partial.iterdir())
    assert len(first) == 2 and not (tmp_path / "models" / "qwen3-1.7b").exists()  # nothing looks finished
    hub.fail_after = None
    fetch.fetch(items(tmp_path, "model=qwen3-1.7b"))
    assert not set(first) & set(hub.calls[2:])  # the two files already there were not fetched again
    assert (tmp_path / "models" / "qwen3-1.7b" / models.MODEL_CARD).is_file() and not partial.exists()


def test_a_changed_file_is_caught_by_its_manifest(tmp_path, hub):
    fetch.fetch(items(tmp_path, "model=qwen3-1.7b"))
    folder = tmp_path / "models" / "qwen3-1.7b"
    (folder / "config.json").write_text("{}")
    assert fetch.verify(folder) == [f"{folder / 'config.json'}: differs from its manifest "
                                    f"(sha256 {json.loads((folder / fetch.MANIFEST).read_text())['files']['config.json']['sha256'][:12]}...)"]
    (folder / models.MODEL_CARD).unlink()
    with pytest.raises(fetch.FetchError, match="does not match its manifest"):
        fetch.fetch(items(tmp_path, "model=qwen3-1.7b"))


def test_math_is_written_where_the_benchmark_reads_it(tmp_path, hub, monkeypatch):
    import datasets

    from eval.benchmarks import load_benchmark

    local = tmp_path / "MATH-lighteval"
    local.mkdir()
    datasets.Dataset.from_list([{"problem": "1+1?", "solution": "It is $\\boxed{2}$.", "level": "Level 1"}]).to_parquet(
        str(local / "test-00000-of-00001.parquet"))
    real = datasets.load_dataset
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config, split, revision: real(
        str(local) if repo == "DigitalLearningGmbH/MATH-lighteval" else repo, split=split))
    hub.repo("DigitalLearningGmbH/MATH-lighteval", "dataset").mkdir(parents=True)
    (item,) = items(tmp_path, "benchmark=math")
    fetch.fetch([item])
    (row,) = load_benchmark("math", data_dir=tmp_path / "data")
    assert row["question"] == "1+1?" and row["answer"] == "2"
    assert fetch.verify(item.target.parent) == []


def test_benchmarks_whose_sources_differ_are_not_fetched(tmp_path):
    # MATH-500's hub copy names its fields differently from the local file the loader reads.
    assert fetch.benchmark_item("math500", tmp_path) is None
    assert [i.name for i in fetch.study_items("toolstar-math", ["math500", "math"], ["qwen3-1.7b", "tiny"],
                                              tmp_path, tmp_path / "models")] == ["sft=toolstar-math", "benchmark=math", "model=qwen3-1.7b"]


def run_fetch(tmp_path, *args, **env):
    cmd = [sys.executable, "-m", "cbpo.fetch", *args, "--data-root", str(tmp_path / "data"), "--models-dir", str(tmp_path / "models")]
    start = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env}, timeout=120)
    return done, time.monotonic() - start


@pytest.mark.parametrize("env", [{"HF_HUB_OFFLINE": "1"}, {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": "http://127.0.0.1:9"}],
                         ids=["offline mode", "hub unreachable"])
def test_without_the_hub_one_message_lists_everything_missing(tmp_path, env):
    done, seconds = run_fetch(tmp_path, "sft=toolstar-math", "benchmark=math", "model=qwen3-1.7b", "model=qwen3-32b",
                              "corpus=wiki18", **env)
    assert done.returncode == 2 and seconds < 60, done.stderr
    message = done.stderr
    assert message.count("error:") == 1 and "5 input(s) of the study cannot be fetched" in message
    for needle in ("dongguanting/Tool-Star-SFT-54K", "DigitalLearningGmbH/MATH-lighteval", "Qwen/Qwen3-1.7B", "Qwen/Qwen3-32B",
                   "hf download Qwen/Qwen3-32B --local-dir", "datasets.load_dataset(",
                   "hf download PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz --repo-type dataset"):
        assert needle in message
    assert not (tmp_path / "models").exists() and not (tmp_path / "data").exists()  # nothing downloaded


def test_a_copy_put_in_place_by_hand_is_used_without_the_hub(tmp_path):
    folder = tmp_path / "models" / "qwen3-4b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    done, _ = run_fetch(tmp_path, "model=qwen3-4b", HF_HUB_OFFLINE="1")
    assert done.returncode == 0, done.stderr
    assert json.loads((folder / models.MODEL_CARD).read_text())["hub_id"] == "Qwen/Qwen3-4B"
    assert json.loads((folder / fetch.MANIFEST).read_text())["source"]["revision"] == "local copy"


def test_wiki18_is_downloaded_checksummed_and_unpacked_for_the_retriever(tmp_path, hub):
    import gzip

    from cbpo.retriever.corpus import load_corpus

    repo = hub.repo("PeterJinGo/wiki-18-corpus", "dataset")
    repo.mkdir(parents=True)
    with gzip.open(repo / "wiki-18.jsonl.gz", "wt") as packed:
        packed.write(json.dumps({"id": "0", "contents": '"Aaron"\nAaron is a prophet.'}) + "\n")
    (item,) = items(tmp_path, "corpus=wiki18")
    assert item.target == tmp_path / "data" / "search" / "wiki-18.jsonl"
    assert fetch.fetch([item]) == [item] and hub.calls == ["wiki-18.jsonl.gz"]
    assert load_corpus(item.target) == [{"id": "0", "title": "Aaron", "text": "Aaron is a prophet."}]
    assert fetch.verify(item.local.parent) == []
    assert "hf download PeterJinGo/wiki-18-corpus wiki-18.jsonl.gz" in item.manual
    with pytest.raises(ValueError, match="nothing to fetch"):
        items(tmp_path, "corpus=small")


def test_prepare_fetches_hub_models_through_the_same_path(tmp_path, hub):
    out = model_folder("qwen3-1.7b", tmp_path / "elsewhere" / "qwen3-1.7b")
    assert (out / "config.json").is_file() and fetch.verify(out) == []
