"""A backend that aborts its process, hangs, leaves a sticky device error or fails to import (a module found whose own import fails)
shows crashed / timeout / error in its own cells, while every other backend's results are
still produced (``kvconform run``: one process per backend, xdist restarts, --kvc-timeout)."""

import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from .suite_runs import KV_CHECKS

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["reference", "fault:crash_on_write", "fault:hang_on_write", "fault:sticky_device_error", "tests.imports_a_missing_dependency:Backend"]


def test_faulty_backends_fail_in_their_own_cells_and_the_run_completes(tmp_path):
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "kvconform", "run", "--backend", ",".join(BACKENDS), "--kvc-timeout", "3", "-j", "3",
         "--out", str(tmp_path), "--", "-m", "write", "-k", f"padding_slots and {KV_CHECKS}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    elapsed = time.monotonic() - start
    outcomes, layouts = defaultdict(set), defaultdict(set)
    for record in json.loads((tmp_path / "results.json").read_text())["tests"]:
        outcomes[record["backend"]].add(record["outcome"])
        layouts[record["backend"], record["outcome"]].add(record["layout"])
    assert outcomes["reference"] == {"passed"}
    assert outcomes["fault:crash_on_write"] == {"crashed"}
    assert None not in layouts["fault:crash_on_write", "crashed"]  # the dead worker sent no report: layout from collection
    assert outcomes["fault:hang_on_write"] == {"timeout"}
    assert outcomes["fault:sticky_device_error"] == {"error"}
    assert outcomes["tests.imports_a_missing_dependency:Backend"] == {"error"}
    assert proc.returncode == 1 and (tmp_path / "results.html").exists()
    assert elapsed < 300, f"isolation run took {elapsed:.0f} s"
