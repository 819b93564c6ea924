"""Where a run writes, checked before the first test: every output path writable, one run at a
time per results file, and a complete earlier result never replaced silently by a partial one.

- Every output (``--kvc-json``, ``--kvc-html``, ``--kvc-update-expectations``,
  ``--kvc-export-digests``, ``--junitxml``) must be writable when the run starts; a path that is
  not is a usage error naming the option (exit 4, nothing run).
- The results JSON path is the run's identity: a run holds ``PATH.lock`` while it runs, and a
  second run started for the same path is refused up front (exit 4) naming the first run's
  process. A lock left by a process that no longer exists (killed, machine rebooted) is taken
  over, and the run says the earlier one ended without results.
- A run moves the results it will replace aside as it starts (``<stem>.previous.json``), so
  PATH exists only once a run has finished writing it: a run killed by SIGTERM or SIGKILL leaves
  none that looks like its own. A run that is not complete (docs/RELIABILITY.md) writes its own
  results — a reader of PATH always sees the run that last wrote it — but when PATH held a
  *complete* run, that document is kept as ``<stem>.complete.json`` (its HTML as
  ``<stem>.complete.html``), and the run says so.
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


def _aside(path: str, suffix: str) -> str:
    return os.path.splitext(path)[0] + suffix + os.path.splitext(path)[1]


def set_aside(json_path: str, html_path: str) -> None:
    """A run starts: the results it will replace move to ``<stem>.previous.json`` (its HTML too),
    so a run that is killed leaves no results file that looks like its own."""
    for path in (json_path, html_path):
        if os.path.exists(path):
            os.replace(path, _aside(path, ".previous"))


def settle_previous(json_path: str, html_path: str, complete: bool) -> str | None:
    """A run has written its results: a *complete* earlier document set aside is kept as
    ``<stem>.complete.json`` (its HTML as ``.complete.html``) when this run is partial, and
    dropped otherwise. Returns where it was kept, or None."""
    previous = _aside(json_path, ".previous")
    try:
        earlier = read_json(previous, "kvconform results file", ValueError) if os.path.exists(previous) else None
    except ValueError:
        earlier = None
    keep = not complete and isinstance(earlier, dict) and results.is_complete(earlier)
    kept = None
    for path in (json_path, html_path):
        if os.path.exists(_aside(path, ".previous")):
            if keep:
                os.replace(_aside(path, ".previous"), _aside(path, ".complete"))
                kept = kept or _aside(path, ".complete")
            else:
                os.unlink(_aside(path, ".previous"))
    return kept
