"""A vendor's baseline cycle, the smaller items of #38 item 10: an expectations file takes the test
ids pytest's own summary prints; a first run that only writes the baseline exits 0 and says so on
its verdict line; a generic JUnit reader counts the known failures as pytest's xfails (skipped,
typed and worded as known failures), never as failures the run did not fail on."""

import re
import xml.etree.ElementTree as ET

from kvconform.reports import expectations, junit, results

from .suite_runs import ROOT, run_suite

CHECK = "test_padding_slots_leave_cache_untouched"
MUTANT = "mutant:write_padding_slots"  # writes the padding slots' rows: fails CHECK in each of its 3 layouts
TEST_ID = f"conformance/test_write.py::{CHECK}[{MUTANT}-E1:NHD]"
FIRST_RUN = ("--kvc-backend", MUTANT, "-k", CHECK, "-p", "no:randomly")


def test_an_entry_copied_from_pytests_summary_names_the_check_it_printed():
    """pytest prints ``::NAME`` for one module named, ``test_write.py::NAME`` for the suite, and
    the path from the rootdir when the suite is installed below it."""
    printed = [f"::{CHECK}[{MUTANT}-E1:NHD]", f"test_write.py::{CHECK}[{MUTANT}-E1:NHD]",
               f"../.venv/lib/python3.11/site-packages/kvconform/conformance/test_write.py::{CHECK}[{MUTANT}-E1:NHD]"]
    for line in printed:
        entries = expectations.parse_text(f"acme#7 [ ] {line} [ Fail ]\n", "kvconform-expectations.txt")
        assert expectations.first_match(entries, TEST_ID, {"cpu", MUTANT}) is entries[0], line
    as_written = expectations.parse_text("r [ ] conformance/test_*.py::*[acme-*] [ Fail ]\nr [ ] *[acme-*] [ Skip ]\n", "f")
    assert [e.pattern for e in as_written] == ["conformance/test_*.py::*[acme-*]", "*[acme-*]"]


def test_a_first_run_that_writes_the_baseline_exits_0_and_says_so_on_its_verdict_line(tmp_path):
    baseline, xml = tmp_path / "kvconform-expectations.txt", tmp_path / "junit.xml"
    run = run_suite(tmp_path, *FIRST_RUN, "--kvc-update-expectations", str(baseline), "--junitxml", str(xml),
                    target="kvconform.conformance.test_write", env={"COLUMNS": "400"})
    assert run.returncode == 0, run.output
    assert baseline.read_text().count(f"{CHECK}[{MUTANT}-") == 3
    assert {r["outcome"] for r in run.records} == {"expected-failure"}
    assert f"3 known failures (baseline {baseline}, written by this run); 0 new failures" in results.verdict([run.document], holes=0)[1]
    assert "written by this run" in run.proc.stdout
    suite = ET.parse(xml).getroot().find("testsuite")
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0")


def test_a_run_gated_by_the_file_it_updates_still_fails_on_a_new_failure(tmp_path):
    """Only a first run is its own baseline: a CI job updating its file in place keeps exit 1."""
    baseline = tmp_path / "kvconform-expectations.txt"
    baseline.write_text(f"untriaged [ ] conformance/test_write.py::{CHECK}[{MUTANT}-E1:NHD] [ Fail ]\n")
    run = run_suite(tmp_path, *FIRST_RUN, "--kvc-expectations", str(baseline), "--kvc-update-expectations", str(baseline),
                    target="kvconform.conformance.test_write")
    assert run.returncode == 1, run.output
    assert sorted(r["outcome"] for r in run.records) == ["expected-failure", "failed", "failed"]


def test_a_generic_junit_reader_sees_known_failures_as_xfails_worded_as_known_failures():
    def record(check, outcome, message):
        return {"nodeid": f"conformance/test_write.py::{check}[acme-E1:NHD]", "backend": "acme", "family": "write",
                "check": check, "outcome": outcome, "message": message, "not_applicable": {"kind": "declaration"}}

    document = {"schema": results.SCHEMA, "environment": {"expectations": "kvconform-expectations.txt", "backends": {}},
                "completion": {"complete": True, "reasons": []},
                "tests": [record("test_k", "expected-failure", "expected Fail (kvconform-expectations.txt:3: acme#7): 3 elements differ"),
                          record("test_n", "not-applicable", "backend acme does not declare op 'decode'")]}
    suite = ET.fromstring(junit.from_document(document)).find("testsuite")
    assert (suite.get("failures"), suite.get("errors"), suite.get("skipped")) == ("0", "0", "2")
    known, not_applicable = (case.find("skipped") for case in suite.findall("testcase")[:2])
    assert known.get("type") == "kvconform.expected-failure" and known.get("message").startswith("known failure (expectations): ")
    assert not_applicable.get("type") == "kvconform.not-applicable"
    assert "NO NEW FAILURES — 1 known failure (baseline kvconform-expectations.txt)" in ET.tostring(suite, encoding="unicode")


def test_the_item_table_names_tests_that_exist():
    """VENDOR_CI.md section 7 maps each finding of #38 to its tests: a renamed test breaks the map."""
    table = (ROOT / "docs" / "VENDOR_CI.md").read_text().split("## 7. ")[1]
    named, module = [], None
    for token in re.findall(r"`((?:tests/\w+\.py)?(?:::\w+)?)`", table):
        path, _, test = token.partition("::")
        module = path or module
        named.append((module, test))
    assert len({m for m, _ in named}) >= 12, named
    missing = [f"{m}::{t}" for m, t in named if not (ROOT / m).is_file() or (t and f"def {t}(" not in (ROOT / m).read_text())]
    assert not missing, missing
