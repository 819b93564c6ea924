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

ROOT = Path(__file__).resolve().parents[1]


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
              target: str | None = None) -> SuiteResult:
    """``python -m pytest --pyargs kvconform.conformance ARGS --kvc-json OUT_DIR/results.json``
    (``target``: a module or test of the suite instead of all of it)."""
    out = Path(out_dir) / "results.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = suite_command("--kvc-json", str(out), *args, python=python or sys.executable, **({"target": target} if target else {}))
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})})
    return SuiteResult(proc, json.loads(out.read_text()) if out.exists() else None)
