"""A backend's declaration is checked for consistency (#38 item 2): an alias declared alone, a
cache dtype none of its layouts holds, an fp8 kv_cache_dtype without the op that writes one —
each is a warning in every run's report and a coverage hole that blocks certification."""

from kvconform.reports import coverage, submission
from kvconform.reports.terminal import render

from .suite_runs import run_suite

LAYOUT = "NHD E1[B,2,N,H,D]"


def declared(**changed):
    facts = {"layouts": [LAYOUT], "ops": ["write"], "kv_cache_dtypes": ["auto", "fp8", "fp8_e4m3"], "cache_dtypes": ["auto/bfloat16"],
             "layout_cache_dtypes": {LAYOUT: ["auto/bfloat16"]}, "size_classes": []}
    return {**facts, **changed}


def document(facts):
    record = {"nodeid": "conformance/test_gating.py::test_g[acme]", "backend": "acme", "platform": "cpu", "arch": "", "family": "gating",
              "check": "test_g", "outcome": "passed", "message": "", "failure": None}
    return {"schema": "kvconform-results/1", "environment": {"device": "cpu", "device_name": "cpu", "backends": {"acme": {"declared": facts}}},
            "completion": {"complete": True, "reasons": []}, "stale_expectations": [], "tests": [record]}


def test_a_consistent_declaration_has_no_problem():
    assert coverage.declaration_problems(declared()) == []


def test_an_alias_declared_without_its_twin_is_a_problem_either_way():
    assert coverage.declaration_problems(declared(kv_cache_dtypes=["auto", "fp8_e4m3"])) == [
        "declares kv_cache_dtype fp8_e4m3 without its alias fp8 (both store the same fp8 format; the cases keyed to fp8 do not run): declare both"]
    assert "fp8 without its alias fp8_e4m3" in coverage.declaration_problems(declared(kv_cache_dtypes=["auto", "fp8"]))[0]


def test_a_cache_dtype_no_layout_holds_and_fp8_without_write_are_problems():
    unheld = declared(cache_dtypes=["auto/bfloat16", "fp8/float8_e4m3fn"])
    assert coverage.declaration_problems(unheld) == ["declares cache dtype fp8/float8_e4m3fn, which none of its layouts holds: no case can use it"]
    assert coverage.declaration_problems(declared(ops=["copy"])) == [
        "declares kv_cache_dtype fp8, fp8_e4m3 but not op write: no check can put a value in such a cache"]


def test_a_declaration_problem_is_a_hole_that_blocks_certification_and_keeps_the_run_short_of_conforming():
    doc = document(declared(kv_cache_dtypes=["auto", "fp8_e4m3"]))
    assert [str(h) for h in coverage.build([doc]).holes] == ["acme@cpu declaration: " + coverage.declaration_problems(declared(kv_cache_dtypes=["auto", "fp8_e4m3"]))[0]]
    assert any(p.startswith("coverage hole: acme@cpu declaration: declares kv_cache_dtype fp8_e4m3") for p in submission.certification_problems(doc, []))
    text = render([doc], color=False, width=400)
    assert text.startswith("kvconform verdict: NO NEW FAILURES — 1 coverage hole;")
    assert "WARNING backend acme@cpu declares kv_cache_dtype fp8_e4m3 without its alias fp8" in text


def test_fp8_e4m3_declared_alone_hides_a_scale_bug_the_alias_catches_and_every_run_warns(tmp_path):
    """#38 as a vendor met it: V quantised with K's scale; the golden e4m3 digest check (a
    filtered run) is not applicable to the backend declaring fp8_e4m3 only and fails on the same
    backend declaring fp8 too; the report warns about the first."""
    alone, both = "tests.declaration_backends:E4m3WithoutItsAlias", "tests.declaration_backends:E4m3AndItsAlias"
    run = run_suite(tmp_path, "-m", "equivalence", "-k", "canonical and fp8-N16", "--kvc-backend", f"{alone},{both}", env={"COLUMNS": "400"})
    assert run.outcomes("e4m3_without_alias") == {"not-applicable"} and run.outcomes("e4m3_and_alias") == {"failed"}, run.output
    warnings = [line for line in run.proc.stdout.splitlines() if line.startswith("WARNING backend")]
    assert warnings and all("e4m3_without_alias@cpu declares kv_cache_dtype fp8_e4m3 without its alias fp8" in w for w in warnings), run.output
