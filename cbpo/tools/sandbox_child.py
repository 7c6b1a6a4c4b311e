"""Child side of the Python sandbox (see :mod:`cbpo.tools.sandbox`, which documents the design).

Started by the parent as ``python -I -S -u -B -X utf8 sandbox_child.py key=value ...``, either
directly ("plain" mode) or as PID 1 of fresh mount, network and PID namespaces ("namespaces"
mode, under ``unshare``). It runs as the parent's user, sets up containment, then forks the
process that runs the model's code: resource limits, an unprivileged uid, no new privileges.
This process stays behind as a supervisor: it waits for the code, writes its wait status and
CPU seconds to ``status_fd`` and leaves nothing behind (in namespace mode the kernel kills the
whole namespace when PID 1 exits; in plain mode it kills what was re-parented to it and, if the
caller died, removes the caller's work dir). It also
watches ``lifeline_fd``, which becomes ready when the caller is gone: a caller killed with
SIGKILL cannot stop the run, so the supervisor ends it then as if it had been asked to.

Stdlib only, and imports kept few: everything imported here is paid on every tool call.
"""

from __future__ import annotations

import errno
import os
import resource  # before the fork: both processes need it (os.wait4 imports it too)
import sys

_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC = 0x2, 0x4, 0x1000, 0x4000
_MOUNT_ATTR_RDONLY, _MOUNT_ATTR_NOSUID = 0x1, 0x2
# mount_setattr(2) (Linux >= 5.12) has the same number on every architecture.
_SYS_MOUNT_SETATTR, _AT_FDCWD, _AT_RECURSIVE = 442, -100, 0x8000
_PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS = 36, 38
_HOME_TMPFS_OPTIONS = "size=1m,nr_inodes=1024,mode=755"
_TRACEBACK_FRAMES = 4  # the model needs where it failed, not the whole library stack
_SOURCE_NAME = "<code>"  # not "<python>": that is a tool tag the model reads
_CONFINE_FAILED = 125


def main(argv: list[str]) -> None:
    cfg = dict(arg.split("=", 1) for arg in argv)
    with open(int(cfg["code_fd"]), "rb") as code_file:
        code = code_file.read()
    status_fd = int(cfg["status_fd"])

    import ctypes  # mount(2), mount_setattr(2) and prctl(2) have no wrappers in os

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    namespaces = cfg["mode"] == "namespaces"
    if namespaces:
        _isolate_filesystem(libc, ctypes, cfg)
        # The work dir is a folder of its own on the fresh /tmp: interpreter directories that
        # live under /tmp (a checkout there) are bound back beside it, not inside it.
        os.makedirs(cfg["workdir"], mode=0o700, exist_ok=True)
        if cfg["uid"]:
            os.chown(cfg["workdir"], int(cfg["uid"]), int(cfg["uid"]))
    else:
        # Orphaned grandchildren (daemons) get re-parented to us, so we can kill them at the end.
        _check(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0), ctypes, "prctl(CHILD_SUBREAPER)")
    os.chdir(cfg["workdir"])

    lifeline_fd = int(cfg["lifeline_fd"])
    pid = os.fork()
    if pid == 0:
        os.close(status_fd)
        os.close(lifeline_fd)
        try:
            _confine(libc, ctypes, cfg)
        except Exception as exc:  # noqa: BLE001 - whatever failed, never run the code unconfined
            print(f"SandboxError: could not confine the code: {exc}", file=sys.stderr)
            os._exit(_CONFINE_FAILED)
        _run_model_code(code, cfg["sitepath"])
    _kill_on_sigterm(pid)
    caller_gone = _kill_when_caller_is_gone(pid, lifeline_fd)
    wait_status, cpu_seconds = _wait_for(pid)
    try:
        os.write(status_fd, f"{wait_status} {cpu_seconds:.3f}\n".encode())
    except BrokenPipeError:  # the caller is gone: no one to tell, but still clean up
        caller_gone.append(True)
    if not namespaces:
        _kill_descendants()
        if caller_gone:  # the caller would have removed its work dir; it died first
            import shutil

            shutil.rmtree(cfg["workdir"], ignore_errors=True)
    os._exit(0)  # nothing to flush; skipping interpreter teardown shortens every call


def _check(result: int, ctypes, what: str) -> None:
    if result != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"sandbox setup: {what} failed: {os.strerror(error)}")


