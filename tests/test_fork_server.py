"""The own tests' commands forked from the plugin's fork server (tests/fork_server.py) run a ``python -m`` command as that Python
would have run it: its directory, environment, path, arguments, streams and exit status, with
nothing of the checkout imported first; it falls back to a real process where it cannot."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from . import fork_server

REPORTER = '''
import json, os, sys
print(json.dumps({"cwd": os.getcwd(), "env": dict(os.environ), "path": sys.path[:3], "argv": sys.argv, "prefix": sys.prefix,
                  "preloaded": sorted(m for m in ("torch", "triton", "kvconform", "tests", "conftest") if m in sys.modules)}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("EXIT_WITH", "0")))
'''


def command(tmp_path, body: str, *args: str) -> list[str]:
    (tmp_path / "cmd_under_test.py").write_text(body)
    return [sys.executable, "-m", "cmd_under_test", *args]


def test_a_forked_command_has_its_own_directory_environment_path_and_arguments(tmp_path):
    extra = tmp_path / "extra"
    env = {k: v for k, v in os.environ.items() if k != "HOME"} | {"PYTHONPATH": str(extra), "EXIT_WITH": "3"}
    run = fork_server.run(command(tmp_path, REPORTER, "a", "b c"), cwd=tmp_path, env=env, timeout=120)
    seen = json.loads(run.stdout)
    assert run.returncode == 3 and run.stderr == "to stderr\n"
    assert seen["preloaded"] == ["torch"], "torch was imported before the fork; not Triton (kvconform sets its mode first), nothing of the checkout"
    assert seen["cwd"] == str(tmp_path) and seen["env"] == env
    assert seen["path"][:2] == [str(tmp_path), str(extra)]
    assert seen["argv"] == [str(tmp_path / "cmd_under_test.py"), "a", "b c"]


def test_an_uncaught_exception_ends_the_command_with_status_1_and_its_traceback(tmp_path):
    run = fork_server.run(command(tmp_path, "raise ValueError('planted')"), cwd=tmp_path, timeout=120)
    assert run.returncode == 1 and "Traceback" in run.stderr and "ValueError: planted" in run.stderr


def test_a_command_past_its_timeout_is_killed_with_the_processes_it_started(tmp_path):
    body = "import subprocess, sys, time\np = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n" \
           "open('child.pid', 'w').write(str(p.pid))\ntime.sleep(60)\n"
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        fork_server.run(command(tmp_path, body), cwd=tmp_path, timeout=5)
    assert time.monotonic() - began < 30
    grandchild = Path(f"/proc/{(tmp_path / 'child.pid').read_text()}/status")
    time.sleep(0.5)
    assert not grandchild.exists() or "\nState:\tZ" in grandchild.read_text(), "the command's own child outlived it"


def test_a_command_whose_import_time_environment_differs_runs_in_a_new_python(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": str(int(os.environ.get("OMP_NUM_THREADS", "1")) + 1)}
    run = fork_server.run(command(tmp_path, REPORTER), cwd=tmp_path, env=env, timeout=120)
    assert run.returncode == 0 and json.loads(run.stdout)["preloaded"] == []


def test_a_command_of_another_python_environment_runs_in_that_environment(tmp_path):
    """A venv's python is often a link to the same binary as this one's (the vLLM venv of CI is)."""
    venv.create(tmp_path / "other", with_pip=False, symlinks=True)
    run = fork_server.run(command(tmp_path, REPORTER), cwd=tmp_path, timeout=120)
    other = [str(tmp_path / "other" / "bin" / "python"), *run.args[1:]]
    seen = json.loads(fork_server.run(other, cwd=tmp_path, timeout=120).stdout)
    assert seen["prefix"] == str(tmp_path / "other") and seen["preloaded"] == []
