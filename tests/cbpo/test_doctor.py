"""`python -m cbpo doctor`: every problem of a study at once, each with its fix."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cbpo import doctor

ROOT = Path(__file__).resolve().parents[2]
PAPER = ["model=qwen3-1.7b", "preset=paper", "data=toolstar-math"]
WF = ROOT / "workflow" / "config.yaml"


def done(stdout="", returncode=0):
    return subprocess.CompletedProcess([], returncode, stdout=stdout, stderr="")


def test_an_empty_data_root_lists_every_missing_piece_in_one_run(tmp_path):
    # evaluation.engine=vllm: the engines are checked where the study runs vLLM or verl
    cmd = [sys.executable, "-m", "cbpo", "doctor", *PAPER, f"data_root={tmp_path}", "paths.models_dir=" + str(tmp_path / "models"), "evaluation.engine=vllm",
           "--engines", str(tmp_path / "no-engines" / "python")]
    env = {k: v for k, v in os.environ.items() if k not in ("SERPER_API_KEY", "CBPO_SHARED_DATA")}
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert out.returncode == 1, out.stderr
    text = out.stdout
    for needle in ("train/toolstar_sft.jsonl is missing (dongguanting/Tool-Star-SFT-54K)",
                   "train/toolstar_grpo_mix_train.parquet is missing",
                   *(f"benchmarks/{b}/test.jsonl is missing" for b in ("aime24", "aime25", "math500", "math", "gsm8k")),
                   "qwen3-1.7b/cbpo_model.json is missing (Qwen/Qwen3-1.7B)", "qwen3-32b/cbpo_model.json is missing (Qwen/Qwen3-32B)",
                   "SERPER_API_KEY is not set", "no engine environment at"):
        assert needle in text, needle
    problems = text.count("PROBLEM [")
    assert problems == text.count("    fix: ") and f"{problems} problem(s)" in text


def test_a_retrieval_server_or_judge_that_does_not_answer_is_named():
    cfg, wf = doctor.study_config(["model=qwen3-1.7b", "preset=paper", "data=toolstar-search", "tools_cfg.search_backend=http",
                                   "+tools_cfg.search_options={url: 'http://127.0.0.1:9/retrieve'}"], WF)
    down = lambda url: "ConnectionError"
    (search,) = doctor.check_search(cfg, {}, down)
    assert "http://127.0.0.1:9/retrieve does not answer (ConnectionError)" in search.what
    assert doctor.check_search(cfg, {}, lambda url: None) == []
    (judge,) = doctor.check_judge(wf, ["webwalker", "hotpotqa"], {}, down)
    assert "webwalker is scored by an LLM judge and no endpoint is set" in judge.what and "CBPO_JUDGE_URL" in judge.fix
    (judge,) = doctor.check_judge(wf, ["webwalker"], {"CBPO_JUDGE_URL": "http://127.0.0.1:9/v1"}, down)
    assert "http://127.0.0.1:9/v1 does not answer" in judge.what
    assert doctor.check_judge({**wf, "judge_fallback": "f1"}, ["webwalker"], {}, down) == []


def test_a_study_searching_the_suite_retriever_is_checked_for_its_index(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg, wf = doctor.study_config(["model=qwen3-1.7b", "preset=paper", "data=toolstar-search", f"data_root={tmp_path}"], WF)
    http = {**wf, "search_backend": "http"}
    # no index yet: the DAG builds it from the small corpus; wiki-18 must be there or fetchable
    assert doctor.check_search(cfg, {}, None, http) == []
    (missing,) = doctor.check_search(cfg, {}, None, {**http, "retriever": {"corpus": "wiki18", "kind": "bm25"}})
    assert "wiki-18.jsonl" in missing.what and "hf download PeterJinGo/wiki-18-corpus" in missing.fix
    # an index that exists must be servable
    (tmp_path / "data" / "retriever" / "small-bm25").mkdir(parents=True)
    (tmp_path / "data" / "retriever" / "small-bm25" / "meta.json").write_text("{}")
    assert doctor.check_search(cfg, {}, None, http, serves=lambda index: None) == []
    (broken,) = doctor.check_search(cfg, {}, None, http, serves=lambda index: "RuntimeError: exited")
    assert "data/retriever/small-bm25 cannot be served (RuntimeError: exited)" in broken.what
    assert "python -m cbpo.retriever index" in broken.fix
    # a running server instead: asked as it is
    assert doctor.check_search(cfg, {}, lambda url: url, {**http, "search_url": "http://h:1/retrieve"})[0].what \
        == "the retrieval server http://h:1/retrieve does not answer (http://h:1/retrieve)"


def test_the_doctor_serves_a_real_index(tmp_path):
    from cbpo.retriever.index import build_index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "1", "title": "A", "text": "alpha beta"}\n')
    for name in ("good", "broken"):
        build_index(corpus, tmp_path / name)
    (tmp_path / "broken" / "data.csc.index.npy").unlink()
    assert doctor._serves(tmp_path / "good") is None
    assert "exited" in doctor._serves(tmp_path / "broken")


def fake_slurm(partition="MaxTime=1-00:00:00 State=UP", nodes="gpu:4|256000|32", accounts="acct\n"):
    def run(cmd):
        if cmd[0] == "scontrol":
            return done(f"PartitionName={cmd[3]} {partition}") if cmd[3] == "gpu" else done("", 1)
        if cmd[0] == "sinfo":
            return done(nodes + "\n")
        return done(accounts)
    return run


def test_the_partition_is_checked_against_every_job_kind(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/" + name)
    wf = {"resources": {"rl": {"gpu": 8, "cpus_per_gpu": 8, "mem_mb": 512000, "runtime": 2880},
                        "evaluate": {"gpu": 1, "cpus_per_gpu": 8, "mem_mb": 64000, "runtime": 240}}}
    problems, notes = doctor.check_slurm(wf, "gpu", "other", fake_slurm(), {"rl": 8})
    whats = [p.what for p in problems]
    assert whats == ["rl jobs ask for 8 GPUs per node; partition 'gpu''s largest node has 4",
                     "rl jobs ask for 64 CPUs per node; partition 'gpu''s largest node has 32",
                     "rl jobs ask for 512000 MB of memory per node; partition 'gpu''s largest node has 256000",
                     "rl jobs ask for 2880 min; partition 'gpu''s MaxTime is 1-00:00:00",
                     "account 'other' is not one of yours in sacctmgr"]
    assert notes == []
    roomy = fake_slurm("MaxTime=UNLIMITED", "gpu:h100:8(S:0-1)|1024000|128")
    assert doctor.check_slurm(wf, "gpu", "acct", roomy, {"rl": 8}) == ([], [])
    (bad,), _ = doctor.check_slurm(wf, "nope", "acct", roomy, {"rl": 8})
    assert "partition 'nope' is unknown" in bad.what
    (empty,), _ = doctor.check_slurm(wf, "gpu", "", roomy, {"rl": 8})
    assert empty.what == "slurm_account is empty"


def test_without_slurm_that_part_is_skipped_with_a_note(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: None)
    assert doctor.check_slurm({}, "gpu", "acct", fake_slurm(), {}) == ([], ["SLURM: sinfo is not on PATH: the partition's limits and the account were not checked"])


@pytest.mark.parametrize("text,minutes", [("2-00:00:00", 2880), ("04:30:00", 270), ("90", 90), ("UNLIMITED", None)])
def test_slurm_time_limits(text, minutes):
    assert doctor._slurm_minutes(text) == minutes


def test_the_engine_environment_follows_verls_pins(tmp_path):
    python = tmp_path / "python"
    python.touch()
    good = "torch 2.11.0\nvllm -\nvllm-cpu 0.24.0\nverl 0.9.1\ntransformers 5.9.2\n"
    assert doctor.check_engines(python, lambda cmd: done(good)) == []
    (bad,) = doctor.check_engines(python, lambda cmd: done(good.replace("torch 2.11.0", "torch 2.13.0")))
    assert "torch 2.13.0, verl 0.9.1 needs 2.11" in bad.what and "engines_env.py" in bad.fix


def test_disk_for_the_checkpoints(tmp_path, monkeypatch):
    cfg = SimpleNamespace(model=SimpleNamespace(name="qwen3-4b"))
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: SimpleNamespace(free=10e9))
    (p,) = doctor.check_disk(cfg, {}, tmp_path, 12)
    assert p.what.startswith("10 GB free at") and "keep about 672 GB" in p.what
    monkeypatch.setattr(doctor.shutil, "disk_usage", lambda path: SimpleNamespace(free=1e13))
    assert doctor.check_disk(cfg, {}, tmp_path, 12) == []


def test_an_opd_rl_job_on_verl_is_checked_for_its_teachers_gpus_as_the_rl_rule_spreads_them(monkeypatch):
    monkeypatch.setattr(doctor.shutil, "which", lambda name: "/usr/bin/" + name)  # a fake sinfo, SLURM installed or not
    cfg, wf = doctor.study_config(PAPER, WF)  # backend null in the workflow: the paper preset's verl
    rl = wf["resources"]["rl"]["gpu"]
    teacher = cfg.verl.teacher_gpus
    assert doctor.rl_gpus_per_node(wf, cfg, ["grpo"]) == rl
    assert doctor.rl_gpus_per_node(wf, cfg, ["grpo", "opd"]) == rl + teacher
    assert doctor.rl_gpus_per_node({**wf, "verl_nodes": 2}, cfg, ["opd"]) == rl + -(-teacher // 2)
    assert doctor.rl_gpus_per_node({**wf, "backend": "local"}, cfg, ["opd"]) == rl
    eight = fake_slurm("MaxTime=UNLIMITED", "gpu:8|1024000|128")
    (problem,), _ = doctor.check_slurm({"resources": {"rl": {"gpu": 8}}}, "gpu", "acct", eight, {"rl": 16})
    assert problem.what == "rl jobs ask for 16 GPUs per node; partition 'gpu''s largest node has 8"
    assert "verl.teacher_gpus" in problem.fix and "verl_nodes=2" in problem.fix
