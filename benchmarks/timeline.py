"""Where a suite run's wall time goes: a pytest plugin for benchmarks/bench_suite.py.

``-p benchmarks.timeline`` with ``KVCONFORM_TIMELINE=DIR``: the controller and every xdist
worker append what happened when to ``DIR/<process>.jsonl`` (wall-clock seconds since the
epoch): the process's start (from ``/proc``), configure, collection, each test's start and end
(from the start of its protocol to the end of its teardown), the end of the session
and of unconfigure (the controller writes its reports there). :func:`summary` turns the files
into the numbers bench_suite.py prints. Without the variable the plugin does nothing.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

ENV = "KVCONFORM_TIMELINE"


def _process_start() -> float | None:
    """This process's start, seconds since the epoch (Linux ``/proc``), else None."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, StopIteration):
        return None


class Timeline:
    def __init__(self, directory: str, name: str):
        self.file = open(Path(directory) / f"{name}.jsonl", "a", buffering=1)  # noqa: SIM115 - open for the whole run
        self.event("process-start", at=_process_start())

    def event(self, what: str, at: float | None = None, **fields) -> None:
        self.file.write(json.dumps({"event": what, "t": time.time() if at is None else at, **fields}) + "\n")


KEY = pytest.StashKey[Timeline]()


def _timeline(config) -> Timeline | None:
    return config.stash.get(KEY, None)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    directory = os.environ.get(ENV)
    if not directory:
        return
    worker = getattr(config, "workerinput", {}).get("workerid", "controller")
    config.stash[KEY] = timeline = Timeline(directory, worker)
    timeline.event("configure-start")
    if worker == "controller":
        _CONTROLLER[:] = [timeline]


def pytest_sessionstart(session):
    timeline = _timeline(session.config)
    if timeline:
        timeline.event("session-start")  # every plugin's pytest_configure has run


def pytest_collection_finish(session):
    timeline = _timeline(session.config)
    if timeline:
        timeline.event("collected", items=len(session.items))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    timeline = _timeline(item.config)
    if timeline:
        timeline.event("test-start", nodeid=item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    try:
        return (yield)
    finally:
        timeline = _timeline(item.config)
        if timeline:
            timeline.event("test-end", nodeid=item.nodeid)


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """On the xdist controller: when each test's last report arrived (its lag behind the worker)."""
    if report.when == "teardown" and getattr(report, "node", None) is not None and _CONTROLLER:
        _CONTROLLER[0].event("report", nodeid=report.nodeid)


_CONTROLLER: list[Timeline] = []


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    timeline = _timeline(session.config)
    if timeline:
        timeline.event("session-finish")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    timeline = _timeline(config)
    if timeline:
        timeline.event("unconfigure-end")
        timeline.file.close()


# ----------------------------------------------------------------------------- reading
def load(directory) -> dict[str, list[dict]]:
    """Each process's events, in the order written."""
    return {path.stem: [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            for path in sorted(Path(directory).glob("*.jsonl"))}


def summary(directory, started: float, ended: float) -> dict:
    """The run's time per worker: start-up (from the run's start to its first test: spawn, imports
    and configure, collection, waiting for tests),
    time inside tests, gaps between tests, the tail after its last test; the controller's
    collection-to-first-result and after-last-result times. ``started``/``ended``: the run's
    wall clock as the caller measured it."""
    processes = load(directory)
    workers = {}
    for name, events in processes.items():
        if name == "controller":
            continue
        tests = _tests(events)
        first = events[0]["t"] or started
        session = next((e["t"] for e in events if e["event"] == "session-start"), first)
        collected = next((e["t"] for e in events if e["event"] == "collected"), session)
        inside = sum(end - start for _, start, end in tests)
        begin, finish = (tests[0][1], tests[-1][2]) if tests else (ended, ended)
        workers[name] = {
            "spawned_after_s": first - started,  # the run's start to this process's
            "imports_configure_s": session - first,  # interpreter, imports, every plugin's configure (backends, device)
            "collection_s": collected - session, "first_test_wait_s": begin - collected,  # then waiting for its first tests
            "startup_s": begin - started, "tests": len(tests), "inside_tests_s": inside,
            "between_tests_s": (finish - begin) - inside, "tail_s": ended - finish,
        }
    controller = processes.get("controller", [])
    finish = next((e["t"] for e in controller if e["event"] == "session-finish"), ended)
    last_test = max((w_end for events in processes.values() for _, _, w_end in _tests(events)), default=finish)
    return {"workers": workers, "controller_after_last_test_s": finish - last_test, "after_session_s": ended - finish}


def _tests(events) -> list[tuple[str, float, float]]:
    open_, done = {}, []
    for e in events:
        if e["event"] == "test-start":
            open_[e["nodeid"]] = e["t"]
        elif e["event"] == "test-end" and e["nodeid"] in open_:
            done.append((e["nodeid"], open_.pop(e["nodeid"]), e["t"]))
    return done
