"""Where a run writes, checked before the first test: every output path writable, one run at a
time per results file, and a complete earlier result never replaced silently by a partial one.

- Every output (``--kvc-json``, ``--kvc-html``, ``--kvc-update-expectations``,
  ``--kvc-export-digests``, ``--junitxml``, the ``--kvc-certify`` directory) must be writable when
  the run starts, a regular file (or directory) or absent, and differ from every input and every
  other output (:func:`check_outputs`); a path that is not is a usage error naming the option
  (exit 4, nothing run, nothing read or replaced).
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
import stat
import sys
import tempfile
import time

from kvconform.errors import InputError
from kvconform.reports import expectations, results
from kvconform.reports.results import read_json


class OutputError(InputError):
    """An output path that cannot be used; the message names the option."""


# What a certified run's bundle directory may already hold: a bundle (a re-certification).
BUNDLE_NAMES = frozenset({"manifest.json", "results.json", "environment.json", "capabilities.json", "coverage.json", "COVERAGE.md",
                          "digests.json", "collected.txt", "must_pass.txt", "canary.json", "SHA256SUMS", "SHA256SUMS.sig"})
# The one output that may name an input: the expectations file updated in place.
MAY_EQUAL = {frozenset({"--kvc-update-expectations", "--kvc-expectations"})}


def check_outputs(given_outputs: dict[str, str | None], given_inputs: dict[str, str | None]) -> None:
    """Refuse, before the first test, every output path that would destroy something or that
    kvconform could not write; raise :class:`OutputError` naming the option.

    ``given_outputs``: option -> path of every file the run will write (``--kvc-json``, ``--kvc-html``,
    ``--junitxml``, ``--kvc-update-expectations``, ``--kvc-export-digests``) and ``--kvc-certify``
    (a directory); ``given_inputs``: option -> path of every file it reads (``--kvc-expectations``,
    ``--kvc-compare-digests``). A value of None or "" is an option not given; without
    ``--kvc-html`` the report's default path beside ``--kvc-json`` is checked.

    - every input is a regular file (a FIFO or ``/dev/zero`` is never read);
    - every output is a regular file or absent, and its directory writable; a character device,
      FIFO or ``/dev/full`` is refused, never read or replaced;
    - the ``--kvc-certify`` directory is absent, empty or an earlier bundle, and writable;
    - every output differs from every input and from every other output (resolved real paths,
      and the same file under two names), and none lies inside the bundle directory; the
      expectations file updated in place (``--kvc-update-expectations`` = ``--kvc-expectations``)
      is the one exception. An existing ``--kvc-update-expectations`` file must be that file and
      parse: kvconform never rewrites a file it cannot read.
    """
    outputs = {option: path for option, path in given_outputs.items() if path}
    inputs = {option: path for option, path in given_inputs.items() if path}
    if "--kvc-json" in outputs and "--kvc-html" not in outputs:  # the HTML report goes beside the results by default
        outputs["--kvc-html"] = os.path.splitext(outputs["--kvc-json"])[0] + ".html"
    for option, path in inputs.items():
        kind = _kind(path)
        if kind is None:
            raise OutputError(f"{option} {path}: no such file; expected a readable regular file")
        if kind != "regular file":
            raise OutputError(f"{option} {path}: is a {kind}, expected a regular file (kvconform reads only regular files)")
    bundle = outputs.pop("--kvc-certify", None)
    for option, path in outputs.items():
        kind = _kind(path)
        if kind == "directory":
            raise OutputError(f"{option} {path}: is a directory, expected a file path")
        if kind not in (None, "regular file"):
            raise OutputError(f"{option} {path}: is a {kind}, expected a regular file or a path that does not exist yet "
                              "(kvconform never reads or replaces anything else)")
        check_writable(option, os.path.realpath(path), shown=path)
    if bundle:
        _check_bundle_dir(bundle)
    named = [*outputs.items(), *inputs.items()]
    written = set(outputs)
    if "--kvc-json" in outputs:  # what the run writes beside the results: its lock and a kept complete run
        results = outputs["--kvc-json"]
        html = outputs.get("--kvc-html", os.path.splitext(results)[0] + ".html")
        named += [("the lock of --kvc-json", results + ".lock"),
                  ("where a complete --kvc-json is kept", os.path.splitext(results)[0] + ".complete.json"),
                  ("where a complete --kvc-html is kept", os.path.splitext(html)[0] + ".complete.html")]
        written |= {option for option, _ in named[-3:]}
    for i, (option, path) in enumerate(named):
        for other, other_path in named[:i]:
            if frozenset({option, other}) not in MAY_EQUAL and (option in written or other in written) and _same_file(path, other_path):
                raise OutputError(f"{option} {path}: is also {other} ({other_path}); every output must differ from every input "
                                  "and from the other outputs, or one would overwrite the other. Pass another path")
        if bundle and _inside(path, bundle):
            raise OutputError(f"{option} {path}: is inside the --kvc-certify directory {bundle}; the bundle holds only its own "
                              "files (it would be overwritten, or refused as a file not in SHA256SUMS). Pass a path outside it")
    _check_update_target(outputs.get("--kvc-update-expectations"), inputs.get("--kvc-expectations"))


def _kind(path: str) -> str | None:
    """What is at ``path`` (links followed): None when nothing is."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):  # nothing there (a path under a file cannot be written: said later)
        return None
    except OSError as exc:
        return f"path that cannot be examined ({exc.strerror or exc})"
    for test, kind in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "directory"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket")):
        if test(mode):
            return kind
    return "special file"


