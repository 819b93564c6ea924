"""A certified run of the reference writes a submission bundle that ``kvconform
verify-submission`` accepts; a bundle with one record removed or one byte changed is refused
with the reason; certification refuses what it must not waive."""

import json
import shutil
from pathlib import Path

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


# ----------------------------------------------------------------------------- forged bundles (#26 item 14)
def resum(bundle):
    """What a forger does after editing a bundle: SHA256SUMS recomputed over the edited files."""
    (bundle / submission.SUMS).write_text("".join(f"{submission.sha256_file(str(bundle / n))}  {n}\n" for n in sorted(submission.FILES)))


def rewrite_derived(bundle, document, collected):
    """Results, collected tests and every file derived from them, consistent with each other."""
    from kvconform.reports import coverage as C

    (bundle / "results.json").write_text(json.dumps(document))
    (bundle / "collected.txt").write_text("".join(f"{t}\n" for t in sorted(collected)))
    table = C.build([document])
    (bundle / "coverage.json").write_text(json.dumps(submission.coverage_data(table)))
    line = json.loads((bundle / "manifest.json").read_text())["command"]["line"]
    (bundle / "COVERAGE.md").write_text(C.render_markdown(table, how=f"A certified run ({line})."))
    digests = json.loads((bundle / "digests.json").read_text())
    (bundle / "digests.json").write_text(json.dumps({**digests, "entries": submission.digest_entries(document)}))
    resum(bundle)


def test_a_re_certification_may_replace_every_file_a_bundle_holds():
    from kvconform.conformance.plugin.outputs import BUNDLE_NAMES

    assert {*submission.FILES, submission.SUMS, submission.SIGNATURE} <= BUNDLE_NAMES


def test_a_bundle_whose_manifest_names_other_seeds_is_refused(bundle, tmp_path):
    tampered = copy_of(bundle, tmp_path)
    manifest = json.loads((tampered / "manifest.json").read_text())
    (tampered / "manifest.json").write_text(json.dumps({**manifest, "seeds": [submission.SEED, 7]}))
    resum(tampered)
    problems = submission.verify(str(tampered), (bundle / "must_pass.txt").read_text().split())
    assert problems == [f"manifest.json: profile {submission.PROFILE!r} seeds [{submission.SEED}, 7]; "
                        f"a certified run uses profile {submission.PROFILE!r} seeds [{submission.SEED}]"]


def test_a_bundle_file_linked_to_a_huge_sparse_file_is_refused_before_it_is_hashed(tmp_path):
    """A link to a 20 GB sparse file was hashed for 75 s before the 1 GiB bound applied."""
    from .test_hostile_outputs import finishes

    huge = tmp_path / "sparse"
    with open(huge, "wb") as fh:
        fh.truncate(20 << 30)
    (tmp_path / "bundle").mkdir()
    (tmp_path / "bundle" / "results.json").symlink_to(huge)
    (tmp_path / "bundle" / submission.SUMS).write_text(f"{'0' * 64}  results.json\n")
    problems = finishes(lambda: submission.verify(str(tmp_path / "bundle"), []), seconds=10)
    assert f"results.json: larger than {submission.BUNDLE_LIMIT} bytes, the most a bundle file holds; not read" in problems


def test_a_bundle_whose_canary_is_not_what_a_clean_process_computes_here_is_refused(bundle, tmp_path, capsys):
    tampered = copy_of(bundle, tmp_path)
    canary = json.loads((tampered / "canary.json").read_text())
    assert set(canary) >= {"reference.copy_blocks", "the oracle's code"}
    canary["reference.copy_blocks"] = "0" * 64  # what a run whose oracle dropped a pair recorded
    (tampered / "canary.json").write_text(json.dumps(canary))
    resum(tampered)
    assert main(["verify-submission", str(tampered)]) == 1
    assert "canary.json: reference.copy_blocks gave other bytes in the certified run's process" in capsys.readouterr().out


