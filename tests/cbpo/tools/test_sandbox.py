"""Tests of the Python sandbox (cbpo.tools.sandbox): normal programs, a suite of hostile
programs (each must be contained, leave the host untouched and end as a sensible observation)
and the ``python -m cbpo sandbox FILE.py`` contract.

Checks that only hold under namespace containment are skipped in plain mode, which on this
machine (root, interpreter under /root) runs the code as root.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

from cbpo.tools import ToolsConfig, build_tools, sandbox
from cbpo.tools.sandbox import (
    MAX_SECONDS,
    SandboxLimits,
    SandboxRefused,
    SandboxResult,
    cli,
    containment_mode,
    run_python,
)

pytestmark = pytest.mark.timeout(60)

REPO = Path(__file__).resolve().parents[3]
MODE = containment_mode()
MODES = ["namespaces", "plain"] if MODE == "namespaces" else ["plain"]
namespaces_only = pytest.mark.skipif(
    MODE != "namespaces", reason="needs namespace containment (root and a working `unshare`)"
)


@pytest.fixture(autouse=True)
def allow_plain_mode_as_root(monkeypatch):
    """Plain mode runs the code as root here (the interpreter lives under /root); these tests
    allow it on purpose. The refusal is tested with the variable unset."""
    monkeypatch.setenv("CBPO_SANDBOX_ALLOW_ROOT", "1")


def run(code: str, containment: str = "auto", **limits) -> SandboxResult:
    """Sandbox ``code`` (dedented) with a 5 s default wall limit."""
    limits.setdefault("wall_seconds", 5.0)
    return run_python(textwrap.dedent(code), SandboxLimits(**limits), containment=containment)


def run_cli(args: list[str]) -> subprocess.CompletedProcess:
    """The public contract: ``python -m cbpo sandbox ARGS``."""
    return subprocess.run(
        [sys.executable, "-m", "cbpo", "sandbox", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def process_name_token() -> str:
    return f"cbpo{uuid.uuid4().hex[:11]}"  # at most 15 characters: fits /proc/PID/comm


def set_process_name(token: str) -> str:
    """Code giving the calling process a recognisable name, so the host can look for it."""
    return f"import ctypes; ctypes.CDLL(None).prctl(15, b'{token}', 0, 0, 0)"


# --- normal programs -------------------------------------------------------------------------


@pytest.mark.parametrize("containment", MODES)
def test_print_is_ok(containment):
    result = run("print('hello', 6 * 7)", containment)
    assert (result.status, result.output) == ("ok", "hello 42\n")
    assert result.seconds > 0


@pytest.mark.parametrize("containment", MODES)
def test_sympy_and_numpy_import(containment):
    result = run(
        """
        import numpy, sympy
        x = sympy.symbols("x")
        print(sympy.solve(x**2 - 4, x), int(numpy.arange(5).sum()))
        """,
        containment,
        wall_seconds=30,
    )
    assert (result.status, result.output) == ("ok", "[-2, 2] 10\n")


def test_work_dir_is_writable_and_fresh_each_call():
    first = run("open('state.txt', 'w').write('x'); import os; print(os.listdir('.'))")
    second = run("import os; print(os.listdir('.'))")
    assert (first.status, first.output) == ("ok", "['state.txt']\n")
    assert (second.status, second.output) == ("ok", "[]\n")


def test_plain_mode_work_dir_is_removed_afterwards():
    result = run("import os; print(os.getcwd())", "plain")
    assert result.status == "ok"
    assert not Path(result.output.strip()).exists()


def test_exception_shows_the_failing_line_and_message():
    result = run("x = 1\ny = [][x]\n")
    assert result.status == "error"
    assert 'File "<code>", line 2' in result.output
    assert "y = [][x]" in result.output
    assert result.output.rstrip().endswith("IndexError: list index out of range")
    assert "sandbox_child" not in result.output  # our frames are not the model's business


def test_output_before_an_error_comes_first():
    result = run("print('partial'); raise ValueError('bad value')")
    assert result.status == "error"
    assert result.output.startswith("partial\n")
    assert result.output.rstrip().endswith("ValueError: bad value")


def test_syntax_error():
    result = run("print(1 +)")
    assert result.status == "error"
    assert "SyntaxError" in result.output


def test_exit_codes():
    assert run("import sys; sys.exit(0)").status == "ok"
    message = run("import sys; sys.exit('giving up')")
    assert (message.status, message.output) == ("error", "giving up\n")


def test_threads_and_atexit_run_before_exit():
    result = run(
        """
        import atexit, threading, time
        atexit.register(print, "atexit ran")
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread done"))).start()
        """
    )
    assert (result.status, result.output) == ("ok", "thread done\natexit ran\n")


def test_multiprocessing_pool_works():
    result = run(
        """
        import multiprocessing
        def square(x):
            return x * x
        with multiprocessing.Pool(2) as pool:
            print(pool.map(square, range(5)))
        """,
        wall_seconds=30,
    )
    assert (result.status, result.output) == ("ok", "[0, 1, 4, 9, 16]\n")


def test_long_output_keeps_head_and_tail():
    result = run("for i in range(2000): print(f'line {i:04d}')", max_output_chars=500)
    assert result.status == "ok"
    assert result.output.startswith("line 0000\n")
    assert result.output.rstrip().endswith("line 1999")
    assert "characters omitted" in result.output
    assert len(result.output) < 600


def test_concurrent_calls_do_not_mix():
    results: dict[int, SandboxResult] = {}

    def call(i: int) -> None:
        results[i] = run(f"import time; time.sleep(0.1); print({i})")

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {i: (r.status, r.output) for i, r in results.items()} == {i: ("ok", f"{i}\n") for i in range(6)}


# --- hostile programs ------------------------------------------------------------------------


@pytest.mark.parametrize("containment", MODES)
def test_infinite_loop_times_out(containment):
    result = run("while True: pass", containment, wall_seconds=1)
    assert result.status == "timeout"
    assert result.output == "TimeoutError: execution exceeded the 1 s time limit"


def test_sleeping_forever_times_out():
    result = run("print('going to sleep'); import time; time.sleep(600)", wall_seconds=1)
    assert result.status == "timeout"
    assert result.output == "going to sleep\nTimeoutError: execution exceeded the 1 s time limit"


def test_cpu_time_limit_even_when_sigxcpu_is_ignored():
    result = run(
        "import signal; signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nwhile True: pass",
        wall_seconds=30,
        cpu_seconds=1,
    )
    assert result.status == "timeout"
    assert "CPU-time limit" in result.output


def test_closing_its_output_does_not_end_supervision():
    result = run("import os, time; os.close(1); os.close(2); time.sleep(600)", wall_seconds=1)
    assert result.status == "timeout"


@namespaces_only
def test_fork_bomb_is_capped_and_fully_killed(processes_named):
    token = process_name_token()
    result = run(
        f"""
        {set_process_name(token)}
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        wall_seconds=2,
        max_processes=16,
    )
    assert result.status == "timeout"
    assert processes_named(token) == []


