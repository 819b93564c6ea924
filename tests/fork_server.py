"""``python -m MODULE ARGS`` without paying Python's start-up each time, for kvconform's own tests.

Most of the own tests start the suite as a subprocess, a few hundred times per run, and each
such Python spent ~4 s of CPU importing torch and the rest before its first line of kvconform
(measured on the 2-core CI machine: a one-family suite run took 6.8 s, 1.5 s of it inside
pytest's session). Here each test process starts the plugin's fork server
(``kvconform.conformance.plugin.forked_workers.Zygote``, the one that forks xdist workers) with
the installed modules a suite run imports (tests/suite_imports.py) and *forks* each command from
it. A forked command is made to be the Python it stands for: its working directory, exactly its
environment, ``sys.path`` as ``python -m`` builds it there (the directory, then ``PYTHONPATH``),
``sys.argv``, its own process group, stdout and stderr to their own files; nothing of the checkout
(kvconform, the tests, conftests) is imported before the fork, only installed packages, so every
run imports kvconform anew.

What is not the same, and why it does not matter here: the hash seed is the server's (a check
for hash-order independence must start real processes: ``run(..., fresh=True)``); environment
variables that installed packages read while they are imported (torch's, OpenMP's, Python's own)
must equal the server's, else the command runs in a real subprocess (the server answers so).
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from kvconform.conformance.plugin import forked_workers

ROOT = Path(__file__).resolve().parents[1]
# Triton: kvconform sets TRITON_INTERPRET on a CPU before importing it, and Triton's own kernels
# are made compiled or interpreted as it is imported.
FRESH = ["kvconform", "tests", "triton"]

_server: forked_workers.Zygote | None = None
_server_pid = 0


def start(probe: list[str]) -> forked_workers.Zygote:
    """A fork server that has imported what a suite run with the ``probe`` arguments imports."""
    listed = subprocess.run([sys.executable, str(ROOT / "tests" / "suite_imports.py"), json.dumps(probe), json.dumps(FRESH)],
                            cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    server = forked_workers.Zygote(warm=json.loads(listed.stdout or "[]"))
    atexit.register(server.stop)
    return server


def run(cmd: list[str], *, cwd=None, env: dict | None = None, timeout: float | None = None, fresh: bool = False,
        probe: list[str] = ("-m", "shape")) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, ...)``, forked from this process's
    server when ``cmd`` can be (else, or with ``fresh``, a real subprocess)."""
    global _server, _server_pid
    env = dict(os.environ if env is None else env)
    # Another interpreter's command (a venv's python is often a link to this one's binary: not realpath) runs there.
    if not fresh and sys.platform == "linux" and len(cmd) > 1 and os.path.abspath(cmd[0]) == os.path.abspath(sys.executable):
        if _server is None or _server_pid != os.getpid():
            _server, _server_pid = start(list(probe)), os.getpid()
        if _server.listening():
            done = _forked(_server, cmd, os.path.abspath(cwd or os.getcwd()), env, timeout)
            if done is not None:
                return done
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _forked(server: forked_workers.Zygote, cmd: list[str], cwd: str, env: dict, timeout: float | None) -> subprocess.CompletedProcess | None:
    """``cmd`` forked from ``server``, its output read from files; None when the server cannot fork it."""
    with tempfile.TemporaryDirectory(prefix="kvc-fork-run-") as scratch:
        out, err = os.path.join(scratch, "stdout"), os.path.join(scratch, "stderr")
        fds = [os.open(os.devnull, os.O_RDONLY), *(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600) for path in (out, err))]
        try:
            child = forked_workers.fork(server.address, cmd[1:], fds, cwd=cwd, env=env, own_group=True)
        finally:
            for fd in fds:
                os.close(fd)
        if child is None:
            return None
        try:
            code = child.wait(timeout)
        except TimeoutError:
            os.killpg(child.pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(cmd, timeout, _read(out), _read(err)) from None
        finally:
            child.close()
        return subprocess.CompletedProcess(cmd, code, _read(out), _read(err))


def _read(path: str) -> str:
    try:
        with open(path) as f:  # as subprocess's text mode: the locale's encoding, universal newlines
            return f.read()
    except FileNotFoundError:
        return ""
