"""The pytest plugin's promises: usage errors, import failures as errors, header, xdist."""

from .suite_runs import KV_CHECKS, run_suite

BROKEN = "tests.imports_a_missing_dependency:Backend"  # found, but its import fails (a module not found is a usage error)


def test_unknown_backend_is_a_usage_error_listing_the_registered_ones(tmp_path):
    run = run_suite(tmp_path, "--backend", "no_such_backend")
    assert run.returncode == 4
    assert "unknown backend(s) no_such_backend" in run.proc.stderr and "reference_kv_first" in run.proc.stderr


def test_a_backend_that_fails_to_import_errors_while_the_others_run(tmp_path):
    run = run_suite(tmp_path, "--backend", f"reference,{BROKEN}", "-m", "write", "-k", KV_CHECKS)
    broken = [r for r in run.records if r["backend"] == BROKEN]
    assert broken and all(r["outcome"] == "error" and "No module named 'kvconform_test_missing_vendor_runtime'" in r["message"] for r in broken)
    assert "passed" in run.outcomes("reference") and run.outcomes("reference") <= {"passed", "not-applicable"}
    assert run.returncode == 1


def test_report_header_names_versions_device_fp8_and_seed_in_80_columns(tmp_path):
    header = run_suite(tmp_path, "--backend", "reference,triton_flash", "--seed", "7", "--collect-only", env={"COLUMNS": "80"}).proc.stdout
    for text in ("kvconform: torch", "triton 3", "device cpu", "profile quick", "seed 7", "fp8 torch.float8_e4m3fn", "triton_mode"):
        assert text in header, text
    ours = header.split("rootdir:")[0].splitlines()[2:]  # after pytest's own two lines
    assert ours and all(len(line) <= 80 for line in ours), "\n".join(line for line in ours if len(line) > 80)


def test_suite_runs_under_xdist(tmp_path):
    run = run_suite(tmp_path, "--backend", "reference,mutant:split_copies", "-n", "2", "-m", "split")  # the whole suite under xdist: test_mutants_are_caught
    assert {r["backend"] for r in run.records} == {"reference", "mutant:split_copies"}
    assert run.document["completion"]["selected"] == len(run.records)  # the workers' selection reached the controller
    assert "failed" in run.outcomes("mutant:split_copies"), run.output
    assert run.outcomes("reference") <= {"passed", "not-applicable"}