def test_thread_bomb_hits_the_process_cap():
    result = run(
        """
        import threading, time
        while True:
            threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
        """
    )
    assert result.status == "error"
    assert "can't start new thread" in result.output


@pytest.mark.parametrize("containment", MODES)
def test_daemon_does_not_outlive_the_call(containment, processes_named):
    host_check = process_name_token()  # first, the check itself must see a named process
    probe_code = f"{set_process_name(host_check)}; print(flush=True); import time; time.sleep(60)"
    probe = subprocess.Popen([sys.executable, "-c", probe_code], stdout=subprocess.PIPE)
    try:
        probe.stdout.readline()
        assert processes_named(host_check) == [probe.pid]
    finally:
        probe.kill()
        probe.wait()
    token = process_name_token()
    result = run(
        f"""
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                {set_process_name(token)}
                time.sleep(600)
            os._exit(0)
        time.sleep(0.3)
        print("daemon started")
        """,
        containment,
    )
    assert (result.status, result.output) == ("ok", "daemon started\n")
    assert processes_named(token) == []


@pytest.mark.parametrize("containment", MODES)
def test_memory_bomb_raises_memory_error(containment):
    code = "blocks = []\nwhile True: blocks.append(bytearray(16 << 20))"
    result = run(code, containment, memory_bytes=256 << 20)
    assert result.status == "error"
    assert result.output.rstrip().endswith("MemoryError")


def test_single_huge_allocation_fails_cleanly():
    result = run("x = bytearray(64 << 30)")
    assert result.status == "error"
    assert "MemoryError" in result.output


def test_big_file_hits_the_file_size_cap():
    result = run("open('big', 'wb').write(b'0' * (64 << 20))", file_size_bytes=1 << 20)
    assert result.status == "error"
    assert "File too large" in result.output


