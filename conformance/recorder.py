"""The result recorder: one record per test, collected on the pytest controller; at the end of
the run the JSON results (``kvconform-results/1``, docs/RESULTS_SCHEMA.md), the HTML report
and the terminal matrix, all rendered by ``kvconform.reports`` from that JSON.

Records are keyed by the suite's stable test id, so xdist workers, reruns and teardown errors
collapse to one verdict. Properties recorded at collection (backend, family, layout, the
not-applicable reason) reach the controller with every phase report, so even a test whose
worker died mid-call keeps them.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time

from kvconform.reports import expectations
from kvconform.reports.results import FAILING, SCHEMA, package_version, write_atomically

RECORD_FIELDS = ("backend", "platform", "arch", "family", "check", "layout", "geometry", "kv_cache_dtype", "model_dtype", "repro")


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")


def timeout_dir(json_path: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(json_path)), ".timeouts")


def _marker(json_path: str, test_id: str) -> str:
    return os.path.join(timeout_dir(json_path), "".join(c if c.isalnum() else "_" for c in test_id)[:200])


def mark_timeout(json_path: str, test_id: str) -> None:
    """Leave a note (from the dying worker) that ``test_id`` was ended by the watchdog."""
    os.makedirs(timeout_dir(json_path), exist_ok=True)
    with open(_marker(json_path, test_id), "w") as fh:
        fh.write(test_id)


def outcome_of(report, props: dict) -> str | None:
    """The record outcome of one phase report, or None when the phase adds nothing."""
    text = str(report.longrepr or "") if report.failed else ""
    if "crashed while running" in text:  # pytest-xdist: the worker process died in this test
        return "crashed"
    if hasattr(report, "wasxfail"):
        return "unexpected-pass" if report.passed else "expected-failure"
    if report.skipped:
        return "not-applicable" if props.get("not_applicable") else "skipped"
    if report.when == "call":
        return "passed" if report.passed else "failed"
    return "error" if report.failed else None


def message_of(report, outcome: str, props: dict) -> str:
    if outcome == "not-applicable":
        reason = props["not_applicable"]
        return f"{reason['who']} {reason['what']}"
    if outcome == "skipped":
        return _skip_reason(report)
    if outcome in ("expected-failure", "unexpected-pass"):
        return str(report.wasxfail)
    if outcome in FAILING:
        crash = getattr(report.longrepr, "reprcrash", None)
        return crash.message if crash is not None else str(report.longrepr)
    return ""


def environment(run, backends: dict) -> dict:
    """Run-level facts every record is read against."""
    import torch

    options = run.options
    return {
        "suite_version": package_version("kvconform") or "unknown",
        "python": platform.python_version(),
        "torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda,
        "triton": package_version("triton") or package_version("pytorch-triton-rocm"),
        "vllm": package_version("vllm"),
        "device": options.device,
        "device_name": torch.cuda.get_device_name() if options.device.startswith("cuda") else platform.processor() or "cpu",
        "seed": options.seed, "profile": options.profile, "standard": options.standard,
        "backends": backends,
    }


class ResultRecorder:
    """A pytest plugin object: one record per test; JSON, HTML and the terminal matrix at the end."""

    def __init__(self, run, environment: dict):
        shutil.rmtree(timeout_dir(run.options.json_path), ignore_errors=True)
        self.run = run
        self.environment = environment
        self.records: dict[str, dict] = {}
        self.props: dict[str, dict] = {}  # per pytest node id, from every phase (a crash report has none)
        self.stale_expectations: list[dict] = []

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid.split("@", 1)[0]  # xdist --dist loadgroup appends "@group"
        props = self.props.setdefault(nodeid, {})
        this_phase = dict(report.user_properties)
        props.update(this_phase)
        if "test_id" not in props:
            return  # not a kvconform check
        test_id = props["test_id"]
        outcome = outcome_of(report, props)
        if outcome == "crashed" and os.path.exists(_marker(self.run.options.json_path, test_id)):
            outcome = "timeout"
        if outcome == "failed" and this_phase.get("raised"):
            outcome = "error"
        if outcome is None:
            return
        previous = self.records.get(test_id)
        if previous and previous["outcome"] in FAILING:
            return  # a teardown error after a failure keeps the first verdict
        self.records[test_id] = {
            "nodeid": test_id,
            **{k: props.get(k) for k in RECORD_FIELDS},
            "seed": self.run.options.seed, "outcome": outcome,
            "duration_s": round(report.duration, 4), "message": message_of(report, outcome, props),
            "not_applicable": props.get("not_applicable") if outcome == "not-applicable" else None,
            "failure": props.get("failure"), "raised": this_phase.get("raised"),
            "digest": props.get("digest"),
            # cases of this test that could not run here while others did (examples.py)
            "examples_not_applicable": props.get("examples_not_applicable"), "block_sizes": props.get("block_sizes"),
        }

    def document(self) -> dict:
        return {
            "schema": SCHEMA, "created_unix": int(time.time()), "environment": self.environment,
            "stale_expectations": self.stale_expectations,
            "tests": sorted(self.records.values(), key=lambda r: r["nodeid"]),
        }

    @property
    def html_path(self) -> str:
        options = self.run.options
        return options.html_path or os.path.splitext(options.json_path)[0] + ".html"

    def pytest_sessionfinish(self, session):
        if not self.records:
            return
        from kvconform.reports.html import render_runs

        options = self.run.options
        records = list(self.records.values())
        self.stale_expectations = [
            {"file": e.file, "line": e.line, "pattern": e.pattern, "reason": e.reason}
            for e in expectations.stale(self.run.expectations, records)
        ]
        if options.export_digests:
            from .digests import export

            export(options.export_digests, records)
        if options.update_expectations:
            write_atomically(options.update_expectations, expectations.baseline(records, self.run.expectations))
        document = self.document()
        write_atomically(options.json_path, json.dumps(document, indent=1, default=str))
        write_atomically(self.html_path, render_runs([document]))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.records:
            return
        from kvconform.reports.terminal import render

        terminalreporter.write_sep("=", "kvconform")
        width = max(100, terminalreporter._tw.fullwidth)
        terminalreporter.write(render([self.document()], color=terminalreporter.hasmarkup, width=width))
        for entry in self.stale_expectations:
            terminalreporter.write_line(f"kvconform: WARNING stale expectation {entry['file']}:{entry['line']} {entry['pattern']} matches no test that ran", yellow=True)
        for record in self.records.values():
            if record["outcome"] == "unexpected-pass":
                terminalreporter.write_line(f"kvconform: UNEXPECTED PASS {record['nodeid']} ({record['message']}) — remove it from the expectations", yellow=True)
        if self.run.options.update_expectations:
            terminalreporter.write_line(f"kvconform: wrote expectations baseline {self.run.options.update_expectations}")
        terminalreporter.write_line(f"kvconform: results {os.path.abspath(self.run.options.json_path)}")
        terminalreporter.write_line(f"kvconform: HTML report {os.path.abspath(self.html_path)}")
