"""The result recorder: one :class:`TestRecord` per test, collected on the pytest controller;
at the end of the run the JSON results (``kvconform-results/1``, docs/RESULTS_SCHEMA.md), the
HTML report, the JUnit annotations and the terminal report, all rendered by
``kvconform.reports`` from that JSON.

What crosses the xdist boundary is one property per phase report, ``kvconform``: the test's
planned fields, its facts and its verdict so far (:func:`payload`). Records are keyed by the
suite's stable test id. A crash report (the worker died) carries nothing: its verdict is made
here from the last payload of the same test (verdict.crashed).

The document says whether the run completed (``completion``, py): the tests it
selected are matched with the verdicts it recorded, and filters and early stops are named, so a
partial run is never shown as a green verdict (docs/RELIABILITY.md). A session that ran no
test at all (``--collect-only``, ``--fixtures``) writes nothing.
"""

from __future__ import annotations

import os
import platform
import shlex
import time
from pathlib import Path

import pytest
import torch

from kvconform.reports import expectations
from kvconform.reports.results import EXPECTED_FAILURE, FAILING, NOT_APPLICABLE, SCHEMA, SKIPPED, UNEXPECTED_PASS, TestRecord, document_text, package_version, result_digest, write_atomically

from ..harness.digests import export
from . import collection, verdict, watchdog
from .options import runs_no_tests
from .outputs import set_aside, settle_previous


# ----------------------------------------------------------------------------- completion
# What narrowed or cut short a run: the reasons of the results document's ``completion`` object
# (docs/RESULTS_SCHEMA.md; wording and reading in kvconform.reports.results). Filters are read
# from the options that select tests (-m, -k, --deselect, --lf, arguments naming less than the
# whole suite); stops from how the session ended; and the selected tests are matched with the
# verdicts recorded, so a test that never reported — whatever ended the run — is counted.
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


class DeselectionTally:
    """How many of the suite's tests were deselected (``-m``, ``-k``, a plugin that says so) and
    how many were *dropped* at collection without being reported deselected (a plugin or
    conftest that removes items from the list): on an xdist worker sent to the controller with
    the worker's output (the controller collects nothing itself); without xdist the recorder
    reads it. The tests the suite generated are counted before any other plugin's
    ``pytest_collection_modifyitems`` runs, and the ones left after all of them."""

    KEY = "kvconform_deselected"
    DROPPED = "kvconform_dropped"

    def __init__(self, config):
        self.config = config
        self.deselected: set[str] = set()
        self.missing: set[str] = set()  # generated, then gone from the list after every plugin's changes

    def pytest_deselected(self, items):
        self.deselected |= {item.nodeid for item in items if collection.is_check_file(item.path)}
        self._send()

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # the outermost wrapper: around every plugin's changes
    def pytest_collection_modifyitems(self, items):
        generated = {item.nodeid for item in items if collection.is_check_file(item.path)}
        result = yield
        self.missing = generated - {item.nodeid for item in items}
        self._send()
        return result

    def counts(self) -> tuple[int, tuple[str | None, int]]:
        """(checks deselected, (the first test dropped or None, how many were dropped))."""
        dropped = sorted(self.missing - self.deselected)
        return len(self.deselected), (dropped[0] if dropped else None, len(dropped))

    def _send(self) -> None:
        output = getattr(self.config, "workeroutput", None)
        if output is not None:
            output[self.KEY], output[self.DROPPED] = self.counts()


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


def not_collected(selected: set[str] | None) -> list[dict]:
    """Checks of the suite of which no test was collected although nothing filtered the run
    (``--ignore``, a plugin or conftest dropping items without reporting them deselected)."""
    if not selected:
        return []
    collected = {test_id.split("[")[0] for test_id in map(collection.suite_test_id, selected) if test_id}
    missing = [check for check in collection.must_pass() if check not in collected]
    if not missing:
        return []
    return [{"kind": "not-collected", "what": f"{len(missing)} check(s) of the suite were never collected, e.g. {missing[0]} "
                                              "(--ignore, or a plugin or conftest that dropped them)"}]


def dropped_tests(first: str | None, count: int) -> list[dict]:
    """Tests the suite generated that a plugin or conftest removed at collection without reporting
    them deselected (a check keeps other parametrizations, so the check names are all there)."""
    if not count or first is None:  # a count has its first test
        return []
    return [{"kind": "not-collected", "what": f"{count} test(s) the suite generated were dropped at collection without being "
                                              f"reported deselected, e.g. {collection.suite_test_id(first) or first} (a plugin or conftest removed them)"}]