@namespaces_only
def test_disk_fill_across_files_hits_the_work_dir_cap():
    result = run(
        "for i in range(100): open(f'part{i}', 'wb').write(b'0' * (1 << 20))",
        disk_bytes=8 << 20,
        file_size_bytes=2 << 20,
    )
    assert result.status == "error"
    assert "No space left on device" in result.output


@pytest.mark.parametrize("containment", MODES)
def test_output_flood_is_stopped(containment):
    result = run("while True: print('x' * 1000)", containment, max_output_chars=300, max_output_bytes=100_000)
    assert result.status == "killed"
    assert result.output.rstrip().endswith("printed more than 100000 bytes and was stopped")
    assert len(result.output) < 500


def test_one_giant_write_is_stopped():
    result = run("import sys; sys.stdout.write('y' * 50_000_000)", max_output_bytes=100_000)
    assert result.status == "killed"
    assert "was stopped" in result.output


@namespaces_only
def test_writes_outside_the_work_dir_do_not_reach_the_host(tmp_path):
    token = uuid.uuid4().hex
    targets = [REPO / f"escape-{token}", tmp_path / f"escape-{token}", Path("/var/tmp") / f"escape-{token}"]
    try:
        result = run(
            f"""
            for path in {[str(t) for t in targets]!r}:
                try:
                    open(path, "w").write("escaped")
                    print("wrote", path)
                except OSError as exc:
                    print("refused", type(exc).__name__)
            """
        )
        assert result.status == "ok"
        assert not any(target.exists() for target in targets)
    finally:
        for target in targets:
            target.unlink(missing_ok=True)


@namespaces_only
def test_host_files_are_read_only_even_where_permissions_allow(tmp_path):
    shared = Path("/var/tmp")  # world-writable on the host
    assert os.stat(shared).st_mode & 0o002
    result = run(f"open('{shared}/cbpo-{uuid.uuid4().hex}', 'w')")
    assert result.status == "error"
    assert "Read-only file system" in result.output


