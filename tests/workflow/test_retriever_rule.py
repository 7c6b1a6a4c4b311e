"""Search through the suite's retrieval server in a study (workflow/rules/retriever.smk): the
DAG builds the index, its jobs lease a server on it, which stops after the last one."""
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
KEY = "smoke/tiny/twohop/seed0"


def test_a_study_searching_over_http_starts_its_server_and_stops_it(tmp_path, dag):
    dag(tmp_path, "table1", config=("preset=smoke", "data=twohop", "search_backend=http", "methods=[grpo]"))
    index = tmp_path / "data" / "retriever" / "small-bm25"
    meta = json.loads((index / "meta.json").read_text())
    assert meta["kind"] == "bm25" and meta["size"] > 2000  # the two-hop world, plus ARPO's pages where present
    for run in (f"runs/{KEY}/grpo", f"results/raw/{KEY}/grpo/twohop", f"results/raw/{KEY}/sft/twohop"):
        provenance = json.loads((tmp_path / run / "provenance.json").read_text())
        assert provenance["search_index"]["corpus_sha"] == meta["corpus_sha"]
        assert provenance["config"]["tools_cfg"]["search_backend"] == "http"
    (log,) = (index / "serving").glob("*.log")
    deadline = time.monotonic() + 60  # the server outlives its last lease by 30 s
    while "stopped after" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(1)
    text = log.read_text()
    assert text.count("serving bm25 index 'small'") == 1  # one server for the rl and both evaluate jobs
    requests = int(text.split("stopped after ")[1].split()[0])
    assert requests >= 3  # each job's reachability probe at least, searches beside
    assert not list((index / "serving").glob("*.json"))  # its state is gone with it


def plan(tmp_path, *config):
    cmd = [str(SNAKEMAKE), "table1", "-n", "-p", "-s", str(ROOT / "Snakefile"), "-d", str(tmp_path), "-c1",
           "--config", "preset=smoke", "data=twohop", *config]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-4000:]
    text = out.stdout + out.stderr
    return text, [shlex.split(line.split("Shell command: ", 1)[1]) for line in text.splitlines() if "Shell command: " in line]


def test_a_running_server_is_used_as_it_is(tmp_path):
    text, shells = plan(tmp_path, "search_backend=http", "search_url=http://10.0.0.5:8000/retrieve")
    assert "rule retriever" not in text
    jobs = [w for w in shells if "stage=rl" in w or "eval.run" in w]
    assert jobs and all("++tools_cfg.search_options.url=http://10.0.0.5:8000/retrieve" in w for w in jobs)


def test_the_dense_index_and_no_search_override_by_default(tmp_path):
    text, shells = plan(tmp_path, "search_backend=http", "retriever={corpus: small, kind: dense}")
    assert "data/retriever/small-dense/meta.json" in text
    assert all(f"++tools_cfg.search_options.index={tmp_path / 'data/retriever/small-dense'}" in w
               for w in shells if "stage=rl" in w or "eval.run" in w)
    _, shells = plan(tmp_path / "plain")
    assert not any("tools_cfg.search_backend" in word for w in shells for word in w)
