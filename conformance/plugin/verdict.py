"""The verdict of one test: the one place an outcome is decided.

:func:`decide` turns one phase of a test (setup, call, teardown: what it raised, if anything)
and what was planned for it at collection (a not-applicable reason, an expectations entry) into
a :class:`Verdict`; :func:`combine` keeps a test's first failing phase; :func:`crashed` is the
verdict of a test whose process died (decided on the xdist controller, from the watchdog's note).
:func:`tell_pytest` makes pytest's own report agree, so pytest's exit status, summary line and
JUnit count known failures as xfailed and not-applicable checks as skipped.

Outcomes (kvconform.reports.results): passed; failed (a kvconform assertion); error (anything
else raised, or a setup/teardown failure); crashed / timeout (the process died / the watchdog
ended it); not-applicable (with a typed reason: harness/applicability.py); expected-failure /
unexpected-pass / skipped (an expectations entry Fail or Crash / the same entry passed / Skip).
"""

from __future__ import annotations

import dataclasses
import sys

from kvconform.reports.results import (CRASHED, ERROR, EXPECTED_FAILURE, FAILED, FAILING, NOT_APPLICABLE, PASSED, SKIPPED,
                                       TIMEOUT, UNEXPECTED_PASS)

from ..harness.applicability import NotApplicable, reason_of

XDIST_CRASH = "crashed while running"  # pytest-xdist's report of a worker that died in a test


@dataclasses.dataclass(frozen=True)
class Verdict:
    outcome: str
    message: str = ""
    not_applicable: NotApplicable | None = None
    failure: dict | None = None  # a kvconform assertion's structured details
    raised: str | None = None  # the exception type, for an error
    hypothesis_draw: str | None = None  # Hypothesis' notes on the failing example

    def record_fields(self) -> dict:
        return {"outcome": self.outcome, "message": self.message, "failure": self.failure, "raised": self.raised,
                "hypothesis_draw": self.hypothesis_draw,
                "not_applicable": self.not_applicable.as_record() if self.not_applicable else None}


def decide(when: str, exc: BaseException | None, skipped: bool, planned, case=None) -> Verdict | None:
    """The verdict of one phase, or None when the phase adds nothing (a setup or teardown that passed).

    ``exc``: what the phase raised; ``skipped``: pytest skipped it (the plugin's setup skips a
    test planned not applicable, or one an expectations entry skips); ``planned``: the test's
    collection.Planned; ``case``: its case fixture, once made (per-example applicability)."""
    expected = planned.expected
    if skipped:
        if planned.reason is not None:
            return Verdict(NOT_APPLICABLE, str(planned.reason), not_applicable=planned.reason)
        return Verdict(SKIPPED, planned.skip or str(exc or ""))
    if _oracle_changed(exc):  # a void result: never waived as a known failure, never not applicable
        return Verdict(ERROR, str(exc), raised=type(exc).__name__)
    reason = reason_of(exc, planned.backend, case) if exc is not None else None
    if reason is not None:  # never an expected failure: a case that cannot run here is not known to fail
        return Verdict(NOT_APPLICABLE, str(reason), not_applicable=reason)
    if exc is None:
        if when != "call":
            return None
        return Verdict(UNEXPECTED_PASS, expected) if expected else Verdict(PASSED)
    failure = getattr(exc, "details", None)
    outcome = FAILED if when == "call" and isinstance(exc, AssertionError) else ERROR
    notes = "\n".join(getattr(exc, "__notes__", ()))  # Hypothesis' "Falsifying example: …"
    message = str(exc) or type(exc).__name__
    if expected:
        return Verdict(EXPECTED_FAILURE, f"{expected}: {message.splitlines()[0]}", failure=failure,
                       hypothesis_draw=notes or None)
    return Verdict(outcome, message, failure=failure, raised=None if outcome == FAILED else type(exc).__name__,
                   hypothesis_draw=notes or None)


def _oracle_changed(exc) -> bool:
    # looked up, not imported: the guard imports torch, this module loads without it (none
    # can have been raised before the guard was imported)
    guard = sys.modules.get("kvconform.conformance.harness.oracle_guard")
    return guard is not None and isinstance(exc, guard.OracleChanged)


def combine(earlier: Verdict | None, later: Verdict | None) -> Verdict | None:
    """A test's verdict over its phases: the first failure stands (a teardown error after a
    failure does not replace it); otherwise the latest phase that said something."""
    if earlier is not None and (earlier.outcome in FAILING or earlier.outcome == EXPECTED_FAILURE):
        return earlier
    return later or earlier


def crashed(planned_expected: str | None, timed_out: bool, detail: str) -> Verdict:
    """The verdict of a test whose process died while running it (xdist restarts the worker)."""
    outcome = TIMEOUT if timed_out else CRASHED
    if planned_expected:
        return Verdict(EXPECTED_FAILURE, f"{planned_expected}: {outcome}")
    return Verdict(outcome, detail)


def is_crash_report(report) -> bool:
    return report.failed and XDIST_CRASH in str(report.longrepr or "")


def tell_pytest(report, verdict: Verdict | None) -> None:
    """Make pytest's report say what the verdict says (its exit status and summary follow)."""
    if verdict is None:
        return
    if verdict.outcome == NOT_APPLICABLE:
        report.outcome = "skipped"
        report.longrepr = (str(report.fspath), report.location[1] or 0, f"not applicable: {verdict.message}")
    elif verdict.outcome == EXPECTED_FAILURE:
        report.outcome = "skipped"
        report.wasxfail = verdict.message
    elif verdict.outcome == UNEXPECTED_PASS:
        report.outcome = "passed"
        report.wasxfail = verdict.message
