"""The suite as a subprocess, for kvconform's own tests: one helper, one command builder
(``kvconform.conformance.plugin.collection.suite_command``), results read back from its JSON."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

from kvconform.conformance.plugin.collection import suite_command

from . import fork_server

ROOT = Path(__file__).resolve().parents[1]
# A -k expression for the K/V checks alone: the latent and per-token-head modules' checks are not
# applicable to a K/V-only backend, which would add that outcome to every family's set.
KV_CHECKS = "not test_latent_ and not test_quant_"


@dataclasses.dataclass
class SuiteResult:
    proc: subprocess.CompletedProcess
    document: dict | None  # the results JSON, None when the run wrote none

    @property
    def returncode(self) -> int:
        return self.proc.returncode

    @property
    def records(self) -> list[dict]:
        assert self.document is not None, f"suite wrote no results (exit {self.returncode}):\n{self.output}"
        return self.document["tests"]

    @property
    def output(self) -> str:
        return f"{self.proc.stdout[-3000:]}\n{self.proc.stderr[-3000:]}"

    def outcomes(self, backend: str, family: str | None = None) -> set[str]:
        return {r["outcome"] for r in self.records if r["backend"] == backend and (family is None or r["family"] == family)}


def run_suite(out_dir, *args: str, python: str | None = None, cwd=ROOT, env: dict | None = None, timeout: float = 1200,
              target: str | None = None, fresh: bool = False) -> SuiteResult:
    """``python -m pytest --pyargs kvconform.conformance ARGS --kvc-json OUT_DIR/results.json``
    (``target``: a module or test of the suite instead of all of it), forked from a process that
    imported the installed packages once (tests/fork_server.py; ``fresh``: a new Python)."""
    out = Path(out_dir) / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = suite_command("--kvc-json", str(out), *args, python=python or sys.executable, **({"target": target} if target else {}))
    proc = fork_server.run(cmd, cwd=cwd, env={**os.environ, **(env or {})}, timeout=timeout, fresh=fresh)
    return SuiteResult(proc, json.loads(out.read_text()) if out.exists() else None)


def forked_runs_command(out_dir, runs: dict[str, tuple[list[str], dict]], *, fresh: list[str], probe: list[str] | None = None,
                        python: str | None = None, jobs: int | None = None, timeout: float = 3600) -> list[str]:
    """The command that makes several suite runs (name -> (ARGS, env)) forked from one process that
    imported what they share once (tests/forked_runs.py; its plan is written into ``out_dir``):
    ``fresh``: package prefixes each run imports anew; ``probe``: the arguments of a collection
    that imports what they share; ``jobs``: runs at a time."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plan = {"fresh": fresh, "probe": probe, "jobs": jobs or min(2, os.cpu_count() or 1), "timeout": timeout,
            "runs": [{"name": name, "args": list(args), "env": env, "out": str(out_dir / name)} for name, (args, env) in runs.items()]}
    (out_dir / "plan.json").write_text(json.dumps(plan))
    return [python or sys.executable, "-m", "tests.forked_runs", str(out_dir / "plan.json")]


def forked_runs_results(out_dir, runs, log: str) -> dict[str, SuiteResult]:
    """Each run's results, once that command has ended, as :func:`run_suite` gives them; ``log``:
    what tests.forked_runs printed."""
    results = {}
    for name in runs:
        run = Path(out_dir) / name
        code = int((run / "exit_status").read_text()) if (run / "exit_status").exists() else -1
        output = (run / "output.txt").read_text() if (run / "output.txt").exists() else ""
        done = subprocess.CompletedProcess(["tests.forked_runs", name], code, output, log)
        results[name] = SuiteResult(done, json.loads((run / "results.json").read_text()) if (run / "results.json").exists() else None)
    return results