def skipped_by_expectations(records: dict, entries: list) -> list[dict]:
    """Checks an expectations entry Skip kept from running: never a pass, so the run is not
    complete; those of a wildcard entry (``*``, ``?``) counted apart, with the first such entry."""
    skipped = [r for r in records.values() if r.outcome == SKIPPED]
    if not skipped:
        return []
    by = [expectations.first_match(entries, r.nodeid, expectations.record_tags(r.as_json())) if entries else None for r in skipped]
    wild = [e for e in by if e is not None and not e.is_exact]
    counted = (f" ({len(wild)} by wildcard entries, e.g. {wild[0].file}:{wild[0].line} {wild[0].pattern})" if wild else "")
    return [{"kind": "skipped", "what": f"{len(skipped)} check(s) skipped by expectations entries, never run{counted}"}]


def missing_verdicts(selected: set[str] | None, with_verdict: set[str]) -> list[dict]:
    if selected is None:
        return []
    missing = sorted(selected - with_verdict)
    if not missing:
        return []
    return [{"kind": "no-verdict", "what": f"{len(missing)} selected test(s) have no result, e.g. {missing[0]}"}]


def payload(planned, state: dict, case) -> dict:
    """What one phase report carries to the controller: the record so far, and what a crash
    verdict needs (serialised once, as plain JSON types)."""
    decided = state["verdict"]
    facts = {name: value for name, value in case.facts.as_record_fields().items() if value is not None} if case is not None else {}
    return {"record": {**planned.record_fields(), **facts, "duration_s": round(state["duration_s"], 4),
                       **(decided.record_fields() if decided else {})},
            "decided": decided is not None, "expected": planned.expected, "needs": list(planned.needs)}


def run_platform(device: str) -> str:
    """Where this run's caches live: ``cpu``, ``cuda-sm90``, ``rocm-gfx942``, or another device's
    type (``xpu``, a PrivateUse1 backend's name); a backend's own platform may be a model of
    another: reference_gfx942 on a CPU."""
    kind = torch.device(device).type
    if kind != "cuda" or not torch.cuda.is_available():
        return kind
    if torch.version.hip:
        return "rocm-" + torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    major, minor = torch.cuda.get_device_capability()
    return f"cuda-sm{major}{minor}"


def environment(run, backends: dict) -> dict:
    """Run-level facts every record is read against."""
    options = run.options
    return {
        "suite_version": package_version("kvconform") or "unknown",
        "python": platform.python_version(),
        "torch": torch.__version__, "hip": torch.version.hip, "cuda": torch.version.cuda,
        "triton": package_version("triton") or package_version("pytorch-triton-rocm"),
        "vllm": package_version("vllm"),
        "device": options.device,
        "devices": list(options.devices) or None,  # the check between devices' processes (a certified run pins them)
        "device_name": torch.cuda.get_device_name() if options.device.startswith("cuda") else platform.processor() or "cpu",
        "run_platform": run_platform(options.device),
        "seed": options.seed, "profile": options.profile, "standard": options.standard,
        "expectations": options.expectations,  # the baseline the verdict names (reports/results.py verdict)
        "backends": backends,
    }


def printable_failure_text(report) -> None:
    """A failure's text as pytest will print it, made printable: a backend's exception message and
    captured output are data, and pytest writes them to the terminal as they are (an OSC sequence
    in a message could retitle the window or hide lines). Text without a control character stays
    pytest's own report, unchanged."""
    from kvconform.reports.terminal import printable  # here: a failure's report (the terminal module: ~60 ms)

    text = str(report.longrepr)
    if printable(text) != text:
        report.longrepr = printable(text)
    report.sections = [(title, printable(content)) for title, content in report.sections]


