"""Golden digests stay current; digest files travel between machines and refuse a wrong header."""

import json

from kvconform.conformance.harness import equivalence

from .suite_runs import run_suite


def suite(out_dir, *args):
    return run_suite(out_dir, "-m", "equivalence", *args)


def test_committed_golden_digests_are_what_the_reference_produces():
    assert equivalence.load_golden() == json.loads(json.dumps(equivalence.reference_digests(), sort_keys=True))


def test_export_on_one_platform_compares_on_another(tmp_path):
    exported = tmp_path / "nvidia.json"
    assert suite(tmp_path / "a", "--backend", "reference,triton_flash", "--export-digests", str(exported)).returncode == 0
    entries = json.loads(exported.read_text())["entries"]
    assert {e["backend"] for e in entries} == {"reference", "triton_flash"}
    # an MI300-like run (e4m3fnuz, scales doubled as vLLM does) is equivalent after the exact conversion
    compared = suite(tmp_path / "b", "--backend", "reference_gfx942,triton_aiter", "--compare-digests", str(exported))
    assert compared.returncode == 0, compared.output
    records = compared.records
    assert any(r["check"] == "test_digests_equal_the_exported_run" and r["outcome"] == "passed" and "fp8" in r["nodeid"] for r in records)


def test_a_tampered_header_is_refused(tmp_path):
    exported = tmp_path / "run.json"
    suite(tmp_path / "a", "--backend", "reference", "--export-digests", str(exported))
    document = json.loads(exported.read_text())
    document["cases_hash"] = "0" * 16
    exported.write_text(json.dumps(document))
    run = suite(tmp_path / "b", "--backend", "reference", "--compare-digests", str(exported))
    assert run.returncode == 4 and "header cases_hash" in run.proc.stderr and "not comparable" in run.proc.stderr


def test_a_one_bit_difference_fails_the_golden_digest(tmp_path):
    run = suite(tmp_path, "--backend", "mutant:write_one_bit_flipped")
    records = [r for r in run.records if r["check"] == "test_canonical_bytes_equal_the_committed_reference_digests"]
    assert records and all(r["outcome"] in ("failed", "not-applicable") for r in records)
    failed = [r for r in records if r["outcome"] == "failed"]
    assert failed
    # the digest, then where the wrong bytes came from and the first wrong element, as every byte comparison says it (#23)
    assert all("canonical digest" in r["message"] and "bit-flip" in r["message"] and "layer=0 block=" in r["message"] for r in failed), failed[0]["message"]
    assert all({f["fault"] for f in r["failure"]["diagnosis"]} == {"bit-flip"} and r["failure"]["byte_map"] for r in failed)


def test_merged_report_shows_the_equivalence_matrix(tmp_path):
    from kvconform.reports.equivalence import equivalence_matrix

    documents = [suite(tmp_path / "nvidia", "--backend", "reference,triton_aiter").document,
                 suite(tmp_path / "amd", "--backend", "reference_gfx942,mutant:write_one_bit_flipped").document]
    columns, cells = equivalence_matrix(documents)
    assert cells[("reference@cpu", "triton_aiter@cpu")] == "layout-conversion"
    assert cells[("reference@cpu", "reference_gfx942@cpu (models rocm-gfx942)")] == "fp8-conversion"
    assert cells[("reference@cpu", "mutant:write_one_bit_flipped@cpu")] == "differs"


def test_a_backend_that_differs_from_the_exported_run_fails_the_comparison(tmp_path):
    exported = tmp_path / "run.json"
    suite(tmp_path / "a", "--backend", "reference", "--export-digests", str(exported))
    run = suite(tmp_path / "b", "--backend", "mutant:write_one_bit_flipped", "--compare-digests", str(exported))
    compared = [r for r in run.records if r["check"] == "test_digests_equal_the_exported_run"]
    assert any(r["outcome"] == "failed" and "page digest" in r["message"] for r in compared)
