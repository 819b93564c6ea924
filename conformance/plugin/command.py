"""The one place that spells a command line running the suite: for ``kvconform run``, for
kvconform's own self-tests, and for the repro line printed with every failure."""

from __future__ import annotations

import shlex
import sys

from .collection import SUITE


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
