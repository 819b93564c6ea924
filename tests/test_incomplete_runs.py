"""A report never says more than what ran (issue #26, items 1, 3 and 5): checks nobody collected,
a killed run, a timeout without xdist and an empty --backend are all told apart from a verdict."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from kvconform.conformance.plugin.collection import suite_command, suite_dir

from .suite_runs import run_suite

COMPLETE = {"schema": "kvconform-results/1", "environment": {"backends": {}}, "tests": [],
            "completion": {"complete": True, "reasons": []}}


def test_a_check_module_nobody_collected_makes_the_run_partial(tmp_path):
    ignored = [f"--ignore={path}" for path in sorted(suite_dir().glob("test_*.py")) if path.name != "test_gating.py"]
    run = run_suite(tmp_path, "--kvc-backend", "reference", *ignored)
    completion = run.document["completion"]
    assert not completion["complete"] and [r["kind"] for r in completion["reasons"]] == ["not-collected"]
    assert "PARTIAL RUN" in run.proc.stdout


def test_a_killed_run_leaves_no_results_file_that_looks_like_its_own(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(COMPLETE))
    proc = subprocess.Popen(suite_command("--kvc-backend", "fault:hang_on_write", "-m", "write", "--kvc-json", str(results)),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    while not (tmp_path / "results.previous.json").exists() and time.monotonic() < deadline:  # the test loop has started
        time.sleep(0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not results.exists()
    assert json.loads((tmp_path / "results.previous.json").read_text()) == COMPLETE


def test_a_timeout_without_xdist_still_writes_results_that_say_so(tmp_path):
    run = run_suite(tmp_path, "--kvc-backend", "fault:hang_on_write", "--kvc-timeout", "5", "-p", "no:xdist",
                    target="kvconform.conformance.test_write::test_padding_slots_leave_cache_untouched")
    assert run.returncode == 70
    assert {r["outcome"] for r in run.records} == {"timeout"}
    assert not run.document["completion"]["complete"] and "timeout" in {r["kind"] for r in run.document["completion"]["reasons"]}


def test_an_empty_backend_list_and_an_endless_timeout_are_usage_errors(tmp_path):
    for args, complaint in ((("--kvc-backend", ""), "names no backend"), (("--kvc-backend", ","), "names no backend"),
                            (("--kvc-backend", "reference", "--kvc-timeout", "inf"), "--kvc-timeout inf")):
        proc = subprocess.run(suite_command(*args, "-m", "shape", python=sys.executable), cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 4 and complaint in proc.stderr, (args, proc.stderr[-500:])
