"""The results document: schema, outcomes, and reading/writing it safely.

The JSON schema is documented in docs/RESULTS_SCHEMA.md (``kvconform-results/1``); the pytest
plugin's recorder (kvconform.conformance.plugin.recorder) writes it, everything in this package reads it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os

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
