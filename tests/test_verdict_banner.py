"""The run's verdict never overstates (#38 item 1): CONFORMS only when nothing is waived and
nothing declared went untested; a baselined run says NO NEW FAILURES, in amber, naming its
known failures and the baseline — the same words in the terminal, the HTML and JUnit."""

import xml.etree.ElementTree as ET

from kvconform.reports import results
from kvconform.reports.html import render_runs
from kvconform.reports.junit import annotate
from kvconform.reports.terminal import render

BASELINE = "ci/acme-expectations.txt"
LAYOUT = "NHD E1[B,2,N,H,D]"
DECLARED = {"layouts": [LAYOUT], "cache_dtypes": ["auto/bfloat16"], "size_classes": [], "layout_cache_dtypes": {LAYOUT: ["auto/bfloat16"]}}
CASE = {"kv_cache_dtype": "auto", "dtype": "bfloat16", "model_dtype": "bfloat16", "layout": LAYOUT, "geometry": "g", "sizes": [], "values": []}


def record(check, outcome="passed"):
    return {"nodeid": f"conformance/test_write.py::{check}[acme-NHD]", "backend": "acme", "platform": "cpu", "arch": "",
            "family": "write", "check": check, "outcome": outcome, "message": "", "failure": None, "exercised": [CASE]}


def document(*records, expectations=None, declared=DECLARED):
    return {"schema": results.SCHEMA, "environment": {"device": "cpu", "device_name": "cpu", "expectations": expectations,
                                                     "backends": {"acme": {"declared": declared}}},
            "completion": {"complete": True, "reasons": [], "exit_status": 0}, "stale_expectations": [], "tests": list(records)}


def baselined():
    return document(record("test_a"), *(record(f"test_known_{n}", "expected-failure") for n in range(9)), expectations=BASELINE)


def junit_verdict(doc) -> str:
    xml = annotate('<testsuites><testsuite name="pytest"></testsuite></testsuites>', doc)
    return next(p.get("value") for p in ET.fromstring(xml).iter("property") if p.get("name") == "kvc_verdict")


def test_a_run_with_known_failures_says_no_new_failures_and_names_its_baseline():
    word, why = results.verdict([baselined()], holes=0)
    assert word == results.NO_NEW_FAILURES != results.CONFORMS
    assert why.startswith(f"9 known failures (baseline {BASELINE}); 0 new failures")


def test_the_terminal_the_html_and_junit_say_the_same_words_in_amber():
    doc = baselined()
    said = f"NO NEW FAILURES — 9 known failures (baseline {BASELINE})"
    terminal = render([doc], color=False, width=200)
    assert terminal.startswith(f"kvconform verdict: {said}") and terminal.rstrip().splitlines()[-1].startswith(f"kvconform verdict: {said}")
    assert "CONFORMS" not in terminal
    assert "\x1b[1;33mNO NEW FAILURES" in render([doc], color=True, width=200)  # bold yellow: amber, never green
    html = render_runs([doc])
    assert f'class="verdict v-no-new-failures"><b>NO NEW FAILURES</b> — 9 known failures (baseline {BASELINE})' in html
    assert ".v-no-new-failures { background: #fff1b8" in html
    assert junit_verdict(doc).startswith(said)


def test_the_known_failures_are_one_click_from_the_html_banner():
    html = render_runs([baselined()])
    known = html.split('<details id="known-failures">')[1].split("</details>")[0]
    assert known.count("<a href=\"#") == 9 and "acme@cpu: test_known_0" in known


def test_checks_skipped_by_expectations_keep_a_run_short_of_conforming():
    word, why = results.verdict([document(record("test_a"), record("test_b", "skipped"), expectations=BASELINE)], holes=0)
    # a skipped check is never run: the run is partial (#37 item 5), even where the file claims complete
    assert word == results.PARTIAL and "1 check skipped by expectations" in why.split("; ")


def test_a_coverage_hole_keeps_a_run_short_of_conforming():
    declared = {**DECLARED, "cache_dtypes": ["auto/bfloat16", "fp8/float8_e4m3fn"], "layout_cache_dtypes": {LAYOUT: ["auto/bfloat16", "fp8/float8_e4m3fn"]}}
    doc = document(record("test_a"), declared=declared)
    first = render([doc], color=False, width=200).split(";")[0]
    assert first == "kvconform verdict: NO NEW FAILURES — 7 coverage holes"  # fp8: no case on NHD, none of its 6 value classes


def test_only_a_run_with_nothing_waived_and_no_hole_conforms():
    doc = document(record("test_a"), record("test_b"))
    assert results.verdict([doc], holes=0)[0] == results.CONFORMS
    assert render([doc], color=False, width=200).startswith("kvconform verdict: CONFORMS — 0 new failures")
    assert junit_verdict(doc).startswith("CONFORMS — ")