def _isolate_filesystem(libc, ctypes, cfg: dict[str, str]) -> None:
    """Read-only view of the host, private size-capped tmpfs as /tmp (the work dir) and
    /dev/shm, and an empty tmpfs over the parent's HOME; interpreter directories under those
    are bound back.

    We are root in a private mount namespace (``unshare --mount`` made propagation private), so
    none of this is visible outside, and all of it vanishes with the namespace.
    """
    keep = [path for path in cfg["keep"].split(os.pathsep) if path]
    keep_fds = {path: os.open(path, os.O_PATH) for path in keep}  # before anything hides them

    class MountAttr(ctypes.Structure):
        _fields_ = [(name, ctypes.c_uint64) for name in ("set", "clr", "propagation", "userns")]

    attr = MountAttr(_MOUNT_ATTR_RDONLY | _MOUNT_ATTR_NOSUID, 0, 0, 0)
    long = ctypes.c_long  # syscall(2) is variadic: pass every argument at full width
    result = libc.syscall(
        long(_SYS_MOUNT_SETATTR),
        long(_AT_FDCWD),
        ctypes.c_char_p(b"/"),
        long(_AT_RECURSIVE),
        ctypes.byref(attr),
        long(ctypes.sizeof(attr)),
    )
    # ENOSYS (kernel < 5.12): the host tree stays writable where permissions allow (documented).
    if ctypes.get_errno() != errno.ENOSYS:
        _check(result, ctypes, "mount_setattr(/, read-only)")

    uid = cfg["uid"]
    owner = f",uid={uid},gid={uid}" if uid else ""
    work_options = f"size={cfg['disk']},nr_inodes={cfg['inodes']},mode=700{owner}"
    covers = [("/tmp", work_options)]
    if os.path.isdir("/dev/shm") and not os.path.islink("/dev/shm"):  # multiprocessing's semaphores
        covers.append(("/dev/shm", work_options))
    home = cfg["hide"]
    if home and not _is_within(home, "/tmp") and os.path.isdir(home):
        covers.append((home, _HOME_TMPFS_OPTIONS))
    for target, options in covers:
        _check(
            libc.mount(b"tmpfs", target.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options.encode()),
            ctypes,
            f"mount tmpfs on {target}",
        )
        for path, fd in keep_fds.items():
            if _is_within(path, target):
                os.makedirs(path, exist_ok=True)
                source = f"/proc/self/fd/{fd}".encode()
                result = libc.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None)
                _check(result, ctypes, f"bind {path}")
    for fd in keep_fds.values():
        os.close(fd)


def _is_within(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _confine(libc, ctypes, cfg: dict[str, str]) -> None:
    """Limits and identity of the process that runs the model's code (set as root, then locked)."""
    cpu = int(cfg["cpu"])
    limits = [
        (resource.RLIMIT_AS, int(cfg["memory"])),
        (resource.RLIMIT_FSIZE, int(cfg["fsize"])),
        (resource.RLIMIT_NOFILE, int(cfg["nofile"])),
        (resource.RLIMIT_CORE, 0),
    ]
    uid = cfg["uid"]
    if uid:
        # NPROC binds only non-root uids, and counts every process of the uid: it is set only
        # when the code runs under a uid of its own.
        limits.append((resource.RLIMIT_NPROC, int(cfg["nproc"])))
    for limit, value in limits:
        _lower_limit(limit, value, value)
    # SIGXCPU at the soft limit; SIGKILL one second later if the code ignores it.
    _lower_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    if uid:
        os.setgroups([])
        os.setgid(int(uid))
        os.setuid(int(uid))
    _check(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), ctypes, "prctl(NO_NEW_PRIVS)")
    if cfg["mode"] != "namespaces":
        sys.addaudithook(_deny_network)


def _lower_limit(limit: int, soft: int, hard: int) -> None:
    """Set a resource limit, never above the hard limit we inherited (raising it would fail)."""
    inherited = resource.getrlimit(limit)[1]
    if inherited != resource.RLIM_INFINITY:
        soft, hard = min(soft, inherited), min(hard, inherited)
    resource.setrlimit(limit, (soft, hard))


def _deny_network(event: str, args: tuple) -> None:
    """Plain-mode fallback: refuse every non-Unix socket created from Python code.

    Audit hooks cannot be removed from Python, but native code (ctypes, C extensions) and other
    executables bypass them; only the network namespace is a real barrier.
    """
    if event == "socket.__new__" and args[1] != 1:  # 1 == AF_UNIX
        raise PermissionError("network access is disabled in the sandbox")


