"""Nothing of a sandboxed run outlives its caller: a caller killed with SIGKILL (the CLI, or a
program calling ``run_python`` from a worker thread) takes the model's code, its children and
its ``setsid`` daemons with it within 2 s, in every containment mode, and no work dir is left. Real processes, real
``kill -9``; the survivors are looked up by a unique process name in the host's /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from cbpo.tools.sandbox import containment_mode

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]
MODES = ["namespaces", "plain"] if containment_mode() == "namespaces" else ["plain"]
STARTED_SECONDS = 20.0  # for the caller to start and the code to spawn its processes
GONE_SECONDS = 2.0  # the promise: nothing left this long after the caller died

# A worker thread calls the sandbox, as the agent loop's tool pool does. Argument 1: the file
# to run; 2: the containment; 3: "pipe" to run as on a kernel without pidfd_open.
LIBRARY_CALLER = textwrap.dedent(
    """
    import os, sys, threading
    from pathlib import Path
    if sys.argv[3] == "pipe":
        def no_pidfd(pid, flags=0):
            raise OSError(38, "Function not implemented")
        os.pidfd_open = no_pidfd
    from cbpo.tools.sandbox import SandboxLimits, run_python
    code = Path(sys.argv[1]).read_text()
    call = threading.Thread(target=run_python, args=(code, SandboxLimits(wall_seconds=60)),
                            kwargs={"containment": sys.argv[2]})
    call.start()
    call.join()
    """
)


def model_code(token: str) -> str:
    """Three long sleepers named ``token``: the code itself, a child, and a ``setsid`` daemon."""
    return textwrap.dedent(
        f"""
        import ctypes, os, time
        ctypes.CDLL(None).prctl(15, b"{token}", 0, 0, 0)
        if os.fork() == 0:
            if os.fork() == 0:
                os.setsid()
            time.sleep(60)
            os._exit(0)
        time.sleep(60)
        """
    )


def wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def kill_caller_and_check(caller_args: list[str], token: str, tmp_path, monkeypatch, processes_named) -> None:
    # The plain-mode runs here run as root (the interpreter lives under /root): allowed on purpose.
    monkeypatch.setenv("CBPO_SANDBOX_ALLOW_ROOT", "1")
    tmp = tmp_path / "tmp"  # where plain mode makes the code's work dir
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    caller = subprocess.Popen(caller_args, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        started = wait_for(lambda: len(processes_named(token)) == 3, STARTED_SECONDS)
        assert started, f"the code never started: {caller.poll()=}"
        os.kill(caller.pid, signal.SIGKILL)
        caller.wait()
        assert wait_for(lambda: processes_named(token) == [], GONE_SECONDS), (
            f"still running {GONE_SECONDS} s after the caller was killed: {processes_named(token)}"
        )
        assert wait_for(lambda: not list(tmp.glob("cbpo-sandbox-*")), GONE_SECONDS), (
            f"work dirs left behind: {list(tmp.iterdir())}"
        )
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
        caller.stderr.close()
        for pid in processes_named(token):  # a failed check must not leave sleepers behind
            os.kill(pid, signal.SIGKILL)


def test_killing_the_cli_kills_the_code_and_its_children(tmp_path, monkeypatch, processes_named):
    token = f"cbpo{uuid.uuid4().hex[:11]}"
    program = tmp_path / "sleepers.py"
    program.write_text(model_code(token))
    cli = [sys.executable, "-m", "cbpo", "sandbox", str(program), "--timeout", "60"]
    kill_caller_and_check(cli, token, tmp_path, monkeypatch, processes_named)


@pytest.mark.parametrize("lifeline", ["pidfd", "pipe"])
@pytest.mark.parametrize("containment", MODES)
def test_killing_a_calling_program_kills_the_code_and_its_children(
    containment, lifeline, tmp_path, monkeypatch, processes_named
):
    token = f"cbpo{uuid.uuid4().hex[:11]}"
    program = tmp_path / "sleepers.py"
    program.write_text(model_code(token))
    caller = [sys.executable, "-c", LIBRARY_CALLER, str(program), containment, lifeline]
    kill_caller_and_check(caller, token, tmp_path, monkeypatch, processes_named)
