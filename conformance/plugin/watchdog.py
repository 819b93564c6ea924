"""``--kvc-timeout``: a test past its limit ends its process.

A hung test (a kernel that never returns, a Hypothesis loop that swallows signals) cannot be
interrupted from inside, so the watchdog leaves a note that the test timed out and ends the
process; xdist restarts the worker, and the verdict of the crash report it sends is *timeout*
(verdict.crashed) where the note exists. Notes live beside the results file they belong to
(one directory per results file, so runs writing other files beside it — ``kvconform run -j``
— never clear each other's).
"""

from __future__ import annotations

import os
import shutil
import sys
import threading

EXIT_STATUS = 70


def notes_dir(json_path: str) -> str:
    path = os.path.abspath(json_path)
    return os.path.join(os.path.dirname(path), ".timeouts", os.path.basename(path))


def _note(json_path: str, test_id: str) -> str:
    return os.path.join(notes_dir(json_path), "".join(c if c.isalnum() else "_" for c in test_id)[:200])


def clear(json_path: str) -> None:
    shutil.rmtree(notes_dir(json_path), ignore_errors=True)


def timed_out(json_path: str, test_id: str) -> bool:
    return os.path.exists(_note(json_path, test_id))


def start(limit: float, json_path: str, test_id: str, last_words=None) -> threading.Timer:
    """A timer that, after ``limit`` seconds, notes ``test_id`` as timed out, calls
    ``last_words()`` (a run without xdist writes its results there) and ends this process."""

    def expire():
        os.makedirs(notes_dir(json_path), exist_ok=True)
        with open(_note(json_path, test_id), "w") as fh:
            fh.write(test_id)
        if last_words is not None:  # without xdist: the results, JUnit and terminal report (pytest's capture suspended)
            last_words()
        sys.stderr.write(f"kvconform: {test_id} exceeded --kvc-timeout {limit}s; ending this process\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_STATUS)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    return timer