def _run_model_code(code: bytes, sitepath: str) -> None:
    """Run the code as ``__main__`` and exit; exceptions print a short traceback of its frames."""
    sys.path.extend(path for path in sitepath.split(os.pathsep) if path)
    sys.argv[:] = [""]
    module = type(sys)("__main__")
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module  # pickle and multiprocessing look functions up here
    try:
        compiled = compile(code, _SOURCE_NAME, "exec")
    except (SyntaxError, ValueError) as exc:  # ValueError: NUL bytes in the source
        _print_exception(exc, None, code)
        _finish(1)
    try:
        exec(compiled, module.__dict__)
    except SystemExit as exc:
        _finish(_exit_code(exc))
    except BaseException as exc:  # noqa: BLE001 - every failure of the model's code is reported
        _print_exception(exc, exc.__traceback__.tb_next, code)  # tb_next: skip this frame
        _finish(1)
    _finish(0)


def _exit_code(exc: SystemExit) -> int:
    """The exit status the interpreter gives ``sys.exit(arg)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _finish(code: int) -> None:
    """Exit as the interpreter would (non-daemon threads joined, atexit handlers run, standard
    streams flushed) but skip its teardown: after a fork, freeing every object costs ~20 ms of
    copy-on-write page faults. Unflushed buffers of files the code left open are lost; they
    live in the work dir, which goes away anyway."""
    threading = sys.modules.get("threading")
    try:
        if threading is not None:
            threading._shutdown()
        import atexit

        atexit._run_exitfuncs()
    except BaseException:  # noqa: BLE001 - e.g. SystemExit from a thread or handler: still exit
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # replaced or closed by the code
            pass
    os._exit(code)


def _print_exception(exc: BaseException, tb, code: bytes) -> None:
    import linecache
    import traceback

    lines = code.decode("utf-8", "replace").splitlines(keepends=True)
    linecache.cache[_SOURCE_NAME] = (len(code), None, lines, _SOURCE_NAME)
    try:
        traceback.print_exception(
            type(exc), exc, tb, limit=-_TRACEBACK_FRAMES, chain=False, file=sys.__stderr__
        )
    except (OSError, ValueError):  # the code closed its stderr: nothing left to report on
        pass


def _kill_on_sigterm(pid: int) -> None:
    """The parent stops a run with SIGTERM: we kill the code's main process, then finish as
    usual (report, leftovers killed, exit; in namespace mode our exit empties the namespace).
    As PID 1 we would ignore a SIGTERM without a handler."""
    import _signal  # the C module behind `signal`, whose enum import costs several ms a call

    _signal.signal(_signal.SIGTERM, lambda *_: _kill_code(pid))


def _kill_when_caller_is_gone(pid: int, lifeline_fd: int) -> list[bool]:
    """From a thread (the main one blocks in wait4): once ``lifeline_fd`` is ready (a pidfd of
    the caller: POLLIN when it exits; a pipe only the caller writes to: POLLHUP), kill the
    code's main process; the main thread then finishes as after a SIGTERM. A caller dead
    before this starts is seen at once: both kinds of fd stay ready.

    Returns a list that holds True once the caller is seen gone, set before the kill, so the
    main thread knows it when the code's wait returns (the status write may still succeed:
    the caller's end of that pipe can outlive its lifeline by a moment while it exits)."""
    import _thread
    import select

    gone: list[bool] = []

    def watch() -> None:
        poller = select.poll()
        poller.register(lifeline_fd, select.POLLIN)
        poller.poll()
        gone.append(True)
        _kill_code(pid)

    _thread.start_new_thread(watch, ())
    return gone


def _kill_code(pid: int) -> None:
    try:
        os.kill(pid, 9)  # SIGKILL
    except ProcessLookupError:  # already reaped: we are finishing anyway
        pass


def _wait_for(main_pid: int) -> tuple[int, float]:
    """Reap children (orphans re-parented to us too, so zombies do not fill the process cap)
    until the main one exits; return its wait status and CPU seconds (its reaped children's
    included)."""
    while True:
        pid, wait_status, usage = os.wait4(-1, 0)
        if pid == main_pid:
            return wait_status, usage.ru_utime + usage.ru_stime


def _kill_descendants() -> None:
    """Plain mode: kill and reap whatever the code left running (we are its child subreaper)."""
    me = os.getpid()
    while True:
        try:
            with open(f"/proc/{me}/task/{me}/children") as listing:
                children = [int(pid) for pid in listing.read().split()]
        except OSError:  # kernel without CONFIG_PROC_CHILDREN: the parent's killpg must do
            return
        if not children:
            return
        for pid in children:
            os.kill(pid, 9)  # our children: they stay (as zombies at worst) until reaped below
        for pid in children:
            os.waitpid(pid, 0)
        # Their own children have just been re-parented to us: next round.


if __name__ == "__main__":
    main(sys.argv[1:])
