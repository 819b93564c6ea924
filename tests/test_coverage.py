"""The coverage table: what the built-in backends' runs exercised has no hole, docs/COVERAGE.md
is that table, and the classes and holes are computed as documented."""

import copy

import torch

from kvconform import builtin_coverage
from kvconform.conformance.harness.exercised import value_classes
from kvconform.reports import coverage as C

from .suite_runs import ROOT, run_suite


def test_declared_capabilities_of_the_builtin_backends_have_no_empty_cell(builtin_documents):
    assert [str(hole) for hole in C.build(builtin_documents).holes] == []


def test_docs_coverage_md_is_the_table_of_the_builtin_runs(builtin_documents):
    committed = (ROOT / "docs" / "COVERAGE.md").read_text()
    assert committed == builtin_coverage.render(builtin_documents), "docs/COVERAGE.md is stale: kvconform coverage -o docs/COVERAGE.md"


def test_a_float32_only_backend_gets_float32_caches_only(tmp_path):
    result = run_suite(tmp_path, "-n", "2", "--kvc-backend", "tests.coverage_backends:Float32Only")
    records = result.records
    assert records and all(r["outcome"] in ("passed", "not-applicable") for r in records), result.output
    assert {r["model_dtype"] for r in records if r["model_dtype"]} == {"torch.float32"}
    assert {(e["kv_cache_dtype"], e["dtype"], e["model_dtype"]) for r in records for e in r["exercised"] or ()} == {("auto", "float32", "float32")}
    assert C.build([result.document]).holes == []


def document_with(entries: list[dict], declared: dict) -> dict:
    record = {"nodeid": "conformance/test_write.py::test_x[b]", "backend": "b", "platform": "cpu", "arch": "", "family": "write",
              "outcome": "passed", "clauses": ["WRITE-SLOT"], "exercised": entries}
    return {"environment": {"backends": {"b": {"declared": declared}}}, "tests": [record]}


def entry(dtype="bfloat16", kv="auto", sizes=(), values=()):
    return {"kv_cache_dtype": kv, "dtype": dtype, "model_dtype": "bfloat16", "layout": "NHD E1[B,2,N,H,D]", "sizes": list(sizes), "values": list(values)}


def test_a_declared_cache_dtype_without_a_case_is_a_hole():
    declared = {"cache_dtypes": ["auto/bfloat16", "auto/float32"], "size_classes": [], "layouts": ["NHD E1[B,2,N,H,D]"]}
    holes = [str(h) for h in C.build([document_with([entry()], declared)]).holes]
    assert holes == ["b@cpu write: no case of auto/float32 on NHD E1[B,2,N,H,D]"]


def test_a_declared_size_class_and_an_fp8_value_class_without_a_case_are_holes():
    declared = {"cache_dtypes": ["fp8/float8_e4m3fn"], "size_classes": ["h=1", "n!=2^k"], "layouts": ["NHD E1[B,2,N,H,D]"]}
    seen = entry("float8_e4m3fn", "fp8", sizes=["h=1"], values=[v for v in C.VALUE_CLASSES if v != "nan"])
    holes = [str(h) for h in C.build([document_with([seen], declared)]).holes]
    assert holes == ["b@cpu write: no case in size class n!=2^k", "b@cpu write: no fp8/float8_e4m3fn value in class nan"]


def test_a_family_that_did_not_run_has_no_holes():
    declared = {"cache_dtypes": ["auto/bfloat16"], "size_classes": ["h=1"], "layouts": []}
    document = document_with([], declared)
    document["tests"][0]["outcome"] = "not-applicable"
    assert C.build([document]).holes == []


def test_fp8_value_classes_are_those_of_the_scaled_values():
    tie, near = 2.125, 2.125 * (1 + 2**-20)  # 2.125 lies halfway between the e4m3 codes 2.0 and 2.25
    cases = {"-0": [-0.0], "nan": [float("nan")], "max": [-448.0], ">max": [449.0, float("inf")], "tie": [tie], "near-tie": [near]}
    for name, values in cases.items():
        assert value_classes(torch.tensor(values), torch.float8_e4m3fn) == [name], name
    assert value_classes(torch.tensor([-1e-9]), torch.float8_e4m3fn) == ["-0"]
    assert value_classes(torch.tensor([1.0, 2.0, 2.3]), torch.float8_e4m3fn) == []


def test_coverage_tables_of_two_runs_add_up():
    declared = {"cache_dtypes": ["auto/bfloat16"], "size_classes": [], "layouts": ["NHD E1[B,2,N,H,D]"]}
    first = document_with([entry(sizes=["h=1"])], declared)
    rows = C.build([first, copy.deepcopy(first)]).rows
    (row,) = rows.values()
    assert (row.cases, row.sizes["h=1"]) == (2, 2)
