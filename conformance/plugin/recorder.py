"""The result recorder: one record per test, collected on the pytest controller; at the end of
the run the JSON results (``kvconform-results/1``, docs/RESULTS_SCHEMA.md), the HTML report,
the JUnit annotations and the terminal matrix, all rendered by ``kvconform.reports`` from that JSON.

Records are keyed by the suite's stable test id, so xdist workers, reruns and teardown errors
collapse to one verdict. Properties recorded at collection (backend, family, layout, the
not-applicable reason) reach the controller with every phase report, so even a test whose
worker died mid-call keeps them.

The document says whether the run completed (``completion``, completeness.py): the tests it
selected are matched with the verdicts it recorded, and filters and early stops are named, so a
partial run is never shown as a green verdict (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import time
from pathlib import Path

import pytest

from kvconform.reports import expectations
from kvconform.reports.results import FAILING, SCHEMA, package_version, write_atomically

from . import collection, completeness
from .outputs import keep_complete_result

HYPOTHESIS_NOTES = re.compile(r"^(Failing test case:|Falsifying example:|Falsifying explicit example:)", re.MULTILINE)
FAILURE_PREFIX = "kvconform.conformance.harness.assertions.ConformanceFailure: "  # the property name starts the message
RECORD_FIELDS = ("backend", "platform", "arch", "family", "check", "layout", "geometry", "kv_cache_dtype", "model_dtype", "repro",
                 "clauses", "exercised")
COMPARE_CHECK = "test_digests_equal_the_exported_run"


def _skip_reason(report) -> str:
    return report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")


def timeout_dir(json_path: str) -> str:
    """Watchdog notes of the run writing ``json_path`` (one directory per results file, so runs
    writing other files beside it — ``kvconform run -j`` — never clear each other's)."""
    path = os.path.abspath(json_path)
    return os.path.join(os.path.dirname(path), ".timeouts", os.path.basename(path))


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
        return split_draw(crash.message if crash is not None else str(report.longrepr))[0]
    return ""


def split_draw(message: str) -> tuple[str, str | None]:
    """(the check's own message, Hypothesis' notes on the failing example — or None)."""
    message = message.removeprefix(FAILURE_PREFIX)
    found = HYPOTHESIS_NOTES.search(message)
    if not found:
        return message, None
    return message[: found.start()].rstrip(), message[found.start():]


def run_platform() -> str:
    """Where this process runs: ``cpu``, ``cuda-sm90``, ``rocm-gfx942`` (a backend's own platform
    may be a model of another: reference_gfx942 on a CPU)."""
    import torch

    if not torch.cuda.is_available():
        return "cpu"
    if torch.version.hip:
        return "rocm-" + torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability()
    return f"cuda-sm{major}{minor}"


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
        "run_platform": run_platform() if not options.device.startswith("cpu") else "cpu",
        "seed": options.seed, "profile": options.profile, "standard": options.standard,
        "backends": backends,
    }


