"""A plugin for tests/test_incomplete_runs.py (``-p tests.worker_start``): every xdist worker
notes, as it starts, whether the results file of an earlier run (``KVC_EARLIER_RESULTS``) still
exists, and how many of that run's test durations it was handed to order its tests by — pytest reads ``--kvc-json``'s value as a path when it picks the rootdir, before any
plugin's options are known, so a file that one worker sees and the next does not gives the two
different node ids. After xdist has started the workers the controller waits until each has
noted it: on a slow machine, or with many workers, that is when they start."""

import os
import time
from pathlib import Path

import pytest


def pytest_configure(config):
    if hasattr(config, "workerinput"):
        with open(os.environ["KVC_WORKER_LOG"], "a") as log:
            durations = len(config.workerinput.get("kvconform_durations") or {})  # the earlier run's, for the schedule
            log.write(f"{os.path.exists(os.environ['KVC_EARLIER_RESULTS'])}:{durations}\n")


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session):
    yield
    workers = session.config.getoption("numprocesses", None)
    if hasattr(session.config, "workerinput") or not workers:
        return
    log, deadline = Path(os.environ["KVC_WORKER_LOG"]), time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text().split()) < workers):
        time.sleep(0.1)