def _same_file(a: str, b: str) -> bool:
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # hard links, or a case-insensitive file system
    except OSError:
        return False


def _inside(path: str, directory: str) -> bool:
    real, top = os.path.realpath(path), os.path.realpath(directory)
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _check_bundle_dir(directory: str) -> None:
    kind = _kind(directory)
    option = "--kvc-certify"
    if kind not in (None, "directory"):
        raise OutputError(f"{option} {directory}: is a {kind}, expected a directory for the submission bundle (or a path that does not exist yet)")
    if kind == "directory":
        try:
            foreign = sorted(set(os.listdir(directory)) - BUNDLE_NAMES)
        except OSError as exc:
            raise OutputError(f"{option} {directory}: cannot list it ({exc.strerror or exc}); expected a writable directory") from exc
        if foreign:
            raise OutputError(f"{option} {directory}: holds files that are not a submission bundle's ({', '.join(foreign[:5])}"
                              f"{' …' if len(foreign) > 5 else ''}); expected an empty directory, an earlier bundle, or a new path")
    # Prove it writable now, not after the whole run: create what is missing, a file in it, and
    # remove what the probe created.
    created, parent = [], os.path.realpath(directory)
    while not os.path.exists(parent):
        created.append(parent)
        parent = os.path.dirname(parent)
    try:
        for path in reversed(created):
            os.mkdir(path)
        with tempfile.NamedTemporaryFile(dir=os.path.realpath(directory), prefix=".kvconform-probe-"):
            pass
    except OSError as exc:
        raise OutputError(f"{option} {directory}: cannot write there ({exc.strerror or exc}); expected a writable directory") from exc
    finally:
        for path in created:
            try:
                os.rmdir(path)
            except OSError:
                pass


def _check_update_target(target: str | None, gate: str | None) -> None:
    if not target or not os.path.exists(target):
        return
    if gate and not _same_file(target, gate):
        raise OutputError(f"--kvc-update-expectations {target}: exists and is not the --kvc-expectations file "
                          f"{gate}; which entries to keep would be ambiguous. Pass the same file to update "
                          "it in place, or a path that does not exist yet")
    try:
        expectations.parse(target)  # a file kvconform cannot read is never rewritten
    except expectations.ExpectationsError as exc:
        raise OutputError(f"--kvc-update-expectations {exc}; kvconform never rewrites a file it cannot read") from exc


