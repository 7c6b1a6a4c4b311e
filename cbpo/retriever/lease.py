"""One retrieval server per index and machine, started by the first job that needs it and
stopped when the last one is done.

A job that searches ``search_backend=http`` with ``search_options.index`` (the DAG's rl and
evaluate jobs) calls :func:`lease_server`: under a lock it files a lease, then uses the server
this machine already runs for that index or starts one (``python -m cbpo.retriever serve
… --lease-dir``). The server watches the leases; when none has been alive for ``idle`` seconds
it stops (under the same lock, so a job arriving then starts a new one instead of finding a
server that is leaving). A lease dies with its process: a killed job's lease is dropped.

Why not Snakemake's ``service()`` outputs: Snakemake puts a service and all its consumers in one
group that must run at once (``DAG.handle_pipes_and_services``), so a study's rl and evaluate
jobs would all have to fit on the machine together, and under SLURM on one node. Leasing per
machine keeps every job where the scheduler puts it; on a cluster each job runs its own server on
each of its nodes, on loopback (nothing listens beyond the node), over the same memory-mapped
index files: SLURM ends a job's processes with it, so a server shared across jobs would die
under the jobs still using it.

State, under ``<index>/serving/``: ``<host>.json`` (url, pid), ``<host>.lock``, ``<host>.log``
(the server's output) and ``leases/<host>/<pid>-<token>``.
"""
from __future__ import annotations

import atexit
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

SERVING = "serving"
IDLE_SECONDS = 30.0  # a server outlives its last lease this long: the next job of a study reuses it


def _host() -> str:
    """Whose server a process shares: this machine's, and under SLURM its job's. SLURM ends every
    process of a job with the job, a server another job started included, so each allocation
    runs its own (a multi-node job's workers share their node's)."""
    job = os.environ.get("SLURM_JOB_ID")
    return f"{socket.gethostname()}-job{job}" if job else socket.gethostname()


def serving_dir(folder: str | Path) -> Path:
    return Path(folder) / SERVING


def _lock(state: Path) -> Path:
    """The lock beside a server's state file, taken by jobs leasing and by the server leaving."""
    return state.with_suffix(".lock")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def live_leases(lease_dir: Path) -> list[Path]:
    """The leases whose process still runs; dead ones are removed."""
    leases = []
    for lease in lease_dir.glob("*-*"):
        pid = lease.name.split("-", 1)[0]
        if pid.isdigit() and _alive(int(pid)):
            leases.append(lease)
        else:
            lease.unlink(missing_ok=True)
    return leases


def health(url: str, timeout: float = 5.0) -> dict | None:
    """The server's ``/health`` answer; None when it does not answer."""
    import requests

    try:
        answer = requests.get(f"{url}/health", timeout=timeout)
        return answer.json() if answer.status_code == 200 else None
    except (requests.RequestException, ValueError):
        return None


class Lease:
    """A claim on this machine's server for one index: ``url`` (no path), released by
    ``release()``, at the process's exit, or by its death."""

    def __init__(self, url: str, path: Path, meta: dict):
        self.url, self.path, self.meta = url, path, meta
        atexit.register(self.release)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)


def lease_server(folder: str | Path, idle: float = IDLE_SECONDS, timeout: float = 300.0) -> Lease:
    """A lease on this machine's server for the index in ``folder``, starting the server when
    none runs (``timeout``: seconds it may take to open the index and answer)."""
    from cbpo.retriever.index import read_meta

    folder = Path(folder).resolve()
    meta = read_meta(folder)
    host, serving = _host(), serving_dir(folder)
    state, lease_dir = serving / f"{host}.json", serving / "leases" / host
    lease_dir.mkdir(parents=True, exist_ok=True)
    with locked(_lock(state)):
        lease = lease_dir / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        lease.touch()
        if state.is_file():
            running = json.loads(state.read_text())
            answer = health(running["url"]) if _alive(running["pid"]) else None
            if answer and answer.get("corpus_sha") == meta["corpus_sha"]:
                return Lease(running["url"], lease, meta)
            state.unlink()
        try:
            url = _start(folder, state, lease_dir, idle, timeout)
        except BaseException:
            lease.unlink(missing_ok=True)
            raise
        return Lease(url, lease, meta)


def _start(folder: Path, state: Path, lease_dir: Path, idle: float, timeout: float) -> str:
    log = state.with_suffix(".log")
    command = [sys.executable, "-m", "cbpo.retriever", "serve", str(folder), "--port", "0",
               "--lease-dir", str(lease_dir), "--idle-exit", str(idle), "--ready-file", str(state)]
    with log.open("a") as out:
        # its own session: a job's Ctrl-C or SLURM's signal to the job step leaves it to its leases
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"the retrieval server for {folder} exited ({process.returncode}) before "
                               f"answering; its log {log} ends:\n{tail}")
        if state.is_file():
            running = json.loads(state.read_text())
            if running.get("pid") == process.pid and health(running["url"]):
                return running["url"]
        time.sleep(0.2)
    process.kill()
    raise TimeoutError(f"the retrieval server for {folder} did not answer within {timeout:.0f} s (log: {log})")


def idle_watcher(lease_dir: Path, state: Path, idle: float):
    """The server side of the leases: a coroutine factory for ``server.serve``'s ``watcher``
    that stops the server once no lease has been alive for ``idle`` seconds."""
    import asyncio

    async def watch(server) -> None:
        empty_since = None
        while not server.should_exit:
            await asyncio.sleep(min(0.5, idle / 4))
            if live_leases(lease_dir):
                empty_since = None
                continue
            empty_since = empty_since or time.monotonic()
            if time.monotonic() - empty_since < idle:
                continue
            with locked(_lock(state)):
                if live_leases(lease_dir):  # a job came while we waited for the lock
                    empty_since = None
                    continue
                if state.is_file() and json.loads(state.read_text()).get("pid") == os.getpid():
                    state.unlink()
            print(f"no lease for {idle:g} s: stopping", flush=True)
            server.should_exit = True

    return watch


def write_ready(state: Path, url: str) -> None:
    """The server's ready file: its url and pid, written whole."""
    partial = state.with_name(f"{state.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"url": url, "pid": os.getpid(), "host": _host()}) + "\n")
    os.replace(partial, state)
