"""Where a run writes, checked before the first test: every output path writable, one run at a
time per results file, and a complete earlier result never replaced silently by a partial one.

- Every output (``--kvc-json``, ``--kvc-html``, ``--kvc-update-expectations``,
  ``--kvc-export-digests``, ``--junitxml``) must be writable when the run starts; a path that is
  not is a usage error naming the option (exit 4, nothing run).
- The results JSON path is the run's identity: a run holds ``PATH.lock`` while it runs, and a
  second run started for the same path is refused up front (exit 4) naming the first run's
  process. A lock left by a process that no longer exists (killed, machine rebooted) is taken
  over, and the run says the earlier one ended without results.
- A run that is not complete (docs/RELIABILITY.md) writes its own results — a reader of PATH
  always sees the run that last wrote it — but when PATH held a *complete* run, that document is
  kept first as ``<stem>.complete.json`` (its HTML as ``<stem>.complete.html``), and the run says so.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import tempfile
import time

from kvconform.reference.errors import InputError
from kvconform.reports import results
from kvconform.reports.results import read_json


class OutputError(InputError):
    """An output path that cannot be used; the message names the option."""


def check_writable(option: str, path: str) -> None:
    """Raise :class:`OutputError` unless ``path`` can be created or replaced as a file."""
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise OutputError(f"{option} {path}: is a directory, expected a file path")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        # Create and remove a file beside it: the results are written by rename from there.
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".kvconform-probe-"):
            pass
    except OSError as exc:
        raise OutputError(f"{option} {path}: cannot write there ({exc.strerror or exc}); expected a writable file path") from exc


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


@dataclasses.dataclass
class ResultsLock:
    """``PATH.lock`` held by the run writing ``PATH``."""

    path: str
    taken_over: dict | None = None  # the dead run whose stale lock this run replaced

    @classmethod
    def acquire(cls, json_path: str, option: str = "--kvc-json") -> "ResultsLock":
        lock = os.path.abspath(json_path) + ".lock"
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started_unix": int(time.time()), "argv": sys.argv}
        taken_over = None
        for _ in range(2):
            try:
                fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = _read_lock(lock)
                if holder and (holder.get("host") != mine["host"] or _process_alive(int(holder.get("pid", -1)))):
                    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started_unix", 0)))
                    raise OutputError(
                        f"{option} {json_path}: another kvconform run is writing it (pid {holder.get('pid')} on {holder.get('host')}, "
                        f"started {started}); wait for it to finish or pass another {option} "
                        f"(remove {lock} only if that run no longer exists)"
                    ) from None
                taken_over = holder or {}
                os.unlink(lock)
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(mine, fh)
            return cls(lock, taken_over)
        raise OutputError(f"{option} {json_path}: could not take {lock}; another run keeps creating it")

    def release(self) -> None:
        holder = _read_lock(self.path)
        if holder and holder.get("pid") == os.getpid():
            os.unlink(self.path)


def _read_lock(path: str) -> dict | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def keep_complete_result(json_path: str, html_path: str) -> str | None:
    """Before a partial run writes ``json_path``: move a complete document found there (and its
    HTML) aside as ``<stem>.complete.json``; returns where it went, or None."""
    if not os.path.exists(json_path):
        return None
    try:
        earlier = read_json(json_path, "kvconform results file", ValueError)
    except ValueError:
        return None
    if not isinstance(earlier, dict) or not results.is_complete(earlier):
        return None
    kept = os.path.splitext(json_path)[0] + ".complete.json"
    os.replace(json_path, kept)
    if os.path.exists(html_path):
        os.replace(html_path, os.path.splitext(html_path)[0] + ".complete.html")
    return kept
