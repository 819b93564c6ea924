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


def reference_export(layouts) -> dict:
    """The reference's digests of every golden case on these layouts, as a loaded digest file:
    what a certified run compares with when no other machine's file is given."""
    import torch

    from kvconform import reference as R

    from .equivalence import digest_record, geometry, inputs

    entries = []
    for layout in dict.fromkeys(layouts):
        for case in CASES:
            for e4m3 in FP8_FORMATS if case.kv_cache_dtype == "fp8" else (None,):
                on = ("rocm", "gfx942") if e4m3 == "float8_e4m3fnuz" else ("cuda", "sm90")
                g = geometry(case, R.fp8.cache_dtype_for(case.kv_cache_dtype, case.model_dtype, *on))
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


def load(path: str) -> dict:
    document = read_json(path, "digest file", DigestFileError)
    ours = header()
    for field in ("schema", "suite_version", "cases_hash"):
        if document.get(field) != ours[field]:
            raise DigestFileError(f"{path}: header {field} is {document.get(field)!r}, this suite has {ours[field]!r}; digests are not comparable")
    document["path"] = path
    return document
