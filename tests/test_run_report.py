"""``kvconform run``'s report (#38 item 6): its pytest processes' output is not shown, so the report
prints each new failure's block — property, diagnosis, first differing elements, repro — as a
plain run does; and the matrix legend shows the symbols, not counts that read like this run's."""

import re

from kvconform.reports.terminal import LEGEND, render

MESSAGE = ("write: 3 elements differ (cache of 4096 bytes + 256-byte guards)\n  where the wrong bytes came from:\n"
           "    padding-written: K[b=5, s=15, h=0..2]: holds the input row of a token whose slot is negative\n"
           "  repro: pytest --pyargs 'kvconform.conformance.test_write::test_p[acme-E1:NHD]' --kvc-backend acme")


def record(outcome, message="", check="test_p", repro="pytest --pyargs 'kvconform.conformance.test_write::test_p[acme-E1:NHD]' --kvc-backend acme"):
    return {"nodeid": f"conformance/test_write.py::{check}[acme-E1:NHD]", "backend": "acme", "platform": "cpu", "arch": "", "family": "write",
            "check": check, "outcome": outcome, "message": message, "failure": None, "repro": repro}


def document(*records):
    return {"schema": "kvconform-results/1", "environment": {"device": "cpu", "device_name": "cpu", "backends": {}},
            "completion": {"complete": True, "reasons": []}, "tests": list(records)}


def test_the_legend_names_symbols_not_example_counts():
    assert not re.search(r"\d[FECTXxs]\b", LEGEND), LEGEND
    assert all(f" {symbol} {word}" in LEGEND for symbol, word in (("F", "failed"), ("C", "crashed"), ("x", "known failure")))


def test_kvconform_runs_report_prints_each_new_failures_block_with_its_repro():
    doc = document(record("failed", MESSAGE), record("error", "RuntimeError: boom", check="test_e"), record("expected-failure", "known", check="test_k"))
    text = render([doc], color=False, width=300, failures=True)
    assert "FAIL conformance/test_write.py::test_p[acme-E1:NHD]\n" + MESSAGE in text
    assert "ERROR conformance/test_write.py::test_e[acme-E1:NHD]\nRuntimeError: boom\n  repro: pytest --pyargs" in text  # a message without its own repro gets one
    assert "test_k[acme-E1:NHD]\n" not in text  # known failures are in the matrix, not repeated
    assert text.rstrip().splitlines()[-1].startswith("kvconform verdict: DOES NOT CONFORM")


def test_a_plain_runs_report_leaves_the_blocks_to_pytest():
    assert "padding-written" not in render([document(record("failed", MESSAGE))], color=False, width=300)


def test_a_partial_runs_warning_is_printed_once_above_its_verdict():
    """#38 item 10: a repro line's run (one test: partial by design) repeated the banner."""
    doc = {**document(record("passed")), "completion": {"complete": False, "reasons": [{"kind": "filtered", "what": "a test id selects part of the suite"}]}}
    text = render([doc], color=False, width=300)
    assert text.count("PARTIAL RUN (filtered") == 1 and text.rstrip().splitlines()[-1].startswith("kvconform verdict: PARTIAL RUN — filtered")
