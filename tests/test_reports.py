"""Reports and vendor gating: expectations decide the exit code, merge builds one matrix,
HTML escapes what backends say about themselves."""

import json
import re

import pytest

from kvconform.reports import cli, expectations
from kvconform.reports.html import render_runs
from kvconform.reports.matrix import build

from .suite_runs import run_suite

FAILING_MUTANT = "mutant:swap_indexes_dim1"
SWAP_FAILURES = f"conformance/test_swap.py::*[{FAILING_MUTANT}-*]"


def suite(tmp_path, *args):
    run = run_suite(tmp_path, "-m", "swap or gating", *args)
    return run.proc, run.document


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_a_new_failure_fails_the_run(tmp_path):
    proc, _ = suite(tmp_path, "--backend", f"reference,{FAILING_MUTANT}")
    assert proc.returncode == 1


def test_known_failures_pass_the_run_and_are_reported_as_expected(tmp_path):
    file = write(tmp_path, "exp.txt", f"https://bugs.example/7#c1 [ cpu ] {SWAP_FAILURES} [ Fail ]  # swap on dim 1\n")
    proc, document = suite(tmp_path, "--backend", f"reference,{FAILING_MUTANT}", "--expectations", file)
    assert proc.returncode == 0, proc.stdout[-2000:]
    outcomes = {r["outcome"] for r in document["tests"] if r["backend"] == FAILING_MUTANT and r["family"] == "swap"}
    assert outcomes == {"expected-failure", "not-applicable"}


def test_stale_entries_and_unexpected_passes_are_reported(tmp_path):
    file = write(tmp_path, "exp.txt", "\n".join([
        "# a comment line",
        "old-bug [ rocm gfx942 ] conformance/test_write.py::* [ Fail ]",
        "fixed-bug [ ] conformance/test_gating.py::test_connector_support_matches_the_layouts[reference] [ Fail ]",
    ]) + "\n")
    proc, document = suite(tmp_path, "--backend", "reference", "--expectations", file)
    assert proc.returncode == 0
    assert "stale expectation" in proc.stdout and "UNEXPECTED PASS" in proc.stdout
    assert [e["line"] for e in document["stale_expectations"]] == [2]
    assert any(r["outcome"] == "unexpected-pass" for r in document["tests"])


def test_update_expectations_writes_a_baseline_that_gates_the_next_run(tmp_path):
    baseline = tmp_path / "baseline.txt"
    first, _ = suite(tmp_path, "--backend", f"reference,{FAILING_MUTANT}", "--update-expectations", str(baseline))
    assert first.returncode == 0 and "untriaged [ cpu ]" in baseline.read_text()  # a first run that wrote its baseline (#38 item 10)
    second, _ = suite(tmp_path, "--backend", f"reference,{FAILING_MUTANT}", "--expectations", str(baseline))
    assert second.returncode == 0


@pytest.mark.parametrize("line, complaint", [
    ("bug [ cpu ] pattern", "expected 'REASON [ TAGS ] PATTERN"),
    ("bug [ cpu ] pattern [ Flaky ]", "outcome must be one of Fail, Crash, Skip"),
])
def test_a_malformed_expectations_file_names_file_and_line(tmp_path, line, complaint):
    file = write(tmp_path, "bad.txt", "# header\n" + line + "\n")
    with pytest.raises(expectations.ExpectationsError, match=re.escape(f"bad.txt:2: {complaint}")):
        expectations.parse(file)
    proc, _ = suite(tmp_path, "--backend", "reference", "--expectations", file)
    assert proc.returncode == 4 and "bad.txt:2" in proc.stderr


def fake_run(backend, platform, arch, outcome):
    return {
        "schema": "kvconform-results/1", "environment": {"device": platform, "device_name": f"{platform} box", "backends": {}},
        "tests": [{"nodeid": f"conformance/test_write.py::test_x[{backend}]", "backend": backend, "platform": platform,
                   "arch": arch, "family": "write", "check": "test_x", "outcome": outcome, "message": "", "failure": None}],
    }


def test_merge_of_runs_from_two_platforms_gives_one_matrix(tmp_path):
    runs = [fake_run("triton_aiter", "cuda", "sm90", "passed"), fake_run("triton_aiter", "rocm", "gfx942", "failed")]
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    out = tmp_path / "merged.html"
    assert cli.main(["merge", *map(str, paths), "-o", str(out), "--json", str(tmp_path / "m.json")]) == 0
    matrix = build([json.loads((tmp_path / "m.json").read_text())])
    assert matrix.rows == ["test_x"] and matrix.columns == ["triton_aiter@cuda-sm90", "triton_aiter@rocm-gfx942"]
    assert matrix.backend_specific_failures() == [("test_x", "triton_aiter@rocm-gfx942")]
    assert "triton_aiter@rocm-gfx942" in out.read_text()


def test_merge_refuses_another_schema_version(tmp_path, capsys):
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**fake_run("a", "cpu", "", "passed"), "schema": "kvconform-results/0"}))
    assert cli.main(["merge", str(old), "-o", str(tmp_path / "x.html")]) == 2
    assert "schema 'kvconform-results/0' is not 'kvconform-results/1'" in capsys.readouterr().err


def test_backend_strings_are_rendered_as_text():
    html = render_runs([fake_run("<script>alert(1)</script>", "cpu", "", "failed")])
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
