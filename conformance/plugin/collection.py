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

import dataclasses
import fnmatch
import functools
import importlib
import inspect
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # the plugin loads without torch: these are imported only with the backends
    from kvconform.backends_under_test.registry import Loaded
    from kvconform.conformance.harness.applicability import NotApplicable
    from kvconform.reference.layouts import Layout

SUITE = "kvconform.conformance"


@functools.cache
def suite_dir() -> Path:
    return Path(inspect.getfile(importlib.import_module(SUITE))).parent.resolve()


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


def test_id(item) -> str | None:
    """``conformance/<file>::<name>``: the same for a checkout, an installed run and ``kvconform run``
    (None for an item that is not a check)."""
    return suite_test_id(f"{Path(item.path).name}::{item.name}")


def suite_test_id(nodeid: str) -> str | None:
    """The suite's test id of a pytest node id however the suite was started (a check module's
    path relative to wherever pytest found it), or None for a node that is not a check."""
    path, sep, name = nodeid.partition("::")
    file = Path(path).name
    return f"conformance/{file}::{name}" if sep and file.startswith("test_") and file.endswith(".py") else None


def must_pass() -> list[str]:
    """Every check of this suite version, ``conformance/<file>::<function>``: a certified run
    needs, for every backend it certifies, a record of each (passed, or not applicable by the
    backend's declaration); ``kvconform verify-submission`` holds a bundle to the list of the
    kvconform version that checks it; a run that collected none of a check is not complete."""
    checks = []
    for path in sorted(suite_dir().glob("test_*.py")):
        module = importlib.import_module(f"{SUITE}.{path.stem}")
        checks += [f"conformance/{path.name}::{name}" for name, obj in sorted(vars(module).items())
                   if name.startswith("test_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__]
    return checks


FAMILIES = ("shape", "split", "write", "shuffle", "swap", "copy", "read", "gating", "equivalence", "connector")
PLANNED = pytest.StashKey["Planned"]()


@dataclasses.dataclass(frozen=True)
class Planned:
    """What is known of one suite test before it runs (kept in ``item.stash[PLANNED]``)."""

    test_id: str
    loaded: Loaded
    layout: Layout | None
    family: str
    clauses: tuple[str, ...]
    repro: str
    needs: tuple[str, ...]  # the applicability needs it states (kvc_needs features)
    reason: NotApplicable | None = None  # it does not apply here, and why
    expected: str | None = None  # an expectations entry Fail/Crash: "expected Fail (FILE:LINE: reason)"
    skip: str | None = None  # an expectations entry Skip, in words

    @property
    def backend(self) -> str:
        return self.loaded.name

    def record_fields(self) -> dict:
        """The record's fields known before the test runs."""
        b = self.loaded.backend
        return {"nodeid": self.test_id, "backend": self.loaded.name, "platform": b.platform if b else "unknown", "arch": b.arch() if b else "",
                "family": self.family, "check": self.test_id.split("::")[1].split("[")[0], "repro": self.repro, "clauses": list(self.clauses),
                "layout": str(self.layout) if self.layout is not None else None}


def plan(item, run) -> Planned | None:
    """The plan of one suite test: identity, applicability, expectations; None for other items."""
    # Not at the top: this module loads in every pytest of the environment (hooks.py), and these
    # import the report library (~20-40 ms, measured) and torch.
    from kvconform.reports import expectations

    from ..harness.applicability import Context, needs_of, not_applicable

    callspec = getattr(item, "callspec", None)
    if callspec is None or "case_param" not in callspec.params:
        return None
    param = callspec.params["case_param"]
    loaded, backend = param.loaded, param.loaded.backend
    reason = param.reason
    if reason is None and backend is not None:
        ctx = Context(backend=backend, layout=param.layout, standard=run.options.standard, device=run.options.device,
                      huge=run.options.huge, compare_digests=run.compare is not None, devices=run.options.devices)
        reason = not_applicable(ctx, needs_of(item, callspec.params.get("golden_case")))
    identity = test_id(item)
    if identity is None:  # not a check module's test, though parametrized like one
        return None
    planned = Planned(
        test_id=identity, loaded=loaded, layout=param.layout, reason=reason,
        family=next((m.name for m in item.iter_markers() if m.name in FAMILIES), "other"),
        clauses=tuple(c for m in item.iter_markers("kvc_clause") for c in m.args),
        repro=repro_line(identity, loaded.spec, run.options.cli_args()),
        needs=tuple(m.args[0] for m in item.iter_markers("kvc_needs")),
    )
    known = None if reason or not run.expectations else expectations.first_match(run.expectations, identity, expectations.record_tags(planned.record_fields()))
    if known is None:
        return planned
    words = f"{known.file}:{known.line}: {known.reason}"
    if known.outcome == "Skip":
        return dataclasses.replace(planned, skip=f"expectation {words}")
    return dataclasses.replace(planned, expected=f"expected {known.outcome} ({words})")


class SuitePackage(pytest.Package):
    """The suite's directory, set up by importing its package (never by file path)."""

    def setup(self) -> None:
        importlib.import_module(SUITE)


class SuiteModule(pytest.Module):
    """A check module imported as ``kvconform.conformance.<name>``, and collected by the
    suite's own naming rules (a vendor's ``python_files``/``python_functions`` ini does not apply)."""

    def _getobj(self):  # pytest.Module's own import by file path (pytest 8 and 9; tests/test_plugin_surface.py pins it)
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


# ----------------------------------------------------------------------------- command lines
# The one place that spells a command line running the suite: for `kvconform run`, kvconform's
# own self-tests, and the repro line printed with every failure.
def suite_command(*pytest_args: str, python: str | None = None, target: str = SUITE) -> list[str]:
    """``python -m pytest --pyargs kvconform.conformance …``: runs the installed suite from any
    directory (in a checkout, the checkout's files: they are that package)."""
    return [python or sys.executable, "-m", "pytest", "--pyargs", target, "-p", "no:cacheprovider", *pytest_args]


def repro_line(test_id: str, backend: str, run_args: list[str]) -> str:
    """A shell line that re-runs exactly one test with this run's seed, profile, standard and
    device, from any directory: ``pytest --pyargs 'kvconform.conformance.test_x::test_y[…]' …``."""
    path, _, name = test_id.partition("::")
    module = path.removesuffix(".py").replace("/", ".")
    target = f"kvconform.{module}::{name}"
    return " ".join(shlex.quote(part) for part in ["pytest", "--pyargs", target, "--kvc-backend", backend, *run_args])
