"""``python -m MODULE ARGS`` without paying Python's start-up each time, for kvconform's own tests.

Most of the own tests start the suite as a subprocess, a few hundred times per run, and each
such Python spent ~4 s of CPU importing torch and the rest before its first line of kvconform
(measured on the 2-core CI machine: a one-family suite run took 6.8 s, 1.5 s of it inside
pytest's session). Here one server process per test process imports those once and *forks*
each command from itself. A forked command is made to be the Python it stands for: its working
directory, exactly its environment, ``sys.path`` as ``python -m`` builds it there (the directory,
then ``PYTHONPATH``), ``sys.argv``, its own process group, stdout and stderr to their own files;
nothing of the checkout (kvconform, the tests, conftests) is imported before the fork, only
installed packages, so every run imports kvconform anew.

What is not the same, and why it does not matter here: the hash seed is the server's (a check
for hash-order independence must start real processes: ``run(..., fresh=True)``); environment
variables that installed packages read while they are imported (torch's, OpenMP's, Python's own)
must equal the server's, else the command falls back to a real subprocess (``Server.forkable``).

Server: ``python tests/fork_server.py SOCKET PROBE_ARGS_JSON`` (a script, not ``-m tests.…``, so
that the ``tests`` package is not imported before a fork). Protocol on the Unix socket: the
client sends one JSON line ``{"argv", "cwd", "env", "stdout", "stderr"}``; the server answers the
child's pid, then its exit status, one line each.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
import warnings
from pathlib import Path

# Read by the interpreter or by an installed package while it is imported: a command whose value
# differs from the server's cannot be forked from it.
IMPORT_TIME_ENV = ("PYTHON", "TORCH", "PYTORCH", "OMP_", "MKL_", "OPENBLAS", "CUDA", "LD_", "HYPOTHESIS")
MAIN = {"__main__", "__mp_main__"}
FORKABLE_PYTHON_ENV = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONFAULTHANDLER"}


def installed(module) -> bool:
    """Not a file outside the interpreter's installation (the checkout, a cwd): built-in modules
    and the module objects packages make up (``torch.ops``, whose ``__file__`` is a bare name)
    count as installed."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not os.path.isabs(file):
        return True
    roots = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return os.path.realpath(file).startswith(tuple(roots))


