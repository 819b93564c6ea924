"""The pytest plugin's promises: usage errors, import failures as errors, header, xdist."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pytest_conformance(*args, tmp_path=None):
    cmd = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_unknown_backend_is_a_usage_error_listing_the_registered_ones():
    proc = pytest_conformance("--backend", "no_such_backend", "-q")
    assert proc.returncode == 4
    assert "unknown backend(s) no_such_backend" in proc.stderr and "reference_kv_first" in proc.stderr


def test_a_backend_that_fails_to_import_errors_while_the_others_run(tmp_path):
    out = tmp_path / "r.json"
    proc = pytest_conformance("--backend", "reference,missing_vendor_pkg.adapter:Backend", "-q", "-m", "write", "--kvc-json", str(out))
    records = json.loads(out.read_text())["tests"]
    broken = [r for r in records if r["backend"] == "missing_vendor_pkg.adapter:Backend"]
    assert broken and all(r["outcome"] == "error" and "No module named 'missing_vendor_pkg'" in r["message"] for r in broken)
    reference = [r["outcome"] for r in records if r["backend"] == "reference"]
    assert "passed" in reference and set(reference) <= {"passed", "not-applicable"}
    assert proc.returncode == 1


def test_report_header_names_versions_device_fp8_and_seed():
    proc = pytest_conformance("--backend", "reference", "--seed", "7", "--collect-only")
    header = proc.stdout
    for text in ("kvconform: torch", "triton", "device cpu", "profile quick", "seed 7", "fp8 torch.float8_e4m3fn"):
        assert text in header, text


def test_suite_runs_under_xdist(tmp_path):
    out = tmp_path / "r.json"
    proc = pytest_conformance("--backend", "reference,mutant:split_copies", "-n", "2", "-q", "--kvc-json", str(out))
    records = json.loads(out.read_text())["tests"]
    assert {r["backend"] for r in records} == {"reference", "mutant:split_copies"}
    assert any(r["outcome"] == "failed" for r in records if r["backend"] == "mutant:split_copies"), proc.stdout[-2000:]
    assert all(r["outcome"] in ("passed", "not-applicable") for r in records if r["backend"] == "reference")