class ResultRecorder:
    """A pytest plugin object: one record per test; JSON, HTML, JUnit and the terminal report at the end."""

    def __init__(self, run, environment: dict, lock=None, tally: DeselectionTally | None = None):
        if run.options.timeout:
            watchdog.clear(run.options.json_path)
        self.run = run
        self.environment = environment
        self.lock = lock
        self.records: dict[str, TestRecord] = {}
        self.last: dict[str, dict] = {}  # per test id: the last payload seen (a crash report has none)
        self.nodeids: dict[str, str] = {}  # pytest node id -> test id
        self.stale_expectations: list[dict] = []
        self.selected: set[str] | None = None  # node ids of the kvconform tests this run selected
        self.collect_errors: list[str] = []
        self.tally = tally  # tests deselected or dropped at collection in this process (not on the xdist controller)
        # DeselectionTally.counts() as the xdist workers reported them
        self.from_workers: tuple[int, tuple[str | None, int]] = (0, (None, 0))
        self.completion: dict | None = None  # set at the end of the session
        self.notes: list[tuple[str, str]] = []  # (style, line) for the terminal summary
        self.tests_ran = False  # the session ran its test loop (not --collect-only, --fixtures …)
        self.written: dict | None = None  # the document as written: the run's last word, shown and certified as is
        self.unwritten: str | None = None  # why the results and HTML could not be written (a full disk), if they could not
        self.session = None

    # ------------------------------------------------------------------ what was selected
    def pytest_collectreport(self, report):
        if report.failed:
            self.collect_errors.append(report.nodeid or "<session>")

    def pytest_collection_finish(self, session):
        if session.items:  # xdist's controller collects nothing: its workers report below
            self.selected = {item.nodeid for item in session.items if collection.PLANNED in item.stash}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        output = getattr(node, "workeroutput", {})  # every worker collects the same tests: keep the largest counts
        deselected, dropped = output.get(DeselectionTally.KEY, 0), tuple(output.get(DeselectionTally.DROPPED, (None, 0)))
        self.from_workers = (max(self.from_workers[0], deselected), max(self.from_workers[1], dropped, key=lambda d: d[1]))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        if self.selected is None:  # node ids name the check module relative to where pytest found it
            self.selected = {i for i in ids if collection.is_check_file(collection.suite_dir() / Path(i.split("::")[0]).name)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session):
        """From here on the results file is this run's or none. Before xdist starts its workers
        (its own session start runs last): pytest takes ``--kvc-json``'s value for a path when it
        picks the rootdir, so workers that saw the earlier file and workers that did not would
        name the same tests differently, and xdist would stop the run after collection."""
        self.session = session  # the watchdog's last words need it
        if not runs_no_tests(session.config):
            set_aside(self.run.options.json_path, self.html_path)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session):
        self.tests_ran = not session.config.option.collectonly
        return (yield)

    # ------------------------------------------------------------------ verdicts
    def pytest_runtest_logreport(self, report):
        if report.failed:
            printable_failure_text(report)
        nodeid = report.nodeid.split("@", 1)[0]  # xdist --dist loadgroup appends "@group"
        sent = dict(report.user_properties).get("kvconform")
        if sent is not None:
            test_id = sent["record"]["nodeid"]
            self.nodeids[nodeid], self.last[test_id] = test_id, sent
            if sent["decided"]:
                self.records[test_id] = self._record(sent["record"])
            return
        test_id = self.nodeids.get(nodeid)
        if test_id is not None and verdict.is_crash_report(report):
            last = self.last[test_id]
            crash = verdict.crashed(last["expected"], watchdog.timed_out(self.run.options.json_path, test_id), str(report.longrepr))
            self.records[test_id] = self._record({**last["record"], **crash.record_fields()})

    def _record(self, fields: dict) -> TestRecord:
        fields = dict(fields)
        compared = fields.pop("compared_sha256", None)
        return TestRecord(**fields, seed=self.run.options.seed, run_platform=self.environment.get("run_platform"),
                          result_digest=result_digest(fields, compared))

    def finish_timed_out(self, config, planned) -> None:
        """Without xdist the watchdog ends the only process: write what the run has, with this
        test's verdict, before it goes (watchdog.start's last words)."""
        last = self.last.get(planned.test_id)
        fields = last["record"] if last else planned.record_fields()
        self.records[planned.test_id] = self._record({**fields, **verdict.crashed(planned.expected, True, "ended by --kvc-timeout").record_fields()})
        self.completion = self._completion(self.session, watchdog.EXIT_STATUS)
        self.completion["reasons"].append({"kind": "timeout", "what": f"{planned.test_id} exceeded --kvc-timeout without xdist; "
                                                                    "the run ended there (use -n 1 or `kvconform run` to carry on)"})
        self.completion["complete"] = False
        capture = config.pluginmanager.get_plugin("capturemanager")
        if capture is not None:  # pytest captures the test's output, and the process ends before it shows it
            capture.suspend_global_capture(in_=False)
        self._write(config)
        xml_path = getattr(config.option, "xmlpath", None)
        if xml_path and not os.path.exists(xml_path):  # pytest's JUnit writer will never run: the records make one
            from kvconform.reports.junit import from_document  # here: only with --junitxml (~50 ms)

            write_atomically(xml_path, from_document(self.document()))
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            self._print_summary(reporter)
        if self.lock is not None:
            self.lock.release()

    # ------------------------------------------------------------------ the end of the run
    def _completion(self, session, exitstatus: int) -> dict:
        with_verdict = {nodeid for nodeid, test_id in self.nodeids.items() if test_id in self.records}
        deselected, (first, dropped) = self.from_workers if self.tally is None else self.tally.counts()
        narrowed = filters(session.config, deselected)
        reasons = [
            *stops(session, exitstatus, self.collect_errors),
            *narrowed,
            *([] if narrowed else not_collected(self.selected)),
            *dropped_tests(first, dropped),
            *missing_verdicts(self.selected, with_verdict),
            *skipped_by_expectations(self.records, self.run.expectations),
        ]
        if self.run.compare is not None:
            compared = [r for test_id, r in self.records.items() if "compare_digests" in self.last[test_id]["needs"] and r.outcome != NOT_APPLICABLE]
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

    def tests_json(self) -> list[dict]:
        """Every record as JSON, in test-id order (~0.3 ms a record: made once at the end of a run)."""
        return [self.records[test_id].as_json() for test_id in sorted(self.records)]

    def document(self, tests: list[dict] | None = None) -> dict:
        if self.written is not None:
            return self.written
        return {
            "schema": SCHEMA, "created_unix": int(time.time()), "environment": self.environment,
            "completion": self.completion,
            "stale_expectations": self.stale_expectations,
            "tests": self.tests_json() if tests is None else tests,
        }

    @property
    def html_path(self) -> str:
        options = self.run.options
        return options.html_path or os.path.splitext(options.json_path)[0] + ".html"

    @pytest.hookimpl(trylast=True)  # after pytest's JUnit writer: its file is annotated here
    def pytest_sessionfinish(self, session, exitstatus):
        if not self.tests_ran:
            return
        options = self.run.options
        records = self.tests_json()
        self.completion = self._completion(session, exitstatus)
        self.stale_expectations = [
            {"file": e.file, "line": e.line, "pattern": e.pattern, "reason": e.reason}
            for e in (expectations.stale(self.run.expectations, records) if self.run.expectations else ())
        ]
        if options.export_digests:
            export(options.export_digests, records)
        if options.update_expectations:
            self._update_expectations(session, records, self.completion)
        if any(r["kind"] == "nothing-compared" for r in self.completion["reasons"]) and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        if session.exitstatus == 0 and any(r["outcome"] in FAILING for r in records):
            # the verdict's new failures, whatever another plugin made of pytest's reports (a rerun that passed)
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
        self.completion["exit_status"] = int(session.exitstatus)
        self._write(session.config, records)
        if self.unwritten and session.exitstatus == 0:  # no CI job may pass on outputs that are not there
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR
            self.completion["exit_status"] = int(session.exitstatus)  # the verdict line says the status the run ends with

    def _write(self, config, tests: list[dict] | None = None) -> None:
        options = self.run.options
        document = self.document(tests)
        from kvconform.reports.html import render_runs  # here: Jinja2 and the templates, ~0.2 s a run that writes nothing skips

        self.written = document
        for path, text in ((options.json_path, document_text(document)), (self.html_path, render_runs([document]))):
            try:
                write_atomically(path, text)
            except OSError as exc:  # a full disk: the run still ends in its verdict, which says so
                self.unwritten = f"{path}: {exc.strerror or exc}"
                return
        kept = settle_previous(options.json_path, self.html_path, complete=bool(self.completion and self.completion["complete"]))
        if kept:
            self.notes.append(("yellow", f"kvconform: {options.json_path} held a complete run; kept it as {kept}"))
        xml_path = getattr(config.option, "xmlpath", None)
        if xml_path and os.path.exists(xml_path):
            from kvconform.reports.junit import annotate  # here: only with --junitxml (~50 ms)

            with open(xml_path, encoding="utf-8") as fh:
                write_atomically(xml_path, annotate(fh.read(), document))

    def _update_expectations(self, session, records, completion: dict) -> None:
        target = self.run.options.update_expectations
        stopped = [r for r in completion["reasons"] if r["kind"] not in ("filtered", "nothing-compared", "skipped")]
        if stopped:
            self.notes.append(("red", f"kvconform: REFUSED to update {target}: the run did not finish "
                                      f"({'; '.join(r['what'] for r in stopped)}); the file is unchanged"))
            if session.exitstatus == 0:
                session.exitstatus = pytest.ExitCode.USAGE_ERROR
            return
        result = expectations.update_file(target, records, self.run.expectations)  # keeps a link, the mode and line endings
        self.notes.append(("", f"kvconform: updated expectations {target}: {result.added} new failure(s) added as 'untriaged', "
                               f"{len(result.removed)} fixed entr{'y' if len(result.removed) == 1 else 'ies'} removed, "
                               f"{result.kept_failing} still failing kept, {result.kept_outside} outside this run's selection kept"))
        for entry in result.kept_wildcards_passing:
            self.notes.append(("yellow", f"kvconform: {entry.file}:{entry.line} {entry.pattern} matches only passing tests in this run; "
                                         "kept (it may cover tests elsewhere): narrow or remove it by hand"))
        if not self.run.options.expectations and result.written:
            self._known_from_now_on(session, records, target)

    def _known_from_now_on(self, session, records, target: str) -> None:
        """A first run that wrote the baseline, gated by none: each of its failures is now an entry
        of that file, so it is reported as the next run will report it (a known failure, the
        baseline named on the verdict line, written by this run) and the run exits 0."""
        for record in (r for r in records if r["outcome"] in FAILING):
            first_line = (record.get("message") or record["outcome"]).splitlines()[0]
            record.update(outcome=EXPECTED_FAILURE, message=f"recorded as a known failure in {target} by this run (untriaged): {first_line}")
        self.environment.update(expectations=target, expectations_written=True)
        if session.exitstatus == pytest.ExitCode.TESTS_FAILED:  # pytest counted them failed; the baseline now lists them
            session.exitstatus = pytest.ExitCode.OK

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(self, terminalreporter):
        # The outermost wrapper: pytest's own summary (its failures and "short test summary info")
        # prints inside, so the verdict comes after it, followed only by pytest's count line.
        try:
            return (yield)
        finally:
            self._print_summary(terminalreporter)

    def _print_summary(self, terminalreporter) -> None:
        if self.written is None:
            return
        from kvconform.reports.terminal import printable, render  # here: ~60 ms a run that writes nothing skips

        terminalreporter.write_sep("=", "kvconform")
        width = terminalreporter.config.get_terminal_writer().fullwidth
        terminalreporter.write(render([self.document()], color=terminalreporter.hasmarkup, width=width))
        if self.run.left_out:
            left = ", ".join(f"{name} ({why})" for name, why in self.run.left_out.items())
            terminalreporter.write_line(f"kvconform: built-in backends not in this run: {left}", yellow=True)
        for entry in self.stale_expectations:
            terminalreporter.write_line(printable(f"kvconform: WARNING stale expectation {entry['file']}:{entry['line']} {entry['pattern']} "
                                                  "matches no test that ran"), yellow=True)
        for record in self.records.values():
            if record.outcome == UNEXPECTED_PASS:
                terminalreporter.write_line(printable(f"kvconform: UNEXPECTED PASS {record.nodeid} ({record.message}) — remove it from the expectations"),
                                            yellow=True)
        for style, line in self.notes:
            terminalreporter.write_line(line, **({style: True} if style else {}))
        if self.lock is not None and self.lock.taken_over is not None:
            pid = self.lock.taken_over.get("pid", "?")
            terminalreporter.write_line(f"kvconform: an earlier run (pid {pid}) writing this results file ended without finishing; "
                                        "its results were never written", yellow=True)
        if self.unwritten:
            terminalreporter.write_line(printable(f"kvconform: OUTPUTS NOT WRITTEN — the verdict above is this run's, but its results and HTML "
                                                  f"could not be written ({self.unwritten}); {self.run.options.json_path} does not hold this run"),
                                        red=True, bold=True)
            return
        terminalreporter.write_line(f"kvconform: results {os.path.abspath(self.run.options.json_path)}")
        terminalreporter.write_line(f"kvconform: HTML report {os.path.abspath(self.html_path)}")

    def pytest_unconfigure(self, config):
        if self.lock is not None:
            self.lock.release()