def test_a_bundle_with_one_parametrized_record_dropped_and_resummed_is_refused(bundle, tmp_path, capsys):
    tampered = copy_of(bundle, tmp_path)
    document = json.loads((tampered / "results.json").read_text())
    collected = (tampered / "collected.txt").read_text().split()
    must_pass = (bundle / "must_pass.txt").read_text().split()
    for record in document["tests"]:  # a record whose loss the bundle's own files cannot show
        forged = dict(document, tests=[r for r in document["tests"] if r is not record])
        rest = [t for t in collected if t != record["nodeid"]]
        rewrite_derived(tampered, forged, rest)
        if not submission.verify(str(tampered), must_pass):
            break
    else:
        pytest.fail("every single dropped record shows in the bundle's own files")
    assert main(["verify-submission", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert f"not in the bundle: this suite collects {record['nodeid']} for the declared backends" in out


@pytest.mark.parametrize("name, content, complaint", [
    ("manifest.json", b"[]", "manifest.json: expected a JSON object, got list"),
    ("results.json", b"[]", "results.json: expected a kvconform-results/1 object, got list"),
    ("results.json", None, "results.json: tests must be a list of records, got dict"),  # tests: {}
    ("results.json", "records", "results.json: record 0: expected an object with string nodeid"),  # tests: [1, …]
    ("results.json", b'{"schema": "kvconform-results/1", "tests": [\xff]}', "unreadable: results.json"),
    ("collected.txt", b"conformance/test_x.py::t\xff\xfe\n", "unreadable: collected.txt"),
    ("results.json", b"[" * 100000 + b"]" * 100000, "results.json: not JSON (nested too deeply)"),
    (submission.SUMS, b"\xff\xfe", f"missing or unreadable file: {submission.SUMS}"),
], ids=["manifest-list", "results-list", "tests-object", "tests-not-records", "results-not-utf8", "collected-not-utf8", "deep", "sums-not-utf8"])
def test_a_malformed_bundle_file_is_refused_naming_it_never_a_traceback(bundle, tmp_path, capsys, name, content, complaint):
    tampered = copy_of(bundle, tmp_path)
    if content is None or content == "records":
        document = json.loads((tampered / name).read_text())
        document["tests"] = {} if content is None else [1, *document["tests"][1:]]
        content = json.dumps(document).encode()
    (tampered / name).write_bytes(content)
    if name != submission.SUMS:
        resum(tampered)
    assert main(["verify-submission", str(tampered)]) == 1
    out = capsys.readouterr().out
    assert "REFUSED" in out and complaint in out and "Traceback" not in out


def test_rerun_refuses_a_bundle_whose_recorded_outcome_or_digest_is_not_what_runs_here(bundle, tmp_path):
    from kvconform import receiver

    tampered = copy_of(bundle, tmp_path)
    document = json.loads((tampered / "results.json").read_text())
    passed = [r for r in document["tests"] if r["outcome"] == "passed" and r["family"] in ("shape", "split")]
    said_na, said_digest = passed[0], passed[1]
    said_na.update(outcome="not-applicable", not_applicable={"kind": "declaration", "who": "backend reference", "what": "forged"})
    said_digest["result_digest"] = "0" * 64

    class Chooser:  # the two forged records, as a receiver's random draw could pick them
        def sample(self, population, k):
            return [r for r in population if r["nodeid"] in (said_na["nodeid"], said_digest["nodeid"])]

    collected = (tampered / "collected.txt").read_text().split()
    lines, problems = receiver.rerun(str(tampered), document, 2, collected, chooser=Chooser())
    assert f"rerun {said_na['nodeid']}: outcome recorded 'not-applicable', here 'passed'" in problems
    assert any(p.startswith(f"rerun {said_digest['nodeid']}: result_digest recorded '{'0' * 64}'") for p in problems)
    assert not lines


def test_rerun_of_the_check_between_devices_uses_the_devices_the_bundle_pinned(bundle):
    """A certified CPU run pins ``cpu,cpu``; a rerun without the pin found that check "not
    applicable" and refused an honest bundle whenever the random draw picked it (CI, 2026-12-05)."""
    from kvconform import receiver

    document = json.loads((bundle / "results.json").read_text())
    assert document["environment"]["devices"] == ["cpu", "cpu"]
    between = [r for r in document["tests"] if "between_devices" in r["nodeid"] and r["outcome"] == "passed"][:1]
    assert between, "the certified run recorded no passing check between devices"

    class Chooser:
        def sample(self, population, k):
            return between

    lines, problems = receiver.rerun(str(bundle), document, 1, (bundle / "collected.txt").read_text().split(), chooser=Chooser())
    assert problems == [] and lines == [f"rerun {between[0]['nodeid']}: passed here too"]


def test_rerun_agrees_with_an_honest_bundle(bundle, capsys):
    assert main(["verify-submission", str(bundle), "--rerun", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("here too") == 2 and "2 recorded tests rerun here agree" in out


def test_rerun_reads_a_relative_bundle_path_from_the_callers_directory(bundle, capsys, monkeypatch):
    monkeypatch.chdir(bundle.parent)  # the rerun itself runs in a scratch directory (#37 item 9)
    assert main(["verify-submission", bundle.name, "--rerun", "1"]) == 0
    assert "1 recorded tests rerun here agree" in capsys.readouterr().out


def test_a_bundle_cannot_make_the_receiver_import_a_module_it_names():
    from kvconform import receiver

    with pytest.raises(receiver.ReceiverError, match="'os:system' are not registered on this machine"):
        receiver.collect(["os:system"], "e1")


def test_a_fuzzed_bundle_is_refused_with_problems_never_a_traceback(bundle):
    """Every bundle file truncated, a byte changed, re-encoded or replaced by JSON of the wrong
    shape, re-summed: verify names problems and never raises (a bounded, derandomized budget)."""
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from .test_fuzz_inputs import malformed

    must_pass = (bundle / "must_pass.txt").read_text().split()

    @settings(max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(submission.FILES)), st.data())
    def check(name, data):
        content = data.draw(malformed((bundle / name).read_text()))
        with tempfile.TemporaryDirectory() as tmp:
            tampered = Path(shutil.copytree(bundle, f"{tmp}/bundle"))
            (tampered / name).write_bytes(content)
            resum(tampered)
            problems = submission.verify(str(tampered), must_pass)
            assert problems or content == (bundle / name).read_bytes()

    check()


def test_a_signed_bundle_verifies_with_the_vendors_key_and_only_with_it(bundle, tmp_path, capsys):
    pytest.importorskip("cryptography", reason="signing is the optional extra kvconform[sign]")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    def key_pair(name):
        key = ed25519.Ed25519PrivateKey.generate()
        (tmp_path / f"{name}.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                                 serialization.NoEncryption()))
        (tmp_path / f"{name}.pub.pem").write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
        return str(tmp_path / f"{name}.pem"), str(tmp_path / f"{name}.pub.pem")

    vendor, vendor_public = key_pair("vendor")
    _, other_public = key_pair("other")
    signed = copy_of(bundle, tmp_path)
    assert main(["verify-submission", str(signed), "--public-key", vendor_public]) == 1  # unsigned
    assert f"signature: {signed}/{submission.SIGNATURE}: cannot read" in capsys.readouterr().out
    assert main(["sign-submission", str(signed), "--key", vendor]) == 0
    assert main(["verify-submission", str(signed), "--public-key", vendor_public]) == 0
    assert main(["verify-submission", str(signed), "--public-key", other_public]) == 1
    assert f"does not verify with {other_public}" in capsys.readouterr().out
    (signed / "results.json").write_text((signed / "results.json").read_text() + " ")  # forged and re-summed
    resum(signed)
    assert main(["verify-submission", str(signed), "--public-key", vendor_public]) == 1
    assert f"{submission.SIGNATURE} does not verify with {vendor_public}" in capsys.readouterr().out
    assert main(["sign-submission", str(signed), "--key", vendor_public]) == 2  # a public key cannot sign
    assert "not an unencrypted PEM private key" in capsys.readouterr().err
