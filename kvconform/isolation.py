"""``kvconform run``: every backend in its own pytest process, results merged into one report.

Why processes: a backend can abort its process (a segfaulting extension), hang in a kernel that
never returns, or leave a sticky device error that poisons every later call in its CUDA/HIP
context. One process per backend confines all three to that backend's cells. Inside each
process pytest-xdist (``-n 1``) restarts a crashed worker and carries on with the next test,
and ``--kvc-timeout`` ends a hung test (reported ``timeout``). A backend whose process dies
before writing results gets one ``crashed`` record carrying the tail of its stderr.
xdist's own ``--dist loadgroup`` would be lighter, but it raises INTERNALERROR when a worker
restarts (xdist 3.8), so each backend gets its own pytest instead.

Each process runs the installed suite (``--pyargs kvconform.conformance``) in a fresh temporary
directory with an empty ini file: no vendor ``pytest.ini``/``conftest.py`` around the caller's
directory applies, and nothing (``.hypothesis/``, caches) is written into site-packages or the
caller's tree. pytest failing to *start* — a usage error, an internal error — is kvconform's
problem, not the backend's: ``kvconform run`` stops with a harness error naming the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from kvconform.conformance.plugin.collection import suite_command

HARNESS_ERROR = 3  # exit status of `kvconform run` when the suite itself could not start
STARTUP_FAILURES = {2: "interrupted", 3: "internal error", 4: "usage error"}  # pytest exit codes


class HarnessError(RuntimeError):
    """The suite could not be started for a backend (nothing the backend did)."""


def _file_name(backend: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in backend)


def _run_one(backend: str, out_dir: str, timeout: float, pytest_args: list[str]) -> tuple[int, dict]:
    path = os.path.join(out_dir, _file_name(backend) + ".json")
    with tempfile.TemporaryDirectory(prefix="kvconform-run-") as work:
        ini = os.path.join(work, "pytest.ini")
        with open(ini, "w") as fh:
            fh.write("[pytest]\n")
        cmd = suite_command(
            "-c", ini, "-q", "--kvc-backend", backend, "-n", "1", "--max-worker-restart", "1000",
            "--kvc-timeout", str(timeout), "--kvc-json", path, "--kvc-html", os.path.join(out_dir, _file_name(backend) + ".html"),
            *pytest_args,
        )
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return proc.returncode, json.load(fh)
    tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
    if proc.returncode in STARTUP_FAILURES:
        raise HarnessError(f"the suite could not start for backend {backend}: pytest exited {proc.returncode} "
                           f"({STARTUP_FAILURES[proc.returncode]}):\n{tail}\ncommand: {' '.join(cmd)}")
    from kvconform.reports.results import SCHEMA

    record = {"nodeid": f"conformance::{backend}", "backend": backend, "platform": "?", "arch": "", "family": "other",
              "check": "backend process", "outcome": "crashed", "message": f"pytest exited {proc.returncode} without results:\n{tail}",
              "failure": None, "duration_s": 0.0}
    crashed = {"complete": False, "reasons": [{"kind": "crashed", "what": f"the suite process for {backend} exited {proc.returncode} without results"}]}
    return proc.returncode, {"schema": SCHEMA, "environment": {"device": "?", "device_name": "?", "backends": {backend: {}}},
                             "completion": crashed, "tests": [record]}


def run(backends: list[str], pytest_args: list[str], out_dir: str, timeout: float, jobs: int) -> int:
    """Run each backend in its own process; write merged JSON + HTML; print the matrix."""
    from kvconform.reports.cli import merged_document
    from kvconform.reports.html import render_runs
    from kvconform.reports.results import write_atomically
    from kvconform.reports.terminal import render

    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            outcomes = list(pool.map(lambda b: _run_one(b, out_dir, timeout, pytest_args), backends))
    except HarnessError as exc:
        print(f"kvconform run: HARNESS ERROR: {exc}", file=sys.stderr)
        return HARNESS_ERROR
    documents = [document for _, document in outcomes]
    json_path, html_path = os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.html")
    write_atomically(json_path, json.dumps(merged_document(documents), indent=1, default=str))
    write_atomically(html_path, render_runs(documents))
    print(render(documents, color=sys.stdout.isatty()))
    print(f"kvconform: results {json_path}\nkvconform: HTML report {html_path}")
    return 0 if all(code in (0, 5) for code, _ in outcomes) else 1
