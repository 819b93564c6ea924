"""Suite runs that share one set-up: ``python -m tests.forked_runs PLAN.json``.

A suite run against the real vLLM on the CPU spends about half its CPU time importing: torch,
then vLLM's own dependencies (transformers, sympy, openai, …; profiled with py-spy for #25).
Some runs cannot share a process: each vLLM regression (tests/vllm_cpu/regressions.py) edits
vLLM's source as it is imported, so each needs a pytest session whose vLLM is fresh. Here they
are *forked* from one process that has already imported everything those sessions import
except the packages named fresh (vLLM, kvconform, the tests), instead of each starting Python
from nothing. Each child is a whole pytest session of its own, as if run from the command line
(``pytest --pyargs kvconform.conformance ARGS --kvc-json OUT/results.json`` with its env), and
leaves ``results.json``, ``output.txt`` and ``exit_status`` in its directory.

PLAN.json: ``{"fresh": [package prefixes never imported here], "jobs": N, "timeout": seconds,
"probe": [pytest arguments], "runs": [{"name", "args": [...], "env": {...}, "out": DIR}, ...]}``.
What to import first is found by a probe (tests/suite_imports.py: ``warm_up``): a child that
collects the suite with the ``probe`` arguments (else the first run's; no run's environment).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from tests.suite_imports import warm_up

ROOT = Path(__file__).resolve().parents[1]
SUITE_ARGS = ["--pyargs", "kvconform.conformance", "-p", "no:cacheprovider"]


def _child(run: dict, jobs: int) -> None:
    """In a forked child: one pytest session, as from the command line; never returns."""
    out = Path(run["out"])
    out.mkdir(parents=True, exist_ok=True)
    code = 3
    try:
        log = os.open(out / "output.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.update(run.get("env", {}))
        if jobs > 1:
            import torch

            torch.set_num_threads(1)  # the other children use the other cores
        import pytest

        code = int(pytest.main([*SUITE_ARGS, *run["args"], "--kvc-json", str(out / "results.json")]))
    except BaseException as exc:  # noqa: BLE001 - reported in the run's output
        print(f"forked_runs: {run['name']}: {type(exc).__name__}: {exc}", flush=True)
    finally:
        (out / "exit_status").write_text(str(code))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main() -> int:
    plan = json.loads(Path(sys.argv[1]).read_text())
    fresh, runs, jobs = plan["fresh"], plan["runs"], max(1, int(plan.get("jobs", 1)))
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    start = time.perf_counter()
    probe = {"name": "probe", "args": plan["probe"], "out": runs[0]["out"]} if runs and plan.get("probe") else (runs[0] if runs else None)
    warmed = warm_up([*probe["args"], "--collect-only", "-q"], fresh, Path(probe["out"])) if probe else 0
    print(f"forked_runs: {warmed} modules imported once in {time.perf_counter() - start:.1f} s", flush=True)
    pending, running = list(runs), {}
    deadline = time.monotonic() + float(plan.get("timeout", 3600))
    while pending or running:
        while pending and len(running) < jobs:
            run = pending.pop(0)
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _child(run, jobs)
            running[pid] = (run, time.perf_counter())
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            if time.monotonic() > deadline:
                for late, (run, _) in running.items():
                    os.kill(late, signal.SIGKILL)
                    print(f"forked_runs: {run['name']}: killed at the plan's timeout", flush=True)
                deadline = float("inf")
            time.sleep(0.2)
            continue
        run, began = running.pop(pid)
        print(f"forked_runs: {run['name']}: exit {os.waitstatus_to_exitcode(status)} after {time.perf_counter() - began:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
