"""The results document: schema, outcomes, and reading/writing it safely.

The JSON schema is documented in docs/RESULTS_SCHEMA.md (``kvconform-results/1``); the pytest
plugin's recorder (kvconform.conformance.plugin.recorder) writes it, everything in this package reads it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import stat

from kvconform.reference.errors import InputError

SCHEMA = "kvconform-results/1"
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


READ_LIMIT = 1 << 30  # bytes of one input file read at most: 1 GiB (a results file of many backends is tens of MiB)


def read_text(path: str, what: str, error: type[Exception], limit: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, or ``error`` naming the file
    and what it should have been: a device, FIFO or directory is never read (``/dev/zero`` would
    never end), nor a file past the limit (default :data:`READ_LIMIT`)."""
    limit = READ_LIMIT if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opened so does not wait for a writer
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise error(f"{path}: not a regular file; expected a {what}")
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    if len(data) > limit:
        raise error(f"{path}: larger than {limit} bytes; expected a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); expected a {what}") from exc


def read_json(path: str, what: str, error: type[Exception]) -> dict:
    """Load a JSON file or raise ``error`` naming the file and what it should have been."""
    text = read_text(path, what, error)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{path}: not a readable {what} ({'nested too deeply' if isinstance(exc, RecursionError) else exc})") from exc


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: readers never see half a file.

    A symbolic link is written through (the link stays, its target is replaced), the file keeps
    its permission bits, and the text is written as given (``\r\n`` stays). Anything but a regular
    file (a device, a FIFO) is refused: kvconform replaces only files."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise InputError(f"{path}: not a regular file; kvconform writes only regular files")
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask applies, as for a new file
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            fh.write(text)
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
