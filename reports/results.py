"""Per-test result records, collected on the pytest controller and written atomically.

Schema ``kvconform-results/1``: ``{"schema", "created_unix", "environment", "tests": [...]}``;
each test record holds ``nodeid, backend, family, check, layout, geometry, kv_cache_dtype,
seed, outcome, duration_s, message``. ``outcome`` is one of passed, failed, error,
not-applicable, skipped.
"""

from __future__ import annotations

import json
import os
import time

RESULTS_SCHEMA = "kvconform-results/1"
NOT_APPLICABLE = "not applicable: "


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")


def outcome_of(report) -> str | None:
    """The record outcome of one phase report, or None when the phase adds nothing."""
    if report.skipped:
        return "not-applicable" if NOT_APPLICABLE in _skip_reason(report) else "skipped"
    if report.when == "call":
        return "passed" if report.passed else "failed"
    return "error" if report.failed else None


def message_of(report, outcome: str) -> str:
    if outcome in ("not-applicable", "skipped"):
        return _skip_reason(report)
    if outcome in ("failed", "error"):
        crash = getattr(report.longrepr, "reprcrash", None)
        return crash.message if crash is not None else str(report.longrepr)
    return ""


def write_atomically(path: str, document: dict) -> None:
    """Write JSON to ``path`` via a temporary file and rename: readers never see half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(document, fh, indent=1, default=str)
    os.replace(tmp, path)


class ResultRecorder:
    """A pytest plugin object: one record per test, JSON at session end."""

    def __init__(self, config, environment: dict):
        self.config = config
        self.environment = environment
        self.records: dict[str, dict] = {}

    def pytest_runtest_logreport(self, report):
        props = dict(report.user_properties)
        outcome = outcome_of(report)
        if outcome is None or "backend" not in props:
            return
        previous = self.records.get(report.nodeid)
        if previous and previous["outcome"] in ("failed", "error"):
            return  # a teardown error after a failure keeps the first verdict
        self.records[report.nodeid] = {
            "nodeid": report.nodeid, **props, "seed": self.config.getoption("seed"), "outcome": outcome,
            "duration_s": round(report.duration, 4), "message": message_of(report, outcome),
        }

    def pytest_sessionfinish(self, session):
        if not self.records:
            return
        write_atomically(self.config.getoption("kvc_json"), {
            "schema": RESULTS_SCHEMA, "created_unix": int(time.time()),
            "environment": self.environment, "tests": list(self.records.values()),
        })
