"""What a person and a CI dashboard read: the terminal report in an 80-column log with the
eight built-ins and two mutants, and JUnit whose outcomes say what happened (issue #16)."""

import json
import re
import xml.etree.ElementTree as ET

import pytest

from kvconform.backends_under_test.registry import default_names
from kvconform.conformance.plugin.collection import FAMILIES
from kvconform.reports.terminal import SHORT_FAMILY, render, wrap_name

from .suite_runs import run_suite

MUTANTS = ["mutant:e3_cross_layer_packed_layer_outermost", "mutant:write_padding_slots"]  # the longest name and a short one
NOT_PASSING = {("mutant:write_padding_slots", "write"): "failed", ("mutant:e3_cross_layer_packed_layer_outermost", "shape"): "error",
               ("triton_rocm_attn", "read"): "expected-failure"}


def ten_backends() -> dict:
    tests = []
    for backend in default_names() + MUTANTS:
        for family in FAMILIES:
            for check in (f"test_{family}_property_holds_for_every_drawn_case", f"test_{family}_edge_case_holds"):
                outcome = NOT_PASSING.get((backend, family), "passed") if check.endswith("edge_case_holds") else "passed"
                tests.append({"nodeid": f"conformance/test_{family}.py::{check}[{backend}]", "backend": backend, "platform": "cpu", "arch": "",
                              "run_platform": "cpu", "family": family, "check": check, "outcome": outcome, "message": "", "failure": None})
    return {"schema": "kvconform-results/1", "environment": {"backends": {}}, "completion": {"complete": True, "reasons": []}, "tests": tests}


def backend_labels(text: str) -> list[str]:
    """The first column of the summary table, a wrapped name's lines joined again."""
    lines = text.splitlines()
    body = lines[lines.index(next(line for line in lines if line.startswith("─"))) + 1:]
    labels = []
    for line in body:
        if line.startswith("ok all passed"):
            break
        first, _, rest = line.partition(" ")
        if rest.strip():
            labels.append(first)
        else:
            labels[-1] += first
    return labels


@pytest.mark.parametrize("width", [80, 100, 120])
def test_terminal_report_fits_the_width_and_names_every_backend_and_failing_check_in_full(width):
    text = render([ten_backends()], color=False, width=width)
    assert max(len(line) for line in text.splitlines()) <= width
    assert backend_labels(text) == default_names() + MUTANTS
    header = next(line for line in text.splitlines() if line.startswith("backend@cpu"))
    assert header.split()[1:] == [SHORT_FAMILY.get(f, f) for f in sorted(FAMILIES)]
    for (backend, family), outcome in NOT_PASSING.items():
        check_line = f"{family} test_{family}_edge_case_holds"
        assert check_line in text.splitlines()
        assert re.search(rf"^    \S.* {re.escape(backend)}@cpu", text, re.MULTILINE)


def test_terminal_report_cells_say_which_family_did_not_pass():
    text = render([ten_backends()], color=False, width=80)
    row = next(line for line in text.splitlines() if line.startswith("mutant:write_padding"))  # the name may wrap
    cells = dict(zip(sorted(FAMILIES), row.split()[1:]))
    assert cells["write"] == "1F" and cells["swap"] == "ok"  # a count then a letter: never read as a layout standard (E1)
    legend = " ".join(text.split())  # the legend wraps at 80 columns
    assert "· x known failure" in legend and "3x known failure" not in legend  # symbols, no example count read as a real one (#38)


EXPECTATIONS = "\n".join([
    "https://bugs.example/7 [ ] conformance/test_swap.py::*[mutant:swap_indexes_dim1-*] [ Fail ]",
    "fixed-bug [ ] conformance/test_gating.py::test_connector_support_matches_the_layouts[reference] [ Fail ]",
]) + "\n"


def test_junit_tells_not_applicable_known_failure_unexpected_pass_and_failure_apart(tmp_path):
    expectations = tmp_path / "exp.txt"
    expectations.write_text(EXPECTATIONS)
    xml = tmp_path / "junit.xml"
    run = run_suite(tmp_path, "-m", "swap or gating or copy", "--backend", "reference,mutant:swap_indexes_dim1,mutant:copy_blocks_one_plane",
                    "--expectations", str(expectations), f"--junitxml={xml}")
    assert run.returncode == 1, run.output  # copy_blocks_one_plane fails, unlisted
    cases = {case.get("name"): case for case in ET.parse(xml).iter("testcase")}
    outcome = {name: next(p.get("value") for p in case.iter("property") if p.get("name") == "kvc_outcome")
               for name, case in cases.items() if name != "completion"}
    by_kind = {kind: [n for n, o in outcome.items() if o == kind] for kind in ("not-applicable", "expected-failure", "unexpected-pass", "failed")}
    assert all(by_kind.values()), by_kind
    na, known, xpass, failed = (cases[by_kind[k][0]] for k in ("not-applicable", "expected-failure", "unexpected-pass", "failed"))
    assert na.find("skipped").get("type") == "kvconform.not-applicable" and na.find("skipped").get("message").startswith("not applicable (")
    assert known.find("skipped").get("type") == "kvconform.expected-failure" and "known failure" in known.find("skipped").get("message")
    assert xpass.find("skipped") is None and xpass.find("failure") is None and "UNEXPECTED PASS" in xpass.find("system-out").text
    assert failed.find("failure").get("type") == "kvconform.failed"
    details = json.loads(next(p.get("value") for p in failed.iter("property") if p.get("name") == "failure"))
    assert details["property"] and details["mismatches"]
    assert {case.get("classname") for name, case in cases.items() if name != "completion"} <= {"kvconform.swap", "kvconform.gating", "kvconform.copy"}
    suite = ET.parse(xml).find(".//testsuite")
    assert json.loads(suite.find("properties/property[@name='kvc_completion']").get("value"))["complete"] is False  # -m: filtered
    assert cases["completion"].find("skipped").get("type") == "kvconform.partial-run"
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == sum(1 for c in cases.values() if c.find("failure") is not None)


def test_a_long_row_label_breaks_at_spaces_and_separators_never_inside_a_word_that_fits():
    assert wrap_name("reference_gfx942 (models rocm-gfx942)", 20).splitlines() == ["reference_gfx942", "(models rocm-gfx942)"]
    assert wrap_name("mutant:connector_head_slice_off_by_one", 22).splitlines() == ["mutant:connector_head_", "slice_off_by_one"]


def test_a_failure_reads_from_the_checks_own_line_without_the_harness_frames(tmp_path):
    run = run_suite(tmp_path, "--backend", "mutant:write_padding_slots", "-k", "test_padding_slots_leave_cache_untouched", "-p", "no:xdist")
    failure = run.proc.stdout.split("= FAILURES =")[1]
    assert "def test_padding_slots_leave_cache_untouched(case):" in failure and "padding-written: K[" in failure
    assert "def assert_bytes_equal" not in failure and "harness/ops.py" not in failure, failure


def test_only_a_formatted_finding_hides_harness_frames():
    from kvconform.conformance.harness.assertions import ConformanceFailure, a_finding

    def raised(exc):
        try:
            raise exc
        except Exception:  # noqa: BLE001 - an ExceptionInfo needs a raised exception
            return pytest.ExceptionInfo.from_current()

    assert a_finding(raised(ConformanceFailure("write: …", {})))
    assert not a_finding(raised(RuntimeError("a harness bug keeps every frame")))
    assert not a_finding(None)
