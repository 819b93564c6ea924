"""docs/COVERAGE.md: the coverage table of the built-in backends, and the runs that define it.

``kvconform coverage -o docs/COVERAGE.md`` runs the suite as :data:`RUNS` says (every
built-in, the default quick profile, seed 0, on the CPU; E3 built-ins again under the E3
standard for the families a standard changes) and renders the table; tests/test_coverage.py
makes the same runs and fails when the committed file differs or shows a hole.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from kvconform.backends_under_test import registry
from kvconform.reports import coverage as C

from kvconform.conformance.plugin.collection import suite_command

HOW = ("Runs: every built-in backend with the default quick profile, seed 0, on the CPU, `--kvc-standard e1`; "
       "the built-ins that declare E3 again with `--kvc-standard e3 -m 'shape or split'` (the families whose checks "
       "depend on the standard).")


def runs() -> list[tuple[str, ...]]:
    """The suite arguments of each run the table is made of."""
    names = registry.default_names()
    e3 = [n for n in names if (loaded := registry.load(n)).backend is not None and "e3" in loaded.backend.capabilities.standards]
    return [
        ("--kvc-backend", ",".join(names), "--kvc-standard", "e1", "--kvc-device", "cpu", "--kvc-seed", "0", "--kvc-profile", "quick"),
        ("--kvc-backend", ",".join(e3), "--kvc-standard", "e3", "-m", "shape or split", "--kvc-device", "cpu", "--kvc-seed", "0", "--kvc-profile", "quick"),
    ]


def render(documents: list[dict]) -> str:
    return C.render_markdown(C.build(documents), how=HOW)


def run_all(workers: str = "2") -> list[dict]:
    """Make the runs (each a suite subprocess) and return their result documents."""
    documents = []
    with tempfile.TemporaryDirectory(prefix="kvconform-coverage-") as scratch:
        for i, args in enumerate(runs()):
            out = Path(scratch) / f"run{i}" / "results.json"
            subprocess.run(suite_command("--kvc-json", str(out), "-n", workers, "-q", *args), check=False, capture_output=True)
            if not out.exists():
                raise RuntimeError(f"the coverage run {' '.join(args)} wrote no results")
            documents.append(json.loads(out.read_text()))
    return documents