class ResultRecorder:
    """A pytest plugin object: one record per test; JSON, HTML, JUnit and the terminal matrix at the end."""

    def __init__(self, run, environment: dict, lock=None):
        shutil.rmtree(timeout_dir(run.options.json_path), ignore_errors=True)
        self.run = run
        self.environment = environment
        self.lock = lock
        self.records: dict[str, dict] = {}
        self.props: dict[str, dict] = {}  # per pytest node id, from every phase (a crash report has none)
        self.stale_expectations: list[dict] = []
        self.selected: set[str] | None = None  # node ids of the kvconform tests this run selected
        self.collect_errors: list[str] = []
        self.deselected = 0  # checks deselected by anything (-m, -k, a plugin)
        self.completion: dict | None = None  # set at the end of the session
        self.notes: list[tuple[str, str]] = []  # (style, line) for the terminal summary
        self.written = False

    # ------------------------------------------------------------------ what was selected
    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(report.nodeid or "<session>")

    def pytest_collection_finish(self, session):
        if session.items:  # xdist's controller collects nothing: its workers report below
            self.selected = {item.nodeid for item in session.items if "test_id" in dict(item.user_properties)}

    def pytest_deselected(self, items):
        self.deselected += completeness.count_checks(items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        self.deselected = max(self.deselected, getattr(node, "workeroutput", {}).get(completeness.DeselectionTally.KEY, 0))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.selected is None:  # node ids name the check module relative to where pytest found it
            self.selected = {i for i in ids if collection.is_check_file(collection.suite_dir() / Path(i.split("::")[0]).name)}

    # ------------------------------------------------------------------ verdicts
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
            "run_platform": self.environment.get("run_platform"),
            "seed": self.run.options.seed, "outcome": outcome,
            "duration_s": round(report.duration, 4), "message": message_of(report, outcome, props),
            "not_applicable": props.get("not_applicable") if outcome == "not-applicable" else None,
            "failure": props.get("failure"), "raised": this_phase.get("raised"),
            "digest": props.get("digest"), "hypothesis_draw": self._draw(report, outcome),
            "interop": props.get("interop"),
            # cases of this test that could not run here while others did (examples.py)
            "examples_not_applicable": props.get("examples_not_applicable"), "block_sizes": props.get("block_sizes"),
        }

    @staticmethod
    def _draw(report, outcome: str) -> str | None:
        crash = getattr(report.longrepr, "reprcrash", None) if outcome in FAILING else None
        return split_draw(crash.message)[1] if crash is not None else None

    # ------------------------------------------------------------------ the end of the run
    def _completion(self, session, exitstatus: int) -> dict:
        with_verdict = {nodeid for nodeid, props in self.props.items() if props.get("test_id") in self.records}
        reasons = [
            *completeness.stops(session, exitstatus, self.collect_errors),
            *completeness.filters(session.config, self.deselected),
            *completeness.missing_verdicts(self.selected, with_verdict),
        ]
        if self.run.compare is not None:
            compared = [r for r in self.records.values() if r["check"] == COMPARE_CHECK and r["outcome"] != "not-applicable"]
            if not compared:
                reasons.append({"kind": "nothing-compared", "what": f"--kvc-compare-digests {self.run.compare['path']}: no entry matches a "
                                "(layout, golden case) this run wrote, so nothing was compared"})
        if not self.records and not reasons:
            reasons.append({"kind": "no-tests", "what": "no kvconform check was selected"})
        return {
            "complete": not reasons, "reasons": reasons,
            "selected": len(self.selected) if self.selected is not None else None, "recorded": len(self.records),
            "exit_status": int(exitstatus), "backends": list(self.run.backends),
            "backends_left_out": self.run.left_out,
        }

    def document(self) -> dict:
        return {
            "schema": SCHEMA, "created_unix": int(time.time()), "environment": self.environment,
            "completion": self.completion,
            "stale_expectations": self.stale_expectations,
            "tests": sorted(self.records.values(), key=lambda r: r["nodeid"]),
        }

    @property
    def html_path(self) -> str:
        options = self.run.options
        return options.html_path or os.path.splitext(options.json_path)[0] + ".html"

    @pytest.hookimpl(trylast=True)  # after pytest's JUnit writer: its file is annotated here
    def pytest_sessionfinish(self, session, exitstatus):
        if session.config.option.collectonly:
            return
        options = self.run.options
        records = list(self.records.values())
        self.completion = self._completion(session, exitstatus)
        self.stale_expectations = [
            {"file": e.file, "line": e.line, "pattern": e.pattern, "reason": e.reason}
            for e in expectations.stale(self.run.expectations, records)
        ]
        if options.export_digests:
            from ..harness.digests import export

            export(options.export_digests, records)
        if options.update_expectations:
            self._update_expectations(session, records)
        if any(r["kind"] == "nothing-compared" for r in self.completion["reasons"]) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.completion["exit_status"] = int(session.exitstatus)
        document = self.document()
        if not self.completion["complete"]:
            kept = keep_complete_result(options.json_path, self.html_path)
            if kept:
                self.notes.append(("yellow", f"kvconform: {options.json_path} held a complete run; kept it as {kept}"))
        from kvconform.reports.html import render_runs

        write_atomically(options.json_path, json.dumps(document, indent=1, default=str))
        write_atomically(self.html_path, render_runs([document]))
        self.written = True
        xml_path = getattr(session.config.option, "xmlpath", None)
        if xml_path and os.path.exists(xml_path):
            from kvconform.reports.junit import annotate

            with open(xml_path, encoding="utf-8") as fh:
                write_atomically(xml_path, annotate(fh.read(), document))

    def _update_expectations(self, session, records) -> None:
        target = self.run.options.update_expectations
        stopped = [r for r in self.completion["reasons"] if r["kind"] not in ("filtered", "nothing-compared")]
        if stopped:
            self.notes.append(("red", f"kvconform: REFUSED to update {target}: the run did not finish "
                                      f"({'; '.join(r['what'] for r in stopped)}); the file is unchanged"))
            if session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        existing_text = open(target, encoding="utf-8").read() if os.path.exists(target) else None
        existing = expectations.parse(target) if existing_text is not None else []
        result = expectations.update(existing_text, existing, records, self.run.expectations)
        write_atomically(target, result.text)
        self.notes.append(("", f"kvconform: updated expectations {target}: {result.added} new failure(s) added as 'untriaged', "
                               f"{len(result.removed)} fixed entr{'y' if len(result.removed) == 1 else 'ies'} removed, "
                               f"{result.kept_failing} still failing kept, {result.kept_outside} outside this run's selection kept"))
        for entry in result.kept_wildcards_passing:
            self.notes.append(("yellow", f"kvconform: {entry.file}:{entry.line} {entry.pattern} matches only passing tests in this run; "
                                         "kept (it may cover tests elsewhere): narrow or remove it by hand"))

    def pytest_terminal_summary(self, terminalreporter):
        if not self.written:
            return
        from kvconform.reports.terminal import render

        terminalreporter.write_sep("=", "kvconform")
        width = terminalreporter._tw.fullwidth
        terminalreporter.write(render([self.document()], color=terminalreporter.hasmarkup, width=width))
        if self.run.left_out:
            left = ", ".join(f"{name} ({why})" for name, why in self.run.left_out.items())
            terminalreporter.write_line(f"kvconform: built-in backends not in this run: {left}", yellow=True)
        for entry in self.stale_expectations:
            terminalreporter.write_line(f"kvconform: WARNING stale expectation {entry['file']}:{entry['line']} {entry['pattern']} matches no test that ran", yellow=True)
        for record in self.records.values():
            if record["outcome"] == "unexpected-pass":
                terminalreporter.write_line(f"kvconform: UNEXPECTED PASS {record['nodeid']} ({record['message']}) — remove it from the expectations", yellow=True)
        for style, line in self.notes:
            terminalreporter.write_line(line, **({style: True} if style else {}))
        if self.lock is not None and self.lock.taken_over is not None:
            pid = self.lock.taken_over.get("pid", "?")
            terminalreporter.write_line(f"kvconform: an earlier run (pid {pid}) writing this results file ended without finishing; "
                                        "its results were never written", yellow=True)
        terminalreporter.write_line(f"kvconform: results {os.path.abspath(self.run.options.json_path)}")
        terminalreporter.write_line(f"kvconform: HTML report {os.path.abspath(self.html_path)}")

    def pytest_unconfigure(self, config):
        if self.lock is not None:
            self.lock.release()