def check_writable(option: str, path: str, shown: str | None = None) -> None:
    """Raise :class:`OutputError` unless ``path`` can be created or replaced as a file."""
    shown = shown or path
    target = os.path.abspath(path)
    if os.path.isdir(target):
        raise OutputError(f"{option} {shown}: is a directory, expected a file path")
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        # Create and remove a file beside it: the results are written by rename from there.
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".kvconform-probe-"):
            pass
    except OSError as exc:
        raise OutputError(f"{option} {shown}: cannot write there ({exc.strerror or exc}); expected a writable file path") from exc


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
    """``PATH.lock`` held by the run writing ``PATH``: a small JSON object (pid, host, start time,
    command line), created whole (written beside it, then linked into place) so that no other run
    ever reads half of it. Anything else at that path — a directory, a FIFO, a file that is not
    such an object — is a usage error naming it, never taken over and never an INTERNALERROR."""

    path: str
    taken_over: dict | None = None  # the dead run whose stale lock this run replaced

    @classmethod
    def acquire(cls, json_path: str, option: str = "--kvc-json") -> "ResultsLock":
        lock = os.path.abspath(json_path) + ".lock"
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started_unix": int(time.time()), "argv": sys.argv}
        taken_over = None
        for _ in range(2):
            try:
                if _create_lock(lock, mine):
                    return cls(lock, taken_over)
            except OSError as exc:
                raise OutputError(f"{option} {json_path}: cannot create its lock {lock} ({exc.strerror or exc})") from exc
            holder = _read_lock(lock, f"{option} {json_path}")
            if holder["host"] != mine["host"] or _process_alive(holder["pid"]):
                try:
                    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["started_unix"]))
                except (OverflowError, OSError, ValueError):
                    started = f"at {holder['started_unix']!r}"
                raise OutputError(
                    f"{option} {json_path}: another kvconform run is writing it (pid {holder['pid']} on {holder['host']}, "
                    f"started {started}); wait for it to finish or pass another {option} "
                    f"(remove {lock} only if that run no longer exists)"
                )
            taken_over = holder
            try:
                os.unlink(lock)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise OutputError(f"{option} {json_path}: cannot remove the stale lock {lock} of pid {holder['pid']} "
                                  f"({exc.strerror or exc}); remove it by hand") from exc
        raise OutputError(f"{option} {json_path}: could not take {lock}; another run keeps creating it")

    def release(self) -> None:
        try:
            holder = _read_lock(self.path, "")
        except OutputError:
            return
        if holder["pid"] == os.getpid():
            os.unlink(self.path)


def _create_lock(lock: str, content: dict) -> bool:
    """Create ``lock`` holding ``content`` unless something is there; False when something is."""
    tmp = f"{lock}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(content, fh)
    try:
        os.link(tmp, lock)  # atomic, and fails when the lock exists: never seen half written
        return True
    except FileExistsError:
        return False
    except OSError:  # a file system without hard links
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as fh:
            json.dump(content, fh)
        return True
    finally:
        os.unlink(tmp)


LOCK_LIMIT = 1 << 16  # bytes of a lock read at most (a lock is a few hundred)


def _read_lock(path: str, what: str) -> dict:
    """The holder a lock names; :class:`OutputError` when ``path`` is not a kvconform lock."""
    remove = f"remove it if no kvconform run is writing {path.removesuffix('.lock')}"
    try:
        mode = os.lstat(path).st_mode
        if stat.S_ISREG(mode):  # a directory, FIFO or link is never opened
            with open(path, "rb") as fh:
                data = fh.read(LOCK_LIMIT + 1)
    except FileNotFoundError:
        raise OutputError(f"{what}: its lock {path} vanished while it was read; run again") from None
    except OSError as exc:
        raise OutputError(f"{what}: cannot read its lock {path} ({exc.strerror or exc}); {remove}") from exc
    if not stat.S_ISREG(mode):
        kind = "directory" if stat.S_ISDIR(mode) else "symbolic link" if stat.S_ISLNK(mode) else "special file"
        raise OutputError(f"{what}: its lock {path} is a {kind}, expected the JSON file a kvconform run writes; {remove}")
    try:
        holder = json.loads(data.decode("utf-8")) if len(data) <= LOCK_LIMIT else None
    except (ValueError, RecursionError):  # not UTF-8, not JSON
        holder = None
    if not (isinstance(holder, dict) and type(holder.get("pid")) is int and holder["pid"] > 0 and isinstance(holder.get("host"), str)
            and type(holder.get("started_unix", 0)) in (int, float)):
        raise OutputError(f"{what}: its lock {path} is not a kvconform lock (expected a JSON object with pid, host and "
                          f"started_unix); {remove}")
    holder.setdefault("started_unix", 0)
    return holder


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
        earlier = read_json(previous, "kvconform results file", ValueError) if os.path.isfile(previous) else None
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