@pytest.mark.parametrize("containment", MODES)
def test_secret_environment_variables_are_not_passed(containment, monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    result = run("import os; print(dict(os.environ))", containment)
    assert result.status == "ok"
    assert secret not in result.output
    assert "AWS_SECRET_ACCESS_KEY" not in result.output


@namespaces_only
def test_secrets_cannot_be_read_from_other_processes(monkeypatch):
    secret = f"secret-{uuid.uuid4().hex}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)  # our environ; the probe reads /proc
    result = run(
        f"""
        import glob
        for path in glob.glob("/proc/*/environ"):
            try:
                print(open(path, "rb").read())
            except OSError:
                pass
        """
    )
    assert result.status == "ok"
    assert secret not in result.output


@namespaces_only
def test_home_directory_contents_are_hidden():
    home = Path.home()
    interpreter = Path(sys.base_prefix).resolve()
    private = [entry.name for entry in home.iterdir() if not interpreter.is_relative_to(entry.resolve())]
    if not private:
        pytest.skip(f"{home} holds nothing but the interpreter")
    result = run(f"import os; print(os.listdir({str(home)!r}))")
    assert result.status == "ok"
    assert not set(private) & set(ast.literal_eval(result.output))


@pytest.mark.parametrize("containment", MODES)
def test_cannot_connect_to_a_host_loopback_listener(containment):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(0.2)
        port = listener.getsockname()[1]
        result = run(
            f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')",
            containment,
        )
        with pytest.raises(TimeoutError):
            listener.accept()
    assert result.status == "error"
    assert "Network is unreachable" in result.output or "network access is disabled" in result.output


@namespaces_only
def test_signalling_the_parent_or_everyone_does_not_reach_the_host():
    host_child = subprocess.Popen(["sleep", "60"])
    try:
        result = run(
            f"""
            import os, signal, subprocess
            for pid in (os.getppid(), {os.getpid()}, {host_child.pid}):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError as exc:
                    print(pid, type(exc).__name__)
            own_child = subprocess.Popen(["sleep", "60"])
            os.kill(-1, signal.SIGKILL)  # every process it may signal, except itself
            print("own child:", own_child.wait())
            """
        )
        assert host_child.poll() is None
    finally:
        host_child.kill()
        host_child.wait()
    assert result.status == "ok"
    assert result.output.splitlines() == [
        "1 PermissionError",  # its parent is the supervisor, PID 1 of the namespace
        f"{os.getpid()} ProcessLookupError",
        f"{host_child.pid} ProcessLookupError",
        "own child: -9",
    ]


@namespaces_only
def test_cannot_regain_root():
    result = run("import os; os.setuid(0)")
    assert result.status == "error"
    assert "PermissionError" in result.output


@pytest.mark.parametrize("containment", MODES)
def test_hard_exit_code_is_reported(containment):
    result = run("print('bye', flush=True); import os; os._exit(3)", containment)
    assert (result.status, result.output) == ("error", "bye\nExit code 3")


@pytest.mark.parametrize("containment", MODES)
def test_segfault_is_reported_as_killed(containment):
    result = run("import ctypes; ctypes.string_at(0)", containment)
    assert result.status == "killed"
    assert result.output == "Killed: the process was terminated by SIGSEGV (segmentation fault)"


def test_abort_is_reported_as_killed():
    result = run("import os; os.abort()")
    assert result.status == "killed"
    assert "SIGABRT" in result.output


def test_deep_recursion_is_an_error():
    result = run("def f(n): return f(n + 1)\nf(0)")
    assert result.status == "error"
    assert "RecursionError" in result.output
    assert len(result.output) < 2000


def test_c_stack_overflow_is_contained():
    result = run(
        """
        import sys
        sys.setrecursionlimit(10**9)
        a, b = [], []
        for _ in range(200_000):
            a, b = [a], [b]
        a == b  # compares in C, one stack frame per level
        """
    )
    assert result.status == "killed"
    assert "SIGSEGV" in result.output


def test_stdin_is_closed():
    result = run("import sys; print(repr(sys.stdin.read())); input()")
    assert result.status == "error"
    assert result.output.startswith("''\n")
    assert "EOFError" in result.output


def test_exec_of_another_program():
    result = run("import os; os.execv('/bin/sh', ['sh', '-c', 'echo from sh; exit 4'])")
    assert (result.status, result.output) == ("error", "from sh\nExit code 4")


@pytest.mark.parametrize("containment", MODES)
def test_nul_bytes_in_code_become_an_observation(containment):
    result = run("print(1)\x00", containment)
    assert result.status == "error"
    assert "null bytes" in result.output


def test_lone_surrogates_in_code_become_an_observation():
    result = run("print('\ud800')")
    assert result.status == "error"
    assert result.output


def test_invalid_utf8_output_is_replaced():
    result = run("import sys; sys.stdout.buffer.write(b'\\xff\\xfe ok \\x00\\n')")
    assert result.status == "ok"
    assert result.output == "\ufffd\ufffd ok \x00\n"


def test_signal_handlers_cannot_dodge_the_wall_clock():
    result = run(
        """
        import signal, time
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        time.sleep(600)
        """,
        wall_seconds=1,
    )
    assert result.status == "timeout"


# --- API and CLI -----------------------------------------------------------------------------


def test_bad_arguments_are_rejected_with_clear_messages():
    with pytest.raises(TypeError, match="code must be str"):
        run_python(b"print(1)")
    with pytest.raises(ValueError, match="wall_seconds"):
        SandboxLimits(wall_seconds=0)
    with pytest.raises(ValueError, match=f"wall_seconds must be at most {MAX_SECONDS}"):
        SandboxLimits(wall_seconds=1e9)
    with pytest.raises(TypeError, match="memory_bytes"):
        SandboxLimits(memory_bytes=1.5)
    with pytest.raises(ValueError, match="containment"):
        run_python("print(1)", containment="chroot")


def test_cpu_limit_defaults_to_the_wall_limit():
    assert SandboxLimits(wall_seconds=2.5).effective_cpu_seconds == 3
    assert SandboxLimits(wall_seconds=2.5, cpu_seconds=7).effective_cpu_seconds == 7


def test_cli_prints_one_json_object(tmp_path):
    program = tmp_path / "hello.py"
    program.write_text("print('hi')\n")
    completed = run_cli([str(program)])
    assert completed.returncode == 0
    payload = json.loads(completed.stdout)
    assert set(payload) == {"status", "output", "seconds"}
    assert (payload["status"], payload["output"]) == ("ok", "hi\n")
    assert isinstance(payload["seconds"], float)


def test_cli_timeout_and_failures_still_exit_zero(tmp_path):
    loop = tmp_path / "loop.py"
    loop.write_text("while True: pass\n")
    crash = tmp_path / "crash.py"
    crash.write_bytes(b"print('\xff')\n")  # not UTF-8: a SyntaxError for the model
    timed_out = run_cli([str(loop), "--timeout", "0.5"])
    crashed = run_cli([str(crash)])
    assert (timed_out.returncode, json.loads(timed_out.stdout)["status"]) == (0, "timeout")
    assert "0.5 s" in json.loads(timed_out.stdout)["output"]
    assert (crashed.returncode, json.loads(crashed.stdout)["status"]) == (0, "error")
    assert "SyntaxError" in json.loads(crashed.stdout)["output"]


def test_cli_usage_errors(tmp_path):
    missing = run_cli([str(tmp_path / "missing.py")])
    assert missing.returncode == 2
    assert "cannot read" in missing.stderr
    program = tmp_path / "ok.py"
    program.write_text("pass\n")
    not_a_number = run_cli([str(program), "--timeout", "abc"])
    assert not_a_number.returncode == 2
    assert "--timeout" in not_a_number.stderr


@pytest.mark.parametrize("timeout", ["1e9", "1e20", "inf"])
def test_cli_huge_timeouts_are_cut_to_the_maximum(tmp_path, timeout):
    program = tmp_path / "hello.py"
    program.write_text("print('hi')\n")
    completed = run_cli([str(program), f"--timeout={timeout}"])
    assert (completed.returncode, completed.stderr) == (0, "")
    assert json.loads(completed.stdout)["status"] == "ok"


@pytest.mark.parametrize("timeout", ["nan", "0", "-1", "-inf"])
def test_cli_timeouts_that_are_not_positive_are_an_error_result(tmp_path, timeout):
    program = tmp_path / "hello.py"
    program.write_text("print('hi')\n")
    completed = run_cli([str(program), f"--timeout={timeout}"])
    assert (completed.returncode, completed.stderr) == (0, "")
    payload = json.loads(completed.stdout)
    assert set(payload) == {"status", "output", "seconds"}
    assert payload["status"] == "error"
    assert payload["output"].startswith("SandboxError: --timeout must be a positive number of seconds")


def runs_as_root_in_plain_mode() -> bool:
    return os.geteuid() == 0 and run("import os; print(os.geteuid())", "plain").output == "0\n"


@pytest.fixture
def root_plain_mode_only(monkeypatch):
    """For refusal tests: plain mode would run the code as root here, and nothing allows it."""
    if not runs_as_root_in_plain_mode():
        pytest.skip("plain mode does not run the code as root on this machine")
    monkeypatch.delenv("CBPO_SANDBOX_ALLOW_ROOT")


def test_plain_mode_refuses_to_run_code_as_root_unless_allowed(root_plain_mode_only, monkeypatch):
    with pytest.raises(SandboxRefused, match="CBPO_SANDBOX_ALLOW_ROOT=1"):
        run_python("print(1)", containment="plain")
    monkeypatch.setenv("CBPO_SANDBOX_ALLOW_ROOT", "yes")  # only "1" allows it
    with pytest.raises(SandboxRefused):
        run_python("print(1)", containment="plain")
    monkeypatch.setenv("CBPO_SANDBOX_ALLOW_ROOT", "1")
    assert run_python("print(1)", containment="plain").output == "1\n"


def test_a_refused_fallback_fails_when_the_tools_are_built_and_in_the_cli(
    root_plain_mode_only, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(sandbox, "_detected", "plain")  # as where namespaces are unavailable
    with pytest.raises(SandboxRefused, match="as root"):
        build_tools(["python"], ToolsConfig(python_timeout=5.0, search_k=10))
    program = tmp_path / "hello.py"
    program.write_text("print('hi')\n")
    assert cli([str(program)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "as root" in captured.err and "Traceback" not in captured.err


@namespaces_only
def test_setup_failure_is_an_observation(monkeypatch):
    from cbpo.tools import sandbox

    monkeypatch.setattr(sandbox, "_interpreter_dirs", lambda: ("/nonexistent-cbpo-sandbox-dir",))
    result = run_python("print(1)", containment="namespaces")
    assert result.status == "error"
    assert result.output.startswith("SandboxError: the sandbox failed to start")
    assert "nonexistent-cbpo-sandbox-dir" in result.output


def test_sandbox_does_not_touch_signal_state_of_the_caller():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGCHLD)
    run("print(1)")
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGCHLD)) == before
