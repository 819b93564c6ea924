"""The Hypothesis example a failure was found with, as a short readable summary.

Hypothesis reports a failing example as the repr of everything drawn (nested dataclasses,
layouts, tensors: often 60 lines). A reader needs a handful of values: the geometry, dtypes,
layout, slot mapping and scales. They are picked out of that repr by name; the raw text stays
in the record (and folded away in the HTML report).
"""

from __future__ import annotations

import re

# (label, field name in the drawn dataclasses' reprs); the first occurrence of each is shown.
FIELDS = (
    ("blocks", "num_blocks"), ("block size", "block_size"), ("KV heads", "num_kv_heads"), ("head size", "head_size"),
    ("layers", "num_layers"), ("cache dtype", "dtype"), ("kv_cache_dtype", "kv_cache_dtype"), ("model dtype", "model_dtype"),
    ("slot_mapping", "slot_mapping"), ("extra key rows", "extra_rows"), ("k_scale", "k_scale"), ("v_scale", "v_scale"),
    ("data seed", "seed"), ("block ids", "block_ids"), ("src/dst", "src_to_dst"),
)
_VALUE = r"(tensor\(\[[^\]]*\](?:,\s*dtype=[\w.]+)?\)|\[[^\]]*\]|'[^']*'|[^,()\s]+)"
SHOWN_SLOTS = 16


def _tidy(value: str) -> str:
    value = re.sub(r"\s+", " ", value)
    value = re.sub(r"^tensor\((.*)\)$", r"\1", value)
    return value.replace("torch.", "").strip("'")


def _slots(value: str) -> str:
    numbers = re.findall(r"-?\d+", value.split("dtype")[0])
    shown = ", ".join(numbers[:SHOWN_SLOTS]) + (", …" if len(numbers) > SHOWN_SLOTS else "")
    kind = re.search(r"dtype=torch\.(\w+)", value)
    padding = sum(1 for n in numbers if n == "-1")
    dtype = kind.group(1) if kind else "int64"  # a tensor repr names its dtype unless it is the default int64
    return f"[{shown}] — {len(numbers)} tokens, {padding} padding (-1), {dtype}"


def summary(raw: str | None) -> list[tuple[str, str]]:
    """(label, value) pairs for the drawn example in Hypothesis' notes; [] when there are none."""
    if not raw:
        return []
    draws = raw[raw.find("Draw 1:"):] if "Draw 1:" in raw else raw
    found = []
    for label, name in FIELDS:
        match = re.search(rf"\b{name}={_VALUE}", draws)
        if match:
            value = match.group(1)
            found.append((label, _slots(value) if name == "slot_mapping" else _tidy(value)))
    layout = re.search(r"layout=Layout\(era='(\w+)',\s*alias='([^']+)'", draws)
    if layout:
        found.insert(0, ("layout", f"{layout.group(1)}:{layout.group(2)}"))
    return found
