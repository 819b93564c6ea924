"""``--kvc-backend pkg.module:Class`` whose module this Python cannot find is one usage error
naming the module and the fix (#38 item 7: it was four load errors and exit 1); a module that is
found but fails to import stays the backend's load error (its cells say error, the others run)."""

from kvconform.backends_under_test import registry

from .suite_runs import run_suite


def test_a_target_whose_module_is_nowhere_names_the_module_and_the_fix():
    text = registry.missing_module("acme_nowhere.adapter:AcmeBackend")
    assert text.startswith("--kvc-backend acme_nowhere.adapter:AcmeBackend: no module named 'acme_nowhere' on this Python's path")
    assert "pip install" in text and "PYTHONPATH" in text


def test_a_missing_submodule_of_a_package_that_exists_is_named_whole():
    assert "no module named 'kvconform.nowhere'" in registry.missing_module("kvconform.nowhere:Backend")


def test_registered_names_and_found_modules_are_not_missing():
    assert registry.missing_module("reference") is None and registry.missing_module("mutant:split_copies") is None
    assert registry.missing_module("kvconform.backends_under_test.reference_backend:ReferenceBackend") is None
    assert registry.missing_module("tests.declaration_backends:NoSuchClass") is None  # found: its load error says what is wrong


def test_the_suite_stops_with_one_usage_error_before_any_test(tmp_path):
    run = run_suite(tmp_path, "-m", "gating", "--kvc-backend", "reference,acme_nowhere.adapter:AcmeBackend")
    assert run.returncode == 4 and run.document is None, run.output
    errors = [line for line in (run.proc.stdout + run.proc.stderr).splitlines() if line.startswith("ERROR")]
    assert len(errors) == 1 and "no module named 'acme_nowhere'" in errors[0], run.output