def warm_up(probe: list[str], fresh: list[str], scratch: Path) -> int:
    """Import here every installed module (none under a ``fresh`` prefix, no pytest plugin) that a
    suite run with the ``probe`` pytest arguments imports, found by running it in a forked child;
    returns how many."""
    # pytest plugins are left for pytest to import (and assertion-rewrite), unless a module
    # warmed up here imports one itself (openai imports anyio): then the run has it already.
    skipped = (*fresh, *pytest_plugin_modules())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            pytest.main(["--pyargs", "kvconform.conformance", "-p", "no:cacheprovider", *probe,
                         "--kvc-json", str(scratch / "probe" / "results.json")])
            names = [name for name, module in list(sys.modules.items())
                     if module is not None and installed(module) and not name.startswith(skipped) and name not in MAIN]
            os.write(write, json.dumps(names).encode())
        except BaseException:  # noqa: BLE001 - the parent then warms up nothing
            code = 1
        finally:
            os.close(write)
            os._exit(code)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 20):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    names = json.loads(data or b"[]")
    before = set(sys.modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001 - a module that only imports in context: its run imports it
                    pass
    leaked = [name for name in set(sys.modules) - before - MAIN
              if name.startswith(tuple(fresh)) or (sys.modules[name] is not None and not installed(sys.modules[name]))]
    if leaked:
        raise RuntimeError(f"fork_server: warming up imported {sorted(leaked)[:5]}, which each run must import anew")
    return len(names)


def pytest_plugin_modules() -> list[str]:
    """The top-level modules of every distribution that plugs into pytest: pytest rewrites their
    assertions as it loads them, so a run must import them itself."""
    from importlib import metadata

    names = set()
    for entry in metadata.entry_points(group="pytest11"):
        names.add(entry.value.split(".")[0].split(":")[0])
        for file in (entry.dist.files or []) if entry.dist else []:
            top = file.parts[0]
            if not top.endswith((".dist-info", ".egg-info", ".pth")) and top not in ("..", "__pycache__"):
                names.add(top.removesuffix(".py"))
    return sorted(names)


def _become(request: dict, base_path: list[str]) -> None:
    """In the forked child: be ``python -m MODULE ARGS`` as the request describes; never returns."""
    code = 1
    try:
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = [os.getcwd(), *(os.path.abspath(p) for p in extra), *base_path]
        sys.path_importer_cache.clear()
        _, dash_m, module, *args = request["argv"]
        sys.argv = [dash_m, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - as an uncaught exception ends Python
            traceback.print_exc()
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed stream has nothing left to say
                pass
        os._exit(code)


def serve(path: str, probe: list[str]) -> None:
    """Accept commands until the client's process ends; each one forked from here."""
    # What python -m puts first (its directory, then PYTHONPATH) is the command's, not the server's.
    own = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if os.path.abspath(p) not in own]
    with tempfile.TemporaryDirectory(prefix="kvc-fork-server-") as scratch:
        # Triton: kvconform sets TRITON_INTERPRET on a CPU before importing it, and Triton's own
        # kernels are made compiled or interpreted as it is imported.
        warm_up(probe, ["kvconform", "tests", "triton"], Path(scratch))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    parent = os.getppid()
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while os.getppid() == parent:
        for _ in selector.select(timeout=0.05):
            conn, _ = listener.accept()
            with conn.makefile("r") as lines:
                request = json.loads(lines.readline())
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                listener.close()
                conn.close()
                _become(request, base_path)
            try:
                os.setpgid(pid, pid)  # here too, so that the group exists before the client may kill it
            except OSError:  # the child did it first, or has ended
                pass
            conn.sendall(f"{pid}\n".encode())
            waiting[pid] = conn
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            conn = waiting.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:  # the client gave up on it (timeout)
                    pass
                conn.close()


class Server:
    """The client's handle on its server process (one per process that runs commands)."""

    def __init__(self, probe: list[str]):
        self.dir = tempfile.mkdtemp(prefix="kvc-fork-")
        self.socket = os.path.join(self.dir, "socket")
        root = Path(__file__).resolve().parents[1]
        self.proc = subprocess.Popen([sys.executable, __file__, self.socket, json.dumps(probe)], cwd=root,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
        self.ready = self.proc.stdout.readline().strip() == "ready"
        self.env = dict(os.environ)
        atexit.register(self.close)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def forkable(self, cmd: list[str], env: dict) -> bool:
        """A ``python -m`` of this interpreter whose import-time environment is the server's."""
        if not self.ready or self.proc.poll() is not None or len(cmd) < 3 or cmd[1] != "-m":
            return False
        if os.path.abspath(cmd[0]) != os.path.abspath(sys.executable):  # not realpath: venvs share one binary
            return False
        keys = {k for k in set(env) | set(self.env) if k.startswith(IMPORT_TIME_ENV) and k not in FORKABLE_PYTHON_ENV}
        return all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, cmd: list[str], cwd, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
        """As ``subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)``."""
        with tempfile.TemporaryDirectory(prefix="kvc-fork-run-") as scratch:
            out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.connect(self.socket)
                conn.sendall((json.dumps({"argv": list(cmd), "cwd": os.path.abspath(cwd or os.getcwd()), "env": env,
                                          "stdout": out, "stderr": err}) + "\n").encode())
                lines = conn.makefile("r")
                pid = int(lines.readline())
                conn.settimeout(timeout)
                try:
                    code = int(lines.readline())
                except (TimeoutError, socket.timeout):
                    os.killpg(pid, signal.SIGKILL)
                    raise subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err)) from None

            return subprocess.CompletedProcess(cmd, code, _read(out), _read(err))


def _read(path: str) -> str:
    try:
        with open(path) as f:  # as subprocess's text mode: the locale's encoding, universal newlines
            return f.read()
    except FileNotFoundError:
        return ""


_server: Server | None = None
_server_pid = 0


def run(cmd: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None, fresh: bool = False,
        probe: list[str] = ("-m", "shape")) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)``, forked from this process's
    server when ``cmd`` can be (else, or with ``fresh``, a real subprocess)."""
    global _server, _server_pid
    env = dict(os.environ if env is None else env)
    if not fresh and hasattr(os, "fork"):
        if _server is None or _server_pid != os.getpid():
            _server, _server_pid = Server(list(probe)), os.getpid()
        if _server.forkable(cmd, env):
            return _server.run(cmd, cwd, env, timeout)
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


if __name__ == "__main__":
    serve(sys.argv[1], json.loads(sys.argv[2]))
