"""xdist workers forked from a Python that has imported torch already (Linux).

Every xdist worker is a new Python that imports torch before its first test: 7.2–7.6 s of a
worker's 15–17 s start-up on an H200, the same again in each of 8–16 workers
(docs/PERFORMANCE.md). On a suite run with ``-n``, the controller starts one more process as
early as pytest lets a plugin act (before conftests load, before the controller imports torch
itself): the *zygote*, which imports the installed libraries every worker imports (:data:`WARM`)
and nothing else. xdist's ``popen`` gateways then start the *launcher* (this file run as a
script) instead of Python; the launcher hands its stdin, stdout and stderr to the zygote, which
forks a child that becomes the Python xdist asked for — ``python -u -c CODE`` in the launcher's
working directory and environment — while the launcher waits and exits with the child's status.

What the child shares with the zygote and a new Python would not: the modules of :data:`WARM`
(imported, never used: no torch op, no CUDA, no thread has run in the zygote) and the hash seed.
Nothing of kvconform and no pytest plugin is imported there, so pytest loads and rewrites those in
each worker as before. A worker is started as a new Python instead (the launcher runs Python
itself) when the zygote cannot fork it the same: an environment variable read while those
libraries import differs, the command is not ``[-u] [-B] -c CODE``, or the zygote is gone.
``--kvc-fresh-workers`` turns forking off.

The zygote is kvconform's one fork server: the own tests start theirs with the modules a suite run
imports (``Zygote(warm=…)``) and fork each ``python -m MODULE`` they run from it (:func:`fork`,
tests/fork_server.py), each child in its own process group so that a command past its time is
killed with what it started. Protocol on the Unix socket: the client sends one byte with its
stdin, stdout and stderr attached, then one JSON line ``{"argv", "cwd", "env", "own_group"}``; the
zygote answers :data:`FRESH`, or the child's pid and then its exit status, one line each.

This module is also the zygote's and the launcher's program, so it imports only the standard library.
"""

from __future__ import annotations

import builtins
import faulthandler
import io
import json
import os
import runpy
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import traceback
import types
import warnings
from collections.abc import Mapping, Sequence

WARM = ("torch", "numpy")
# Read by the interpreter or by an installed library while it is imported: a command whose value
# differs from the zygote's is started as a new Python.
IMPORT_TIME_ENV = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS", "CUDA", "HIP_", "ROCR_", "HSA_", "LD_", "KMP_", "GOMP_",
                   "HYPOTHESIS")
# Python's own variables that the child applies itself (sys.path, bytecode, buffering, faulthandler).
APPLIED_PYTHON_ENV = {"PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER"}
FLAGS = {"-u", "-B"}  # what execnet's popen gateway passes before ``-c``
RUNS = ("-c", "-m")  # what the child can run: code, or a module as ``python -m`` runs it
FRESH = "fresh"  # the zygote's answer when it cannot fork the request
LISTENING = "listening"  # the zygote's one line on stdout once launchers can reach it
# The zygote prints that line before it imports anything; a zygote silent this long is stuck, and
# the workers start as new Pythons instead of waiting on it.
LISTEN_TIMEOUT_S = 30.0


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME_ENV) and k not in APPLIED_PYTHON_ENV}


def forkable(argv: list[str]) -> bool:
    """``[-u] [-B] -c CODE [ARG …]`` or ``[-u] [-B] -m MODULE [ARG …]``: the command lines the child can become."""
    at = next((i for i, arg in enumerate(argv) if arg in RUNS), None)
    return at is not None and set(argv[:at]) <= FLAGS and len(argv) > at + 1


