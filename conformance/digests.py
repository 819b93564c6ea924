"""Digest files: export on machine A (``--export-digests``), compare on machine B (``--compare-digests``).

Schema ``kvconform-digests/1``: a header (suite version, hash of the golden case definitions,
platform facts) and one entry per (backend, layout, golden case) naming layout, era, dtype,
fp8 format and geometry. A file from another suite version or other golden cases is refused:
equal byte counts do not make equal layouts.
"""

from __future__ import annotations

import hashlib
import json

from kvconform.reports.results import package_version, read_json, write_atomically

from .equivalence import CASES, FP8_FORMATS, scales

SCHEMA = "kvconform-digests/1"


class DigestFileError(ValueError):
    pass


def cases_hash() -> str:
    text = repr([(c, str(c.model_dtype)) for c in CASES]) + repr([[s.tolist() for s in scales(f)] for f in (None, *FP8_FORMATS)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def header() -> dict:
    return {"schema": SCHEMA, "suite_version": package_version("kvconform") or "unknown", "cases_hash": cases_hash()}


def export(path: str, records: list[dict]) -> int:
    entries = [{"backend": r["backend"], "platform": r.get("platform"), "arch": r.get("arch"), **r["digest"]} for r in records if r.get("digest")]
    write_atomically(path, json.dumps({**header(), "entries": entries}, indent=1))
    return len(entries)


def load(path: str) -> dict:
    document = read_json(path, "digest file", DigestFileError)
    ours = header()
    for field in ("schema", "suite_version", "cases_hash"):
        if document.get(field) != ours[field]:
            raise DigestFileError(f"{path}: header {field} is {document.get(field)!r}, this suite has {ours[field]!r}; digests are not comparable")
    document["path"] = path
    return document
