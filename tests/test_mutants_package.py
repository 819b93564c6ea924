"""The seeded faults live in one package, a module per family of faults, each registered by its own
``@mutant("NAME")`` declaration (issue #39): the registry reads the names from the source, so a run
that asks for no mutant imports no module of the package, and a ``mutant:NAME`` run only its family's."""

from __future__ import annotations

from pathlib import Path

from kvconform.backends_under_test import registry

from .suite_runs import run_suite

PACKAGE = "kvconform.backends_under_test.mutants"


def modules_imported_by_a_run(tmp_path, *args: str) -> tuple[int, list[str]]:
    """(exit status, names of the mutant package's modules in sys.modules at the end) of a fresh suite run."""
    listing = tmp_path / "modules.txt"
    run = run_suite(tmp_path, "-p", "tests.modules_at_exit", *args, env={"KVC_MODULES_OUT": str(listing)}, fresh=True)
    assert listing.exists(), run.output
    return run.returncode, [m for m in listing.read_text().split() if m == PACKAGE or m.startswith(PACKAGE + ".")]


def test_a_run_of_the_reference_imports_no_mutant_module(tmp_path):
    exit_code, mutant_modules = modules_imported_by_a_run(tmp_path, "--kvc-backend", "reference", "-m", "split")
    assert exit_code == 0
    assert mutant_modules == []


def test_a_mutant_run_imports_its_family_module_only_and_the_mutant_is_caught(tmp_path):
    exit_code, mutant_modules = modules_imported_by_a_run(tmp_path, "--kvc-backend", "mutant:split_copies", "-m", "split")
    assert exit_code == 1  # split_copies' views are copies: the split checks fail
    assert mutant_modules == [PACKAGE, f"{PACKAGE}.base", f"{PACKAGE}.split"]


def test_every_declared_name_resolves_to_its_class_in_the_package():
    from kvconform.backends_under_test.mutants import MUTANTS  # imports every family module

    targets = registry.mutant_targets()
    assert sorted(targets) == sorted(MUTANTS)
    assert {name: f"{cls.__module__}:{cls.__name__}" for name, cls in MUTANTS.items()} == targets
    families = {Path(p).stem for p in Path(registry.__file__).with_name("mutants").glob("*.py")} - {"__init__", "base"}
    assert {cls.__module__.rpartition(".")[0] for cls in MUTANTS.values()} == {PACKAGE}
    assert {cls.__module__.rpartition(".")[2] for cls in MUTANTS.values()} == families  # no family module without a mutant
