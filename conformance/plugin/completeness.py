"""What narrowed or cut short a run: the reasons of the results document's ``completion``
object (docs/RESULTS_SCHEMA.md; wording and reading in kvconform.reports.completion).

Filters are read from the options that select tests (``-m``, ``-k``, ``--deselect``, ``--lf``,
arguments naming less than the whole suite); stops from how the session ended; and the selected
tests are matched with the verdicts recorded, so a test that never reported — whatever ended the
run — is counted.
"""

from __future__ import annotations

import shlex

from . import collection

INTERRUPTED, INTERNAL_ERROR = 2, 3  # pytest.ExitCode values


def filters(config, deselected: int = 0) -> list[dict]:
    """Options and arguments of this invocation that select a part of the suite; ``deselected``
    counts the checks deselected by anything (a plugin or conftest too)."""
    option = config.option
    found = []
    if getattr(option, "markexpr", ""):
        found.append(f"-m {shlex.quote(option.markexpr)}")
    if getattr(option, "keyword", ""):
        found.append(f"-k {shlex.quote(option.keyword)}")
    for nodeid in getattr(option, "deselect", None) or []:
        found.append(f"--deselect {shlex.quote(nodeid)}")
    if getattr(option, "lf", False):
        found.append("--last-failed")
    invocation = config.invocation_params.dir
    for arg in config.args:
        if collection.targets_suite(arg, option.pyargs, invocation) and not collection.names_whole_suite(arg, option.pyargs, invocation):
            found.append(f"argument {shlex.quote(str(arg))}")
    if not found and not deselected:
        return []
    counted = f" ({deselected} checks deselected)" if deselected else ""
    if not found:
        return [{"kind": "filtered", "what": f"{deselected} checks deselected by a plugin or conftest"}]
    return [{"kind": "filtered", "what": f"{', '.join(found)} select{'s' if len(found) == 1 else ''} part of the suite{counted}"}]


def count_checks(items) -> int:
    return sum(1 for item in items if collection.is_check_file(item.path))


class DeselectionTally:
    """On an xdist worker: how many checks it deselected, sent to the controller with the
    worker's output (the controller collects nothing itself)."""

    KEY = "kvconform_deselected"

    def __init__(self, config):
        self.config = config

    def pytest_deselected(self, items):
        output = self.config.workeroutput
        output[self.KEY] = output.get(self.KEY, 0) + count_checks(items)


def stops(session, exitstatus: int, collect_errors: list[str]) -> list[dict]:
    """How the session ended, when it ended before every selected test ran."""
    reasons = []
    if collect_errors:
        reasons.append({"kind": "collection-error", "what": f"{len(collect_errors)} module(s) failed to collect: {', '.join(collect_errors[:3])}"})
    if exitstatus == INTERRUPTED and not collect_errors:
        reasons.append({"kind": "interrupted", "what": str(session.shouldstop or "interrupted (Ctrl-C or SIGINT)")})
    elif exitstatus == INTERNAL_ERROR:
        reasons.append({"kind": "internal-error", "what": "pytest stopped with an internal error"})
    elif session.shouldfail or session.shouldstop:
        reasons.append({"kind": "stopped", "what": str(session.shouldfail or session.shouldstop)})
    return reasons


def missing_verdicts(selected: set[str] | None, with_verdict: set[str]) -> list[dict]:
    if selected is None:
        return []
    missing = sorted(selected - with_verdict)
    if not missing:
        return []
    return [{"kind": "no-verdict", "what": f"{len(missing)} selected test(s) have no result, e.g. {missing[0]}"}]
