"""The equivalence matrix of a (merged) report: backend@platform × backend@platform.

For the golden cases both columns wrote, a cell says: identical page bytes (same layout and
format), equivalent (same canonical bytes: a layout conversion away), equivalent after the
exact fp8 conversion, or differs.
"""

from __future__ import annotations

import base64
from collections import defaultdict

import torch

from kvconform import reference as R

from .matrix import column_of

RANK = ("differs", "fp8-conversion", "layout-conversion", "identical")


def compare_entries(ours: dict, theirs: dict) -> str | None:
    """None when equal (or exactly equivalent after fp8 conversion), else why not. Every field
    the entries carry is compared: a digest file is evidence only where all of it agrees."""
    sizes = lambda entry: entry["geometry"].rsplit("-", 1)[0]  # noqa: E731 - L, B, N, H, D; the dtype may differ (fn vs fnuz)
    for field, here, there in (("case", ours["case"], theirs["case"]), ("era", ours["era"], theirs["era"]),
                               ("layout", ours["layout"], theirs["layout"]), ("layout_shape", ours["layout_shape"], theirs["layout_shape"]),
                               ("geometry", sizes(ours), sizes(theirs)), ("kv_cache_dtype", ours["kv_cache_dtype"], theirs["kv_cache_dtype"])):
        if here != there:
            return f"header mismatch: {field} {there!r} there, {here!r} here (same byte count is not the same layout)"
    if ours["fp8_format"] == theirs["fp8_format"]:
        for field in ("dtype", "geometry", "k_scale", "v_scale", "page", "canonical", "canonical_b64"):
            if ours.get(field) != theirs.get(field):
                shown = lambda v: f"{v[:16]}…" if isinstance(v, str) and len(v) > 16 else repr(v)  # noqa: E731
                label = {"page": "page digest", "canonical": "canonical digest", "canonical_b64": "canonical bytes"}.get(field, field)
                return f"{label} {shown(theirs.get(field))} there, {shown(ours.get(field))} here"
        return None
    local = torch.frombuffer(bytearray(base64.b64decode(ours["canonical_b64"])), dtype=torch.uint8)
    remote = torch.frombuffer(bytearray(base64.b64decode(theirs["canonical_b64"])), dtype=torch.uint8)
    ratio = theirs["k_scale"] / ours["k_scale"]  # value kept: q_here · s_here = q_there · s_there
    if theirs["v_scale"] / ours["v_scale"] != ratio:
        return f"k/v scale ratios differ ({theirs['k_scale']}/{theirs['v_scale']} there, {ours['k_scale']}/{ours['v_scale']} here)"
    converted, exact = R.fp8.convert_codes(remote, theirs["fp8_format"], ours["fp8_format"], ratio)
    here, there = R.fp8.decode_codes(local, ours["fp8_format"]), R.fp8.decode_codes(converted, ours["fp8_format"])
    same_value = (here == there) | (here.isnan() & there.isnan())  # −0 == +0: the conversion's −0 → +0 is allowed
    bad = (~exact) | (~same_value)
    if bool(bad.any()):
        idx = bad.nonzero().flatten()[:4].tolist()
        return (f"{theirs['fp8_format']} → {ours['fp8_format']} is not exact on {int(bad.sum())} of {bad.numel()} elements; "
                f"first codes there {[hex(int(remote[i])) for i in idx]} vs here {[hex(int(local[i])) for i in idx]}")
    return None


def _verdict(a: dict, b: dict) -> str:
    if a["layout"] == b["layout"] and a["fp8_format"] == b["fp8_format"]:
        return "identical" if a["page"] == b["page"] else "differs"
    if a["fp8_format"] == b["fp8_format"]:
        return "layout-conversion" if a["canonical"] == b["canonical"] else "differs"
    canon = dict(a, layout=b["layout"], layout_shape=b["layout_shape"], era=b["era"])  # compare content, not layout
    return "fp8-conversion" if compare_entries(canon, b) is None else "differs"


def equivalence_matrix(documents: list[dict]) -> tuple[list[str], dict[tuple[str, str], str]]:
    """Columns with digests and the worst verdict over their shared golden cases."""
    by_column: defaultdict[str, defaultdict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))  # column -> case -> digests
    for document in documents:
        for record in document["tests"]:
            if record.get("digest") and record["check"] == "test_canonical_bytes_equal_the_committed_reference_digests":
                by_column[column_of(record)][record["digest"]["case"]].append(record["digest"])
    columns = list(by_column)
    cells = {}
    for x in columns:
        for y in columns:
            verdicts = [_verdict(a, b) for case in by_column[x].keys() & by_column[y].keys() for a in by_column[x][case] for b in by_column[y][case]]
            if verdicts:
                cells[(x, y)] = min(verdicts, key=RANK.index)
    return columns, cells
