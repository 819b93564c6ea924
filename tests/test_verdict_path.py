"""The path of one verdict stays short enough to read (issue #22, docs/ARCHITECTURE.md): from
start-up to the written reports, one passing fixed check runs functions of at most 27 of the
project's Python files (24; plugin/run_plan.py since start-up is a pure plan, then wiring (#39); and
the oracle guard's two: harness/oracle_guard.py, and big_caches.py, whose module objects are made
when the guard imports every oracle module before a backend), and a
failing one adds only the files that render its failure."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from .suite_runs import ROOT

CHECK = "kvconform.conformance.test_split::test_split_views_share_the_cache_storage"
PACKAGES = ("conformance", "reference", "reports", "backends_under_test", "kvconform")
# A function ran: a code object with its own locals that is not a comprehension (3.11 runs a
# module's comprehensions as functions) — not a module or class body.
TRACE = textwrap.dedent("""
    import inspect, json, os, sys
    root, out, target, backend, results = sys.argv[1:6]
    files, seen = set(), set()
    def profile(frame, event, arg):
        code = frame.f_code
        if event != "call" or code in seen:
            return
        seen.add(code)
        if code.co_flags & inspect.CO_NEWLOCALS and not code.co_name.endswith(("comp>", "<genexpr>")):
            path = os.path.realpath(code.co_filename)
            if path.startswith(root + os.sep) and path.endswith(".py"):
                files.add(os.path.relpath(path, root))
    sys.setprofile(profile)
    import pytest
    code = pytest.main(["--pyargs", target, "-p", "no:cacheprovider", "-p", "no:xdist", "-q", "--kvc-backend", backend, "--kvc-json", results])
    sys.setprofile(None)
    json.dump({"exit": int(code), "files": sorted(files)}, open(out, "w"))
""")


def traced_files(tmp_path, backend: str) -> tuple[int, set[str]]:
    name = backend.replace(":", "_")
    out = tmp_path / f"{name}.json"
    target = f"{CHECK}[{backend}-E1:NHD]"
    subprocess.run([sys.executable, "-c", TRACE, str(ROOT), str(out), target, backend, str(tmp_path / name / "results.json")],
                   cwd=tmp_path, check=True, capture_output=True, timeout=600)
    traced = json.loads(out.read_text())
    return traced["exit"], {f for f in traced["files"] if f.split("/")[0] in PACKAGES}


def test_one_passing_check_runs_functions_of_at_most_27_project_files(tmp_path):
    exit_code, files = traced_files(tmp_path, "reference")
    assert exit_code == 0
    assert len(files) <= 27, f"{len(files)} files:\n" + "\n".join(sorted(files))


def test_a_failing_check_adds_only_the_files_that_render_its_failure(tmp_path):
    _, passing = traced_files(tmp_path, "reference")
    exit_code, failing = traced_files(tmp_path, "mutant:split_copies")
    assert exit_code == 1
    rendering = {"reports/svg.py", "reports/draws.py", "reports/mutation.py"}
    the_mutant = {"backends_under_test/mutants/__init__.py", "backends_under_test/mutants/split.py"}  # its declaration, its class
    assert failing - passing <= rendering | the_mutant, sorted(failing - passing)
