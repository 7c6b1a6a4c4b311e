"""Jobs share one server per index and machine; it stops when the last lease is gone."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from cbpo.retriever.lease import health, lease_server, serving_dir
from cbpo.tools.search import SearchTool


def wait_for(condition, seconds=30):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def server_pid(folder):
    states = list(serving_dir(folder).glob("*.json"))
    return json.loads(states[0].read_text())["pid"] if states else None


def test_leases_share_one_server_which_stops_after_the_last(bm25_index):
    first = lease_server(bm25_index, idle=1.0)
    second = lease_server(bm25_index, idle=1.0)
    assert first.url == second.url and health(first.url)["corpus_sha"] == first.meta["corpus_sha"]
    pid = server_pid(bm25_index)
    first.release()
    time.sleep(2.0)
    assert health(second.url) is not None  # one lease left: still up
    second.release()
    wait_for(lambda: health(second.url) is None)
    assert server_pid(bm25_index) is None
    wait_for(lambda: subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode != 0)


def test_a_killed_jobs_lease_is_dropped(bm25_index):
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from cbpo.retriever.lease import lease_server; "
        f"lease_server({str(bm25_index)!r}, idle=1.0); print('leased', flush=True); time.sleep(600)")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "leased"
    url = json.loads(next(serving_dir(bm25_index).glob("*.json")).read_text())["url"]
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    wait_for(lambda: health(url) is None)


def test_the_http_backend_leases_a_server_for_an_index(bm25_index, corpus_file):
    tool = SearchTool("http", k=3, index=str(bm25_index))
    assert tool.backend.lease is not None and tool.backend.cache_id.startswith("http:bm25:")
    assert tool("w001 w017") == SearchTool("bm25", k=3, corpus=corpus_file)("w001 w017")
    tool.backend.lease.release()
    with pytest.raises(ValueError, match="not both"):
        SearchTool("http", url="http://127.0.0.1:1/retrieve", index=str(bm25_index))


def test_a_server_that_cannot_start_says_why(tmp_path, bm25_index):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "meta.json").write_text((bm25_index / "meta.json").read_text())  # no index files
    with pytest.raises(RuntimeError, match="exited .* before answering"):
        lease_server(broken, idle=1.0, timeout=60)
    assert not list((serving_dir(broken) / "leases").rglob("*-*"))


def test_under_slurm_each_job_runs_its_own_server(bm25_index, monkeypatch):
    # SLURM ends a job's processes with the job: a server another job started would die under us
    monkeypatch.setenv("SLURM_JOB_ID", "101")
    first = lease_server(bm25_index, idle=1.0)
    monkeypatch.setenv("SLURM_JOB_ID", "102")
    second = lease_server(bm25_index, idle=1.0)
    assert first.url != second.url
    assert {p.name.rsplit("-job", 1)[1] for p in serving_dir(bm25_index).glob("*-job*.json")} == {"101.json", "102.json"}
    first.release()
    second.release()


def test_a_leased_server_that_dies_is_replaced_on_the_next_search(bm25_index, corpus_file):
    # Ray and SLURM end a process's descendants with it: the job that started a server can take it along
    tool = SearchTool("http", k=3, index=str(bm25_index))
    before = tool("w001 w017")
    old = tool.backend.url
    os.kill(health(old.removesuffix("/retrieve"))["pid"], signal.SIGKILL)
    wait_for(lambda: health(old.removesuffix("/retrieve")) is None)
    assert tool("w001 w017") == before and tool.backend.url != old
    tool.backend.lease.release()
