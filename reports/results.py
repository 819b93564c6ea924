"""Per-test result records, collected on the pytest controller; JSON + HTML written atomically.

The JSON schema is documented in docs/RESULTS_SCHEMA.md (``kvconform-results/1``). Records
are keyed by node id, so xdist workers, reruns and teardown errors collapse to one verdict.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shutil
import time

SCHEMA = "kvconform-results/1"
NOT_APPLICABLE = "not applicable: "
OUTCOMES = (
    "passed", "failed", "error", "crashed", "timeout", "not-applicable",
    "expected-failure", "unexpected-pass", "skipped",
)
FAILING = frozenset({"failed", "error", "crashed", "timeout"})


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")


def timeout_dir(config) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(config.getoption("kvc_json"))), ".timeouts")


def _marker(config, nodeid: str) -> str:
    return os.path.join(timeout_dir(config), "".join(c if c.isalnum() else "_" for c in nodeid)[:200])


def mark_timeout(config, nodeid: str) -> None:
    """Leave a note (from the dying worker) that ``nodeid`` was ended by the watchdog."""
    os.makedirs(timeout_dir(config), exist_ok=True)
    with open(_marker(config, nodeid), "w") as fh:
        fh.write(nodeid)


def timed_out(config, nodeid: str) -> bool:
    return os.path.exists(_marker(config, nodeid))


def outcome_of(report) -> str | None:
    """The record outcome of one phase report, or None when the phase adds nothing."""
    text = str(report.longrepr or "") if report.failed else ""
    if "crashed while running" in text:  # pytest-xdist: the worker process died in this test
        return "crashed"
    if hasattr(report, "wasxfail"):
        return "unexpected-pass" if report.passed else "expected-failure"
    if report.skipped:
        return "not-applicable" if NOT_APPLICABLE in _skip_reason(report) else "skipped"
    if report.when == "call":
        return "passed" if report.passed else "failed"
    return "error" if report.failed else None


def message_of(report, outcome: str) -> str:
    if outcome in ("not-applicable", "skipped"):
        return _skip_reason(report)
    if outcome in ("expected-failure", "unexpected-pass"):
        return str(report.wasxfail)
    if outcome in FAILING:
        crash = getattr(report.longrepr, "reprcrash", None)
        return crash.message if crash is not None else str(report.longrepr)
    return ""


def read_json(path: str, what: str, error: type[Exception]) -> dict:
    """Load a JSON file or raise ``error`` naming the file and what it should have been."""
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise error(f"{path}: not a readable {what} ({exc})") from exc


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: readers never see half a file."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.replace(tmp, path)


def environment(config, backends: dict) -> dict:
    """Run-level facts every record is read against."""
    import torch

    device = config._kvc_device
    return {
        "suite_version": package_version("kvconform") or "unknown",
        "python": platform.python_version(),
        "torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda,
        "triton": package_version("triton") or package_version("pytorch-triton-rocm"),
        "vllm": package_version("vllm"),
        "device": device,
        "device_name": torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu",
        "seed": config.getoption("seed"), "profile": config.getoption("profile"),
        "standard": config.getoption("standard"),
        "backends": backends,
    }


class ResultRecorder:
    """A pytest plugin object: one record per test; JSON, HTML and the terminal matrix at the end."""

    def __init__(self, config, environment: dict):
        shutil.rmtree(timeout_dir(config), ignore_errors=True)
        self.config = config
        self.environment = environment
        self.records: dict[str, dict] = {}
        self.props: dict[str, dict] = {}  # per node id, from every phase (a crash report has none)
        self.stale_expectations: list[dict] = []

    def pytest_runtest_logreport(self, report):
        nodeid = report.nodeid.split("@", 1)[0]  # xdist --dist loadgroup appends "@group"
        props = self.props.setdefault(nodeid, {})
        this_phase = dict(report.user_properties)
        props.update(this_phase)
        outcome = outcome_of(report)
        if outcome == "crashed" and timed_out(self.config, nodeid):
            outcome = "timeout"
        if outcome == "failed" and this_phase.get("raised"):
            outcome = "error"
        if outcome is None or "backend" not in props:
            return
        previous = self.records.get(nodeid)
        if previous and previous["outcome"] in FAILING:
            return  # a teardown error after a failure keeps the first verdict
        self.records[nodeid] = {
            "nodeid": nodeid,
            **{k: props.get(k) for k in ("backend", "platform", "arch", "family", "check", "layout", "geometry", "kv_cache_dtype", "model_dtype", "repro")},
            "seed": self.config.getoption("seed"), "outcome": outcome,
            "duration_s": round(report.duration, 4), "message": message_of(report, outcome),
            "failure": props.get("failure"), "raised": this_phase.get("raised"),
            "digest": props.get("digest"),
        }

    def document(self) -> dict:
        return {
            "schema": SCHEMA, "created_unix": int(time.time()), "environment": self.environment,
            "stale_expectations": self.stale_expectations,
            "tests": sorted(self.records.values(), key=lambda r: r["nodeid"]),
        }

    @property
    def json_path(self) -> str:
        return self.config.getoption("kvc_json")

    @property
    def html_path(self) -> str:
        return self.config.getoption("kvc_html") or os.path.splitext(self.json_path)[0] + ".html"

    def pytest_sessionfinish(self, session):
        if not self.records:
            return
        from . import expectations
        from .html import render_runs

        entries = self.config._kvc_expectations
        self.stale_expectations = [
            {"file": e.file, "line": e.line, "pattern": e.pattern, "reason": e.reason}
            for e in expectations.stale(entries, list(self.records.values()))
        ]
        if self.config.getoption("export_digests"):
            from .digests import export

            export(self.config.getoption("export_digests"), list(self.records.values()))
        update = self.config.getoption("update_expectations")
        if update:
            write_atomically(update, expectations.baseline(list(self.records.values()), entries))
        document = self.document()
        write_atomically(self.json_path, json.dumps(document, indent=1, default=str))
        write_atomically(self.html_path, render_runs([document]))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.records:
            return
        from .terminal import print_matrix

        print_matrix(terminalreporter, [self.document()])
        for entry in self.stale_expectations:
            terminalreporter.write_line(f"kvconform: WARNING stale expectation {entry['file']}:{entry['line']} {entry['pattern']} matches no test that ran", yellow=True)
        for record in self.records.values():
            if record["outcome"] == "unexpected-pass":
                terminalreporter.write_line(f"kvconform: UNEXPECTED PASS {record['nodeid']} ({record['message']}) — remove it from the expectations", yellow=True)
        if self.config.getoption("update_expectations"):
            terminalreporter.write_line(f"kvconform: wrote expectations baseline {self.config.getoption('update_expectations')}")
        terminalreporter.write_line(f"kvconform: results {os.path.abspath(self.json_path)}")
        terminalreporter.write_line(f"kvconform: HTML report {os.path.abspath(self.html_path)}")
