"""A certified run of the reference writes a submission bundle that ``kvconform
verify-submission`` accepts; a bundle with one record removed or one byte changed is refused
with the reason; certification refuses what it must not waive."""

import json
import shutil

import pytest

from kvconform.cli import main
from kvconform.reports import submission

from .suite_runs import run_suite


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("certified")
    result = run_suite(out, "-n", "2", "--kvc-backend", "reference", "--kvc-certify", str(out / "bundle"))
    assert result.returncode == 0 and (out / "bundle" / submission.SUMS).exists(), result.output
    return out / "bundle"


def copy_of(bundle, tmp_path):
    return shutil.copytree(bundle, tmp_path / "bundle")


def test_verify_submission_accepts_the_bundle_of_a_certified_run(bundle, capsys):
    assert main(["verify-submission", str(bundle)]) == 0
    assert "ACCEPTED" in capsys.readouterr().out
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert (manifest["profile"], manifest["seeds"], manifest["backends"]) == (submission.PROFILE, [submission.SEED], ["reference"])


def test_a_bundle_with_one_record_removed_is_refused_naming_it(bundle, tmp_path, capsys):
    tampered = copy_of(bundle, tmp_path)
    document = json.loads((tampered / "results.json").read_text())
    removed = document["tests"].pop(7)
    (tampered / "results.json").write_text(json.dumps(document))
    assert main(["verify-submission", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "checksum mismatch: results.json" in out and f"no record: {removed['nodeid']}" in out


def test_a_bundle_with_one_byte_changed_is_refused_naming_the_file(bundle, tmp_path, capsys):
    tampered = copy_of(bundle, tmp_path)
    data = bytearray((tampered / "COVERAGE.md").read_bytes())
    data[100] ^= 1
    (tampered / "COVERAGE.md").write_bytes(bytes(data))
    assert main(["verify-submission", str(tampered)]) == 1
    assert "checksum mismatch: COVERAGE.md" in capsys.readouterr().out


def test_a_bundle_of_another_suite_version_or_missing_a_must_pass_check_is_refused(bundle):
    must_pass = (bundle / "must_pass.txt").read_text().split()
    problems = submission.verify(str(bundle), [*must_pass, "conformance/test_new.py::test_added_later"], suite_version="9.9.9")
    assert any("bundle from kvconform" in p and "9.9.9" in p for p in problems)
    assert any("must_pass.txt differs" in p for p in problems)
    assert "must-pass check without a record: backend reference: conformance/test_new.py::test_added_later" in problems


def record(outcome, kind=None):
    na = {"kind": kind, "who": "this run", "what": "has no --compare-digests FILE"} if kind else None
    return {"nodeid": f"conformance/test_x.py::test_{outcome}[b]", "backend": "b", "platform": "cpu", "family": "gating", "outcome": outcome, "not_applicable": na}


def test_certification_refuses_other_outcomes_missing_records_and_incomplete_runs():
    document = {"environment": {"backends": {}}, "tests": [record("passed"), record("not-applicable", "run"), record("failed")],
                "completion": {"complete": False, "reason": "interrupted"}}
    problems = submission.certification_problems(document, [r["nodeid"] for r in document["tests"]] + ["conformance/test_x.py::test_gone[b]"])
    assert any(p.startswith("the run is incomplete") for p in problems)
    assert "outcome: conformance/test_x.py::test_not-applicable[b]: not-applicable (run: this run has no --compare-digests FILE)" in problems
    assert "outcome: conformance/test_x.py::test_failed[b]: failed" in problems
    assert "no record: conformance/test_x.py::test_gone[b]" in problems
    assert not any("test_passed" in p for p in problems)


@pytest.mark.parametrize("waiver", [["--kvc-expectations", "x.txt"], ["-k", "write"], ["--kvc-profile", "quick"], ["--kvc-seed", "3"]],
                         ids=["expectations", "keyword", "profile", "seed"])
def test_certify_refuses_waivers_and_other_pins(tmp_path, waiver):
    result = run_suite(tmp_path, "--kvc-backend", "reference", "--kvc-certify", str(tmp_path / "bundle"), *waiver)
    assert result.returncode == 4 and "--kvc-certify refuses" in result.output
    assert not (tmp_path / "bundle").exists()