# ----------------------------------------------------------------------------- controller side
class Zygote:
    """The starter's handle: the zygote process and the gateway spec that reaches it."""

    def __init__(self, warm: Sequence[str] = WARM):
        """``warm``: the modules the zygote imports (after it listens), each a name of an installed module."""
        # An abstract socket (Linux): no file to clean up, no path-length limit.
        self.address = f"\0kvconform-zygote-{os.getpid()}-{os.urandom(6).hex()}"
        self.proc = subprocess.Popen([sys.executable, "-c", "import runpy, sys; del sys.argv[0]; runpy.run_path(sys.argv[0], run_name='__main__')",
                                      __file__, "serve", self.address.encode().hex(), str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:  # on stdin: a list of a whole suite run's modules is longer than a command line may be
            self.proc.stdin.write(json.dumps(list(warm)).encode())
            self.proc.stdin.close()
        except OSError:  # it has ended already: listening() says so
            pass
        self._listening: bool | None = None

    def listening(self) -> bool:
        """Has the zygote bound its socket (it does so first, in milliseconds), so that a launcher
        reaches it? False when it failed to start or stayed silent (then it is ended)."""
        if self._listening is None:
            with selectors.DefaultSelector() as selector:
                selector.register(self.proc.stdout, selectors.EVENT_READ)
                spoke = selector.select(LISTEN_TIMEOUT_S)
            self._listening = bool(spoke) and self.proc.stdout.readline() == f"{LISTENING}\n".encode()
            self.proc.stdout.close()
            if not self._listening:
                self.proc.kill()
                self.proc.wait()
        return self._listening

    def python(self) -> str:
        """The ``python=`` value of an execnet spec: the launcher, run by this Python."""
        return shlex.join([sys.executable, "-I", "-S", __file__, "launch", self.address.encode().hex()])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # the zygote alone: by unconfigure xdist has ended every worker
            self.proc.wait()


def wanted(early_config) -> bool:
    """Can this ``-n`` pytest fork its xdist workers: the controller (not a worker) on Linux, not
    ``--kvc-fresh-workers``, not a run that only collects, not measured by coverage.py's
    subprocess hook (it starts as each Python starts: a forked worker would miss it)."""
    ns = early_config.known_args_namespace
    return (sys.platform == "linux" and "PYTEST_XDIST_WORKER" not in os.environ
            and "COVERAGE_PROCESS_START" not in os.environ
            and not getattr(ns, "kvc_fresh_workers", False) and not getattr(ns, "collectonly", False))


def use(config, zygote: Zygote) -> int:
    """Start xdist's plain ``popen`` workers through the zygote; returns how many."""
    if not zygote.listening():
        return 0
    specs = list(getattr(config.option, "tx", None) or [])
    forked = [i for i, spec in enumerate(specs) if spec == "popen"]
    for i in forked:
        specs[i] = f"popen//python={zygote.python()}"
    config.option.tx = specs
    return len(forked)


# ----------------------------------------------------------------------------- the zygote
def serve(address: str, starter: int) -> None:
    """Listen first (launchers queue until the imports are done), import the modules named on
    stdin, then fork a child per request until the starter (pid ``starter``) has ended and every
    child with it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the controller's to handle; it stops this process
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(128)
    print(LISTENING, flush=True)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # the controller reads that one line; a worker's stdout is its launcher's
    os.close(devnull)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in json.load(sys.stdin):
            try:
                __import__(name)
            except BaseException:  # noqa: BLE001 - not installed, or imports only in context: each child imports it itself
                pass
    own_env = import_time_env(os.environ)
    own_path = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own_path]  # after '' and PYTHONPATH
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    # The starter's pid comes from it, not from getppid() after the imports: a starter that died
    # during them (a backend aborting at import) has left this process reparented by then, and
    # a zygote comparing against its new parent would live on, holding the starter's stderr.
    while os.getppid() == starter or children:
        for key, _ in selector.select(timeout=0.1):
            if key.fileobj is listener:
                conn, _ = listener.accept()
                pid = _fork_request(conn, own_env, base_path, [listener, selector, *children.values()])
                if pid is None:
                    conn.close()
                    continue
                children[pid] = conn
                selector.register(conn, selectors.EVENT_READ, pid)
            else:  # the launcher (or client) ended before its child: as when xdist kills a worker, the child goes too
                _signal(key.data, signal.SIGKILL)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            ended = children.pop(pid, None)
            if ended is not None:
                selector.unregister(ended)
                try:
                    ended.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:
                    pass
                ended.close()


def _fork_request(conn: socket.socket, own_env: dict, base_path: list[str], held: list) -> int | None:
    """Read one launcher's request; fork its child and answer the child's pid, or answer FRESH.
    ``held``: the zygote's sockets, closed in the child (a launcher whose zygote is gone must see
    the end of its socket, not wait on a copy in some other worker)."""
    try:
        _, fds, _, _ = socket.recv_fds(conn, 1, 3)
        with conn.makefile("rb") as lines:
            request = json.loads(lines.readline())
    except (OSError, ValueError):
        return None
    if len(fds) != 3 or not forkable(request["argv"]) or import_time_env(request["env"]) != own_env:
        for fd in fds:
            os.close(fd)
        conn.sendall(f"{FRESH}\n".encode())
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for thing in (*held, conn):
            thing.close()
        _become(request, fds, base_path)
    for fd in fds:
        os.close(fd)
    if request.get("own_group"):
        try:
            os.setpgid(pid, pid)  # here too, so that the group exists before the client may kill it
        except OSError:  # the child did it first, or has ended
            pass
    conn.sendall(f"{pid}\n".encode())
    return pid


def _become(request: dict, fds: list[int], base_path: list[str]) -> None:
    """In the forked child: be ``python [-u] [-B] -c CODE ARGS`` or ``python [-u] [-B] -m MODULE
    ARGS`` as the client asked, and end as that Python ends (SystemExit unwinds out of the zygote's
    loop; the interpreter's exit waits for threads, runs atexit handlers and flushes, as in a new
    Python); never returns."""
    if request.get("own_group"):
        os.setpgid(0, 0)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets them up
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    argv = request["argv"]
    at = next(i for i, arg in enumerate(argv) if arg in RUNS)
    flags, run, target, args = set(argv[:at]), argv[at], argv[at + 1], argv[at + 2:]
    unbuffered = "-u" in flags or bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.dont_write_bytecode = "-B" in flags or bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.stdin, sys.stdout, sys.stderr = _stream(0, "r", False), _stream(1, "w", unbuffered), _stream(2, "w", True)
    # typeshed declares these Final; a fresh interpreter's are its standard streams, so the forked one's must be.
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]
    if os.environ.get("PYTHONFAULTHANDLER"):
        faulthandler.enable()
    else:
        faulthandler.disable()
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # What Python puts first: "" for -c, the working directory for -m.
    sys.path[:] = ["" if run == "-c" else os.getcwd(), *(os.path.abspath(p) for p in extra), *base_path]
    sys.path_importer_cache.clear()
    try:
        if run == "-c":
            sys.argv = ["-c", *args]
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = builtins
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
        else:
            sys.argv = ["-m", *args]  # run_module makes the first the module's file
            runpy.run_module(target, run_name="__main__", alter_sys=True)
    except SystemExit:
        raise
    except BaseException:  # noqa: BLE001 - as an uncaught exception ends Python
        traceback.print_exc()
        raise SystemExit(1) from None
    raise SystemExit(0)


def _stream(fd: int, mode: str, write_through: bool):
    """A standard stream on ``fd`` as Python makes it (the zygote's encoding, which the environment decides)."""
    like = sys.stdin if mode == "r" else sys.stdout
    raw = io.FileIO(fd, mode, closefd=False)
    binary = io.BufferedReader(raw) if mode == "r" else io.BufferedWriter(raw)
    encoding, errors = (like.encoding, like.errors) if like is not None else ("utf-8", "strict")
    if fd == 2:
        errors = "backslashreplace"
    return io.TextIOWrapper(binary, encoding=encoding, errors=errors, line_buffering=fd == 2 or (mode == "w" and os.isatty(fd)),
                            write_through=write_through)


# ----------------------------------------------------------------------------- a client
class Forked:
    """A command the zygote forked: its pid, and its exit status once it ends."""

    def __init__(self, conn: socket.socket, answers: io.BufferedReader, pid: int):
        self.conn, self.answers, self.pid = conn, answers, pid

    def wait(self, timeout: float | None = None) -> int:
        """The child's exit status (``-N``: ended by signal N); TimeoutError past ``timeout`` seconds."""
        self.conn.settimeout(timeout)
        status = self.answers.readline().decode().strip()
        return int(status) if status else 1

    def close(self) -> None:
        """Let go of it: a child still running is killed by the zygote."""
        self.answers.close()
        self.conn.close()


def fork(address: str, argv: list[str], fds: Sequence[int], *, cwd: str, env: Mapping[str, str], own_group: bool = False) -> Forked | None:
    """Ask the zygote at ``address`` to fork ``python ARGV`` with ``fds`` as its stdin, stdout and
    stderr; None when it cannot (it is gone, or answered FRESH): then start a new Python."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(address)
        socket.send_fds(conn, [b"\0"], list(fds))
        conn.sendall((json.dumps({"argv": list(argv), "cwd": cwd, "env": dict(env), "own_group": own_group}) + "\n").encode())
        answers = conn.makefile("rb")
        answer = answers.readline().decode().strip()
    except OSError:
        answer = FRESH
    if answer == FRESH or not answer:
        conn.close()
        return None
    return Forked(conn, answers, int(answer))


# ----------------------------------------------------------------------------- the launcher
def launch(address: str, argv: list[str]) -> None:
    """What xdist starts instead of Python: hand stdin, stdout, stderr and the command to the
    zygote and exit as its child does; run Python itself when the zygote cannot fork it."""
    child = fork(address, argv, [0, 1, 2], cwd=os.getcwd(), env=os.environ)
    if child is None:
        os.execv(sys.executable, [sys.executable, *argv])
    # SIGINT from a terminal reaches the child itself (same process group); xdist's SIGTERM is passed on.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: _signal(child.pid, signal.SIGTERM))
    code = child.wait()
    if code < 0:  # ended by a signal: so does the launcher, for whoever waits on it
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # those two have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    role, address, *rest = sys.argv[1:]
    address = bytes.fromhex(address).decode()
    if role == "serve":
        serve(address, int(rest[0]))
    else:
        launch(address, rest)
