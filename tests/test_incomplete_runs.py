"""A report never says more than what ran (issue #26, items 1 to 5): checks nobody collected,
a killed run, a timeout without xdist and an empty --backend are all told apart from a verdict."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from kvconform.conformance.plugin.collection import suite_command, suite_dir

from . import fork_server
from .suite_runs import run_suite

COMPLETE = {"schema": "kvconform-results/1", "environment": {"backends": {}}, "tests": [],
            "completion": {"complete": True, "reasons": []}}


def test_a_check_module_nobody_collected_makes_the_run_partial(tmp_path):
    ignored = [f"--ignore={path}" for path in sorted(suite_dir().glob("test_*.py")) if path.name != "test_gating.py"]
    run = run_suite(tmp_path, "--kvc-backend", "reference", *ignored)
    completion = run.document["completion"]
    assert not completion["complete"] and [r["kind"] for r in completion["reasons"]] == ["not-collected"]
    assert "PARTIAL RUN" in run.proc.stdout


DROPPER = ('"""A plugin that removes tests from the list without reporting them deselected."""\n'
           "def pytest_collection_modifyitems(items):\n"
           "    items[:] = [item for item in items if 'HND' not in item.nodeid]\n")


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_plugin_that_drops_some_parametrizations_without_deselecting_them_makes_the_run_partial(tmp_path, xdist):
    """Every check keeps some of its tests, so the check names are all there: the tests the
    suite generated are compared with the ones left after every plugin's changes."""
    (tmp_path / "dropper.py").write_text(DROPPER)
    run = run_suite(tmp_path / "out", "--kvc-backend", "reference", "-p", "dropper", *xdist, target="kvconform.conformance.test_split",
                    env={"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))})
    assert run.records and not any("HND" in r["nodeid"] for r in run.records), run.output
    completion = run.document["completion"]
    dropped = [r["what"] for r in completion["reasons"] if r["kind"] == "not-collected"]
    assert not completion["complete"] and len(dropped) == 1 and "dropped at collection without being reported deselected" in dropped[0], completion
    assert "e.g. conformance/test_split.py::" in dropped[0] and "HND" in dropped[0]


def test_a_second_run_under_xdist_sets_the_earlier_results_aside_before_its_workers_start(tmp_path):
    """Found on the H200 with 8 and 16 workers: every run into an earlier run's results file ended
    after collection with "Different tests were collected" (workers that started before the file
    was set aside picked another rootdir: tests/worker_start.py says why)."""
    out = tmp_path / "out"
    first = run_suite(out, "--kvc-backend", "reference", "-m", "shape")
    log = tmp_path / "workers.log"
    again = run_suite(out, "--kvc-backend", "reference", "-m", "shape", "-n", "2", "-p", "tests.worker_start",
                      env={"KVC_WORKER_LOG": str(log), "KVC_EARLIER_RESULTS": str(out / "results.json")})
    seen = [line.split(":") for line in log.read_text().split()]
    assert [exists for exists, _ in seen] == ["False", "False"], "a worker started while the earlier results file was in place"
    timed = sum(1 for r in first.records if r.get("duration_s") is not None)
    assert timed and all(int(durations) == timed for _, durations in seen), f"the workers were not handed the earlier run's {timed} durations: {seen}"
    assert again.returncode == first.returncode == 0, again.output
    assert sorted(r["nodeid"] for r in again.records) == sorted(r["nodeid"] for r in first.records)


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_killed_run_leaves_no_results_file_that_looks_like_its_own(tmp_path, how):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(COMPLETE))
    proc = subprocess.Popen(suite_command("--kvc-backend", "fault:hang_on_write", "-m", "write", "--kvc-json", str(results)),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "results.previous.json").exists() and time.monotonic() < deadline:  # the session has started
        time.sleep(0.5)
    proc.send_signal(how)
    proc.wait(timeout=60)
    assert not results.exists()
    assert json.loads((tmp_path / "results.previous.json").read_text()) == COMPLETE


def test_a_timeout_without_xdist_still_writes_results_that_say_so(tmp_path):
    junit = tmp_path / "junit.xml"
    run = run_suite(tmp_path, "--kvc-backend", "fault:hang_on_write", "--kvc-timeout", "5", "-p", "no:xdist", "--junitxml", str(junit),
                    target="kvconform.conformance.test_write::test_padding_slots_leave_cache_untouched")
    assert run.returncode == 70
    assert {r["outcome"] for r in run.records} == {"timeout"}
    assert not run.document["completion"]["complete"] and "timeout" in {r["kind"] for r in run.document["completion"]["reasons"]}
    # the process ends inside a test: what pytest would have shown and written at the end is shown and written before
    assert "kvconform verdict: PARTIAL RUN" in run.proc.stdout and "exceeded --kvc-timeout" in run.proc.stderr, run.output
    cases = {case.get("name"): case for case in ET.parse(junit).getroot().iter("testcase")}
    assert cases["completion"].find("error").get("type") == "kvconform.partial-run"
    assert [case.find("error").get("type") for name, case in cases.items() if name != "completion"] == ["kvconform.timeout"]
    assert not (tmp_path / "results.json.lock").exists()


def test_an_empty_backend_list_and_an_endless_timeout_are_usage_errors(tmp_path):
    for args, complaint in ((("--kvc-backend", ""), "names no backend"), (("--kvc-backend", ","), "names no backend"),
                            (("--kvc-backend", "reference", "--kvc-timeout", "inf"), "--kvc-timeout inf")):
        proc = fork_server.run(suite_command(*args, "-m", "shape", python=sys.executable), cwd=tmp_path, timeout=300)
        assert proc.returncode == 4 and complaint in proc.stderr, (args, proc.stderr[-500:])


def kvconform_run(tmp_path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvconform", "run", *args], cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env={**os.environ, **(env or {})})


def test_kvconform_run_never_reuses_the_results_of_an_earlier_run_of_a_backend_that_died(tmp_path):
    (tmp_path / "aborts_at_import.py").write_text("import os\nif os.environ.get('KVC_ABORT'):\n    os.abort()\n"
                                                  "from kvconform.backends_under_test.reference_backend import ReferenceBackend as Backend\n")
    env = {"PYTHONPATH": str(tmp_path)}
    first = kvconform_run(tmp_path, "--backend", "aborts_at_import:Backend", "--out", "k", "--", "-m", "shape", env=env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    again = kvconform_run(tmp_path, "--backend", "aborts_at_import:Backend", "--out", "k", "--", "-m", "shape", env={**env, "KVC_ABORT": "1"})
    merged = json.loads((tmp_path / "k" / "results.json").read_text())
    assert again.returncode != 0 and {r["outcome"] for r in merged["tests"]} == {"crashed"}
    assert not merged["completion"]["complete"]


def test_kvconform_run_keeps_a_complete_merged_result_and_fails_a_filter_that_selects_nothing(tmp_path):
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "results.json").write_text(json.dumps(COMPLETE))
    partial = kvconform_run(tmp_path, "--backend", "reference", "--out", "k", "--", "-m", "shape")
    assert partial.returncode == 0 and json.loads((tmp_path / "k" / "results.complete.json").read_text()) == COMPLETE
    nothing = kvconform_run(tmp_path, "--backend", "reference", "--out", "k", "--", "-k", "nomatch")
    assert nothing.returncode != 0
