"""Digest files: export on machine A (``--export-digests``), compare on machine B (``--compare-digests``).

Schema ``kvconform-digests/1``: a header (suite version, hash of the golden case definitions,
platform facts) and one entry per (backend, layout, golden case) naming layout, era, dtype,
fp8 format and geometry. A file from another suite version or other golden cases is refused:
equal byte counts do not make equal layouts.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re

from kvconform.errors import InputError
from kvconform.reports.results import package_version, read_json, write_atomically

from kvconform import reference as R

from .equivalence import CASES, FP8_FORMATS, scales

SCHEMA = "kvconform-digests/1"


class DigestFileError(InputError):
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


def reference_export(layouts) -> dict:
    """The reference's digests of every golden case on these layouts, as a loaded digest file:
    what a certified run compares with when no other machine's file is given."""
    import torch

    from .equivalence import digest_record, inputs

    entries = []
    for layout in dict.fromkeys(layouts):
        for case in CASES:
            for e4m3 in FP8_FORMATS if case.kv_cache_dtype == "fp8" else (None,):
                on = ("rocm", "gfx942") if e4m3 == "float8_e4m3fnuz" else ("cuda", "sm90")
                g = case.geometry(R.fp8.cache_dtype_for(case.kv_cache_dtype, case.model_dtype, *on))
                fmt = str(g.dtype).removeprefix("torch.") if g.dtype in R.fp8.FP8_DTYPES else None  # as the check records it
                try:
                    layout.validate(g)
                except ValueError:
                    continue
                storage = torch.zeros(layout.nbytes(g), dtype=torch.uint8)
                key, value, slots = inputs(case)
                k_scale, v_scale = scales(fmt)
                R.reshape_and_cache(key, value, storage, layout, g, slots, k_scale=k_scale, v_scale=v_scale)
                entries.append({"backend": "reference", "platform": on[0], "arch": on[1], **digest_record(storage, layout, case, g, fmt)})
    return {**header(), "entries": entries, "path": "kvconform's reference digests (this suite version)"}
_SHA256 = re.compile(r"[0-9a-f]{64}")
STORED_FP8_FORMATS = tuple(sorted(str(d).removeprefix("torch.") for d in R.fp8.FP8_DTYPES))
_TEXT_FIELDS = ("backend", "layout", "layout_shape", "era", "dtype", "kv_cache_dtype", "geometry")


def entry_problem(entry) -> str | None:
    """Why one digest entry cannot be compared (None when it is well-formed and self-consistent)."""
    if not isinstance(entry, dict):
        return f"expected an object, got {type(entry).__name__}"
    if not isinstance(entry.get("case"), str) or entry["case"] not in {c.name for c in CASES}:
        return f"case {entry.get('case')!r} is not a golden case of this suite"
    for field in _TEXT_FIELDS:
        if not isinstance(entry.get(field), str) or not entry[field]:
            return f"{field} must be a non-empty string, got {entry.get(field)!r}"
    for field in ("k_scale", "v_scale"):
        value = entry.get(field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"{field} must be a positive number, got {value!r}"
    for field in ("page", "canonical"):
        if not isinstance(entry.get(field), str) or not _SHA256.fullmatch(entry[field]):
            return f"{field} must be a SHA-256 hex digest, got {entry.get(field)!r}"
    if entry.get("fp8_format") not in (None, *STORED_FP8_FORMATS):
        return f"fp8_format must be null or one of {', '.join(STORED_FP8_FORMATS)}, got {entry.get('fp8_format')!r}"
    b64 = entry.get("canonical_b64")
    if entry.get("fp8_format") and b64 is None:
        return "canonical_b64 is required for an fp8 entry (the conversion is checked element by element)"
    if b64 is not None:
        try:
            raw = base64.b64decode(b64, validate=True)
        except (binascii.Error, TypeError, ValueError):
            return "canonical_b64 is not base64"
        if hashlib.sha256(raw).hexdigest() != entry["canonical"]:
            return "canonical_b64 does not hash to canonical (the entry was altered)"
    return None


def load(path: str) -> dict:
    """A digest file to compare with; refused whole when its header or any entry is not usable."""
    document = read_json(path, "digest file", DigestFileError)
    if not isinstance(document, dict):
        raise DigestFileError(f"{path}: expected a JSON object written by --kvc-export-digests")
    ours = header()
    for field in ("schema", "suite_version", "cases_hash"):
        if document.get(field) != ours[field]:
            raise DigestFileError(f"{path}: header {field} is {document.get(field)!r}, this suite has {ours[field]!r}; digests are not comparable")
    entries = document.get("entries")
    if not isinstance(entries, list) or not entries:
        raise DigestFileError(f"{path}: no entries; expected the digests written by --kvc-export-digests on another machine")
    for number, entry in enumerate(entries):
        problem = entry_problem(entry)
        if problem:
            what = " ".join(str(entry.get(k)) for k in ("backend", "case", "layout")) if isinstance(entry, dict) else ""
            raise DigestFileError(f"{path}: entry {number} ({what}): {problem}; the file is refused")
    document["path"] = path
    return document
