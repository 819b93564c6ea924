"""The suite's identity in pytest: which runs are kvconform runs, how its modules are
collected, and the test ids that do not depend on how the suite was started.

pytest names a test file's module after the directories around it, so the same file would be
``conformance.test_write`` in a checkout and ``kvconform.conformance.test_write`` when
installed — two module objects, two classes of every helper. The suite's files are therefore
imported by their package name, whatever path pytest found them under, and a test's id is
``conformance/test_write.py::test_name[params]`` in every mode (checkout, installed,
``kvconform run``), so one expectations file gates them all.
"""

from __future__ import annotations

import fnmatch
import functools
import importlib
from pathlib import Path

import pytest

SUITE = "kvconform.conformance"


@functools.cache
def suite_dir() -> Path:
    return Path(importlib.import_module(SUITE).__file__).parent.resolve()


def is_suite_path(path) -> bool:
    path = Path(path).resolve()
    return path == suite_dir() or suite_dir() in path.parents


def targets_suite(arg: str, pyargs: bool, invocation_dir: Path) -> bool:
    """Does one pytest argument name the suite (a path into it, or with --pyargs its package)?"""
    target = str(arg).split("::")[0]
    if pyargs and (target == SUITE or target.startswith(SUITE + ".")):
        return True
    try:
        return is_suite_path(invocation_dir / target)
    except (OSError, ValueError):
        return False


def names_whole_suite(arg: str, pyargs: bool, invocation_dir: Path) -> bool:
    """Does one pytest argument name the whole suite (not one of its modules or tests)?"""
    target = str(arg)
    if "::" in target:
        return False
    if pyargs and target == SUITE:
        return True
    try:
        return (invocation_dir / target).resolve() == suite_dir()
    except (OSError, ValueError):
        return False


def suite_requested(config) -> bool:
    return any(targets_suite(arg, config.option.pyargs, config.invocation_params.dir) for arg in config.args)


def test_id(item) -> str:
    """``conformance/<file>::<name>``: the same for a checkout, an installed run and ``kvconform run``."""
    return f"conformance/{Path(item.path).name}::{item.name}"


class SuitePackage(pytest.Package):
    """The suite's directory, set up by importing its package (never by file path)."""

    def setup(self) -> None:
        importlib.import_module(SUITE)


class SuiteModule(pytest.Module):
    """A check module imported as ``kvconform.conformance.<name>``, and collected by the
    suite's own naming rules (a vendor's ``python_files``/``python_functions`` ini does not apply)."""

    def _getobj(self):
        return importlib.import_module(f"{SUITE}.{self.path.stem}")

    def funcnamefilter(self, name: str) -> bool:
        return name.startswith("test_")

    def classnamefilter(self, name: str) -> bool:
        return False


def is_check_file(path: Path) -> bool:
    return path.suffix == ".py" and path.name.startswith("test_") and is_suite_path(path)


def collected_by_pytest(path: Path, parent) -> bool:
    """Whether pytest's python plugin collects this file (an argument, or matching python_files)."""
    patterns = parent.config.getini("python_files")
    return parent.session.isinitpath(path) or any(fnmatch.fnmatch(path.name, p) for p in patterns)
