"""xdist workers forked from a zygote (conformance/plugin/forked_workers.py): the child is the
Python xdist asked for, ends as it ends, and a worker the zygote cannot fork the same is a new
Python. A suite run reaches the same verdict either way."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from kvconform.conformance.plugin import forked_workers

from .suite_runs import run_suite

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="workers are forked on Linux only")

# What a worker can see of how it was started, printed as JSON.
PROBE = """
import json, os, sys
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": os.environ.get("KVC_PROBE"), "path0": sys.path[0],
                  "main": __name__, "no_bytecode": sys.dont_write_bytecode, "torch_before": "torch" in sys.modules,
                  "parent": open(f"/proc/{os.getppid()}/cmdline").read().split(chr(0))[:6]}))
"""


@pytest.fixture(scope="module")
def zygote():
    started = forked_workers.Zygote()
    assert started.listening()
    yield started
    started.stop()


def launch(zygote, *args: str, cwd, env: dict | None = None, **kwargs) -> subprocess.Popen:
    """As execnet's popen gateway starts a worker whose ``python=`` is the zygote's launcher."""
    return subprocess.Popen([*shlex.split(zygote.python()), *args], cwd=cwd, env={**os.environ, **(env or {})},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def probe(command: list[str], cwd, env: dict) -> dict:
    done = subprocess.run(command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_forked_worker_sees_what_a_new_python_would_see(zygote, tmp_path):
    args = ["-u", "-B", "-c", PROBE, "first", "second"]
    forked = probe([*shlex.split(zygote.python()), *args], tmp_path, {"KVC_PROBE": "here"})
    fresh = probe([sys.executable, *args], tmp_path, {"KVC_PROBE": "here"})
    assert "serve" in forked.pop("parent") and "serve" not in fresh.pop("parent")  # forked from the zygote
    assert forked.pop("torch_before") is True and fresh.pop("torch_before") is False
    assert forked == fresh == {"argv": ["-c", "first", "second"], "cwd": str(tmp_path), "env": "here", "path0": "",
                               "main": "__main__", "no_bytecode": True}


def test_a_worker_whose_import_time_environment_differs_is_a_new_python(zygote, tmp_path):
    threads = os.environ.get("OMP_NUM_THREADS", "1") + "7"  # read by torch's OpenMP as it loads
    seen = probe([*shlex.split(zygote.python()), "-u", "-c", PROBE], tmp_path, {"OMP_NUM_THREADS": threads})
    assert "launch" not in seen["parent"] and "serve" not in seen["parent"] and seen["torch_before"] is False


def test_a_command_line_the_child_cannot_become_is_run_by_a_new_python(zygote, tmp_path):
    seen = probe([*shlex.split(zygote.python()), "-E", "-c", PROBE], tmp_path, {})
    assert "serve" not in seen["parent"] and seen["torch_before"] is False


@pytest.mark.parametrize("code, expected", [("raise SystemExit(7)", 7), ("raise ValueError('boom')", 1),
                                            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", -signal.SIGKILL)])
def test_the_launcher_ends_as_its_child_ended(zygote, tmp_path, code, expected):
    proc = launch(zygote, "-u", "-c", code, cwd=tmp_path)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == expected, err
    assert ("ValueError: boom" in err) == (expected == 1)


def test_a_killed_launcher_takes_its_forked_worker_along(zygote, tmp_path):
    pid_file = tmp_path / "pid"
    proc = launch(zygote, "-u", "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)", cwd=tmp_path)
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert child != proc.pid  # forked by the zygote, not the launcher itself
    proc.send_signal(signal.SIGKILL)  # as execnet kills a gateway that does not stop
    proc.wait()
    while os.path.exists(f"/proc/{child}") and "Z" not in _state(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{child}") or "Z" in _state(child)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


def test_a_zygote_whose_starter_died_during_its_imports_ends(tmp_path):
    """A backend aborting at import kills the controller while the zygote still imports torch; the
    zygote must end then, not live on holding the run's stderr (`kvconform run` waited on it)."""
    (tmp_path / "slow_to_import.py").write_text("import time\ntime.sleep(3)\n")
    starter = ("import os; from kvconform.conformance.plugin import forked_workers as f; "
               "z = f.Zygote(warm=['slow_to_import']); assert z.listening(); print(z.proc.pid, flush=True); os._exit(0)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", starter], env=env, capture_output=True, text=True, timeout=60)
    zygote = int(done.stdout.split()[0])
    deadline = time.monotonic() + 30
    while os.path.exists(f"/proc/{zygote}") and "Z" not in _state(zygote) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{zygote}") or "Z" in _state(zygote)


def test_a_silent_zygote_is_given_up_within_the_bound_and_ended(tmp_path, monkeypatch):
    stuck = tmp_path / "python"
    stuck.write_text("#!/bin/sh\nexec sleep 600\n")  # a zygote that never prints its line
    stuck.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stuck))
    monkeypatch.setattr(forked_workers, "LISTEN_TIMEOUT_S", 0.5)
    silent = forked_workers.Zygote()
    started = time.monotonic()
    assert silent.listening() is False
    assert time.monotonic() - started < 10 and silent.proc.poll() is not None


def test_an_xdist_suite_run_forks_its_workers_and_reaches_the_verdict_of_new_pythons(tmp_path):
    outcomes = {}
    for name, extra in (("forked", []), ("fresh", ["--kvc-fresh-workers"])):
        result = run_suite(tmp_path / name, "-n", "2", "-m", "shape", "--kvc-backend", "reference,mutant:kv_first_shape_declared_blocks_first", *extra)
        assert result.returncode == 1, result.output  # the mutant fails
        assert ("workers forked from" in result.proc.stdout) == (name == "forked"), result.output
        outcomes[name] = sorted((r["nodeid"], r["outcome"]) for r in result.records)
    assert outcomes["forked"] == outcomes["fresh"] and {"failed", "passed"} <= {o for _, o in outcomes["forked"]}


def test_a_killed_controller_leaves_no_zygote_or_worker_behind(tmp_path):
    """Vendor CI kills a job that runs too long: nothing of the run may keep holding a GPU."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "kvconform.conformance", "-n", "2", "-p", "no:cacheprovider", "-q",
           "--kvc-json", str(tmp_path / "results.json")]
    controller = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while len(_session(controller.pid)) < 6 and time.monotonic() < deadline:  # controller, zygote, 2 launchers, 2 workers
        time.sleep(0.1)
    assert len(_session(controller.pid)) >= 6, _session(controller.pid)
    controller.kill()
    controller.wait()
    while _session(controller.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _session(controller.pid) == []


def _session(sid: int) -> list[str]:
    """The live processes of session ``sid``, by command line."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, _, _, session = f.read().rsplit(")", 1)[1].split()[:4]
            if state != "Z" and int(session) == sid:
                with open(f"/proc/{entry}/cmdline") as f:
                    found.append(f.read().replace("\0", " ")[:120])
        except (OSError, ValueError):  # not a process, or one that has just ended
            pass
    return found
