"""The dashboard's inputs: results files and certified submission bundles, one run each, with an
id derived from the run's content (the bytes of its results document), never from where it was
found or in which order it was given.

Every problem is an :class:`InputError` naming the file: the schema of a results document is
checked by the loader every report uses (``matrix.check_schema``), a bundle's files by its
SHA256SUMS (``submission``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os

from kvconform.errors import InputError

from . import submission
from .matrix import SchemaError, check_schema
from .results import read_json, read_text

WHAT = "kvconform results file (kvconform-results/1) or certified bundle directory"


@dataclasses.dataclass(frozen=True)
class Run:
    """One input: a results document and what the dashboard knows of where it came from."""

    id: str  # "r" + the first 12 hex digits of the SHA-256 of the results document's bytes
    source: str  # the path as given
    document: dict
    bundle_sha256: str | None  # a certified bundle: the SHA-256 of its SHA256SUMS (the bundle's checksum)

    @property
    def created_unix(self) -> float:
        created = self.document.get("created_unix")
        return created if isinstance(created, (int, float)) and not isinstance(created, bool) else 0


def load_run(path: str) -> Run:
    """A results file, or a certified bundle directory (its intact results.json)."""
    if os.path.isdir(path):
        return _load_bundle(path)
    return _load_results(path, path, None)


def _load_results(path: str, source: str, bundle_sha256: str | None) -> Run:
    text = read_text(path, "kvconform results file", SchemaError)
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise SchemaError(f"{path}: not a readable {WHAT} ({'nested too deeply' if isinstance(exc, RecursionError) else exc})") from exc
    check_schema(document, path)
    tests = document["tests"]
    if len({(r["nodeid"], r.get("run_platform")) for r in tests}) != len(tests):
        seen = set()
        for number, record in enumerate(tests):
            key = (record["nodeid"], record.get("run_platform"))
            if key in seen:
                raise SchemaError(f"{path}: tests[{number}] repeats test {record['nodeid']!r} on {key[1]}; a run has one record per test")
            seen.add(key)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return Run(id=f"r{digest[:12]}", source=source, document=document, bundle_sha256=bundle_sha256)


def _load_bundle(path: str) -> Run:
    manifest_path = os.path.join(path, "manifest.json")
    if not os.path.exists(manifest_path):
        raise InputError(f"{path}: a directory without manifest.json; expected a {WHAT} (give a directory's results files one by one)")
    manifest = read_json(manifest_path, "bundle manifest", InputError)
    if not isinstance(manifest, dict) or manifest.get("schema") != submission.BUNDLE_SCHEMA:
        schema = manifest.get("schema") if isinstance(manifest, dict) else type(manifest).__name__
        raise InputError(f"{manifest_path}: schema {schema!r} is not {submission.BUNDLE_SCHEMA!r}; expected a certified bundle's manifest")
    problems = submission._checksum_problems(path)  # what verify-submission checks first: every file as certified
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{path}: not an intact certified bundle: {problems[0]}{more}")
    return _load_results(os.path.join(path, "results.json"), path, submission.sha256_file(os.path.join(path, submission.SUMS)))


def load_runs(paths: list[str]) -> list[Run]:
    """Every input, oldest first (then by id: the order the paths were given does not matter);
    the same run given twice (a bundle and its results.json, one file twice) is refused."""
    if not paths:
        raise InputError(f"no inputs: expected one or more of {WHAT}")
    runs: list[Run] = []
    first: dict[str, str] = {}  # run id -> the path that gave it first
    for path in paths:
        run = load_run(path)
        if run.id in first:
            raise InputError(f"{path}: the same run as {first[run.id]} (identical results); give each run once")
        first[run.id] = path
        runs.append(run)
    return sorted(runs, key=lambda run: (run.created_unix, run.id))
