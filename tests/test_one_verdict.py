"""Every output states the one verdict, whatever else runs (issue #37 items 3-9 and 10): a plugin
that turns failing reports into passes, an expectations entry that skips everything, a backend
whose import ends the process, text no encoder takes, two runs into one directory, a full disk.
Each test fails on 6831dc8 (exit 0, JUnit failures="0", CONFORMS/complete, results of an earlier
run left as they were, a traceback instead of the reports, both runs accepted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

from kvconform.conformance.plugin.outputs import ResultsLock
from kvconform.isolation import run as kvconform_run

from .suite_runs import ROOT, run_suite


def test_a_plugin_that_turns_failures_into_passes_changes_neither_exit_status_nor_junit(tmp_path):
    junit = tmp_path / "junit.xml"
    result = run_suite(tmp_path, "-p", "tests.hides_failures", "-p", "no:randomly", "--kvc-backend", "mutant:copy_blocks_one_plane",
                       "-k", "copies_both_planes", "--junitxml", str(junit), target="kvconform.conformance.test_copy_blocks")
    failed = [r for r in result.records if r["outcome"] == "failed"]
    assert failed and result.returncode == 1, result.output
    suite = ET.parse(junit).getroot().find("testsuite")
    assert int(suite.get("failures")) == len(failed)


def test_a_wildcard_skip_entry_makes_a_partial_run_that_counts_its_skips(tmp_path):
    (tmp_path / "known.txt").write_text("bug [ ] * [ Skip ]\n")
    result = run_suite(tmp_path, "-p", "no:randomly", "--kvc-backend", "mutant:copy_blocks_one_plane", "--kvc-expectations", str(tmp_path / "known.txt"))
    completion = result.document["completion"]
    skipped = [r for r in result.records if r["outcome"] == "skipped"]
    assert completion["complete"] is False and skipped
    assert [r["what"] for r in completion["reasons"]] == [
        f"{len(skipped)} check(s) skipped by expectations entries, never run ({len(skipped)} by wildcard entries, e.g. {tmp_path / 'known.txt'}:1 *)"]
    assert "CONFORMS" not in result.proc.stdout.replace("DOES NOT CONFORM", "")


def test_a_backend_whose_import_calls_sys_exit_is_a_load_error_and_the_results_are_this_runs(tmp_path):
    earlier = {"schema": "kvconform-results/1", "environment": {}, "completion": {"complete": True, "reasons": []}, "tests": []}
    (tmp_path / "results.json").write_text(json.dumps(earlier))
    result = run_suite(tmp_path, "-p", "no:randomly", "--kvc-backend", "tests.exits_at_import:Backend", "-k", "padding_slots",
                       target="kvconform.conformance.test_write")
    assert result.returncode == 1 and result.records, result.output
    assert all(r["outcome"] == "error" and "SystemExit(0)" in r["message"] for r in result.records)


def test_kvconform_run_fails_when_a_backend_process_exits_0_without_results(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kvconform", "run", "--backend", "tests.exits_at_import:Backend", "--out", str(tmp_path),
                           "--", "-m", "write", "-k", "padding_slots"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KVC_TEST_HARD_EXIT": "1", "PYTHONPATH": str(ROOT)})
    records = json.loads((tmp_path / "results.json").read_text())["tests"]
    assert [r["outcome"] for r in records] == ["crashed"] and "exited 0 without results" in records[0]["message"]
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_kvconform_run_refuses_an_out_directory_another_live_run_writes(tmp_path, capsys):
    held = ResultsLock.acquire(str(tmp_path / "results.json"))  # this process is alive: a live run
    try:
        assert kvconform_run(["reference"], [], str(tmp_path), timeout=10, jobs=1) == 4
    finally:
        held.release()
    assert "--out" in capsys.readouterr().err and not (tmp_path / "results.html").exists()


def test_a_lone_surrogate_in_a_backend_message_reaches_every_report(tmp_path):
    junit = tmp_path / "junit.xml"
    result = run_suite(tmp_path, "-p", "no:randomly", "--kvc-backend", "tests.hostile_backends:RaisesWithALoneSurrogate", "-k", "padding_slots",
                       "--junitxml", str(junit), target="kvconform.conformance.test_write")
    assert result.returncode == 1 and {r["outcome"] for r in result.records} == {"error"}, result.output
    assert "kvconform verdict:" in result.proc.stdout and "\\udcff" in (tmp_path / "results.html").read_text()
    ET.parse(junit)


def test_control_sequences_from_a_backend_reach_pytests_failure_text_as_escapes(tmp_path):
    result = run_suite(tmp_path, "-p", "no:randomly", "--kvc-backend", "tests.hostile_backends:RaisesWithAnEscapeSequence", "-k", "padding_slots",
                       target="kvconform.conformance.test_write")
    assert result.returncode == 1 and {r["outcome"] for r in result.records} == {"error"}, result.output
    shown = result.proc.stdout + result.proc.stderr
    assert "\x1b]0;pwned" not in shown and "\x1b[2J" not in shown
    assert "kernel said: \\x1b]0;pwned\\x07 \\x1b[2J" in shown and "kernel log \\x1b[2J" in shown


def test_a_results_file_edited_to_claim_complete_is_still_partial():
    from kvconform.reports import results

    claimed = {"environment": {}, "completion": {"complete": True, "reasons": [], "selected": 3, "recorded": 3},
               "tests": [{"nodeid": "a", "outcome": "passed"}, {"nodeid": "b", "outcome": "skipped"}]}
    assert not results.is_complete(claimed)
    assert results.headline(claimed).startswith("PARTIAL RUN (skipped: it says complete, yet its records hold checks skipped by expectations; "
                                                "unknown: it says complete, yet selected 3, recorded 3 != 2 records)")
    assert results.verdict([claimed], holes=0)[0] == results.PARTIAL


def test_a_full_disk_ends_in_the_verdict_and_a_line_saying_the_outputs_were_not_written(tmp_path):
    result = run_suite(tmp_path, "-p", "tests.fills_the_disk", "-p", "no:randomly", "--kvc-backend", "reference", "-k", "padding_slots",
                       target="kvconform.conformance.test_write")
    assert "Traceback" not in result.proc.stdout + result.proc.stderr and "INTERNALERROR" not in result.proc.stdout, result.output
    assert result.returncode == 3 and result.document is None  # a CI job never passes on outputs that are not there
    lines = result.proc.stdout.splitlines()
    assert any(line.startswith("kvconform verdict:") for line in lines) and "exit status 3" in " ".join(result.proc.stdout.split())  # the line wraps
    assert lines[-2].startswith("kvconform: OUTPUTS NOT WRITTEN") and f"({tmp_path / 'results.json'}: No space left on device)" in lines[-2]
