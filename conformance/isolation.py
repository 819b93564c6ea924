"""``kvconform run``: every backend in its own pytest process, results merged into one report.

Why processes: a backend can abort its process (a segfaulting extension), hang in a kernel that
never returns, or leave a sticky device error that poisons every later call in its CUDA/HIP
context. One process per backend confines all three to that backend's cells. Inside each
process pytest-xdist (``-n 1``) restarts a crashed worker and carries on with the next test,
and ``--kvc-timeout`` ends a hung test (reported ``timeout``). A backend whose process dies
before writing results gets one ``crashed`` record carrying the tail of its stderr.
xdist's own ``--dist loadgroup`` would be lighter, but it raises INTERNALERROR when a worker
restarts (xdist 3.8), so each backend gets its own pytest instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _file_name(backend: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in backend)


def _run_one(backend: str, out_dir: str, timeout: float, pytest_args: list[str]) -> tuple[int, dict]:
    path = os.path.join(out_dir, _file_name(backend) + ".json")
    cmd = [
        sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", "-q",
        "--backend", backend, "-n", "1", "--max-worker-restart", "1000", "--kvc-timeout", str(timeout),
        "--kvc-json", path, "--kvc-html", os.path.join(out_dir, _file_name(backend) + ".html"), *pytest_args,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return proc.returncode, json.load(fh)
    from reports.results import SCHEMA

    tail = (proc.stderr or proc.stdout)[-2000:]
    record = {"nodeid": f"conformance::{backend}", "backend": backend, "platform": "?", "arch": "", "family": "other",
              "check": "backend process", "outcome": "crashed", "message": f"pytest exited {proc.returncode} without results:\n{tail}",
              "failure": None, "duration_s": 0.0}
    return proc.returncode, {"schema": SCHEMA, "environment": {"device": "?", "device_name": "?", "backends": {backend: {}}}, "tests": [record]}


def run(backends: list[str], pytest_args: list[str], out_dir: str, timeout: float, jobs: int) -> int:
    """Run each backend in its own process; write merged JSON + HTML; print the matrix."""
    from reports.cli import merged_document
    from reports.html import render_runs
    from reports.results import write_atomically
    from reports.terminal import render

    os.makedirs(out_dir, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outcomes = list(pool.map(lambda b: _run_one(b, out_dir, timeout, pytest_args), backends))
    documents = [document for _, document in outcomes]
    json_path, html_path = os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.html")
    write_atomically(json_path, json.dumps(merged_document(documents), indent=1, default=str))
    write_atomically(html_path, render_runs(documents))
    print(render(documents, color=sys.stdout.isatty()))
    print(f"kvconform: results {os.path.abspath(json_path)}\nkvconform: HTML report {os.path.abspath(html_path)}")
    return 0 if all(code in (0, 5) for code, _ in outcomes) else 1
