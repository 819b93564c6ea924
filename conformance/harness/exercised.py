"""What each test exercised, recorded as it runs (the data behind the coverage table).

One entry per cache a test builds (``TestFacts.built``, facts.py): its kv_cache_dtype, storage
and model dtypes, layout, geometry and the geometry's size classes. The ops add what they touched (here): the
address classes of the largest block and element offset they addressed, and for fp8 writes
the value classes of the scaled values the encoder rounded. Class names and their meaning
live in ``kvconform.reports.coverage``; the entries go to the test's facts (``TestFacts.exercised``).
"""

from __future__ import annotations

import functools

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.reports.coverage import NEAR_TIE, address_classes


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _entry(case, spec: CacheSpec) -> dict | None:
    """The latest entry for this cache (ops run on the cache most recently built)."""
    g = spec.geometry
    return next((e for e in reversed(case.facts.exercised) if e["layout"] == str(spec.layout) and e["geometry"] == g.short()), None)


def _add(entry: dict, key: str, names) -> None:
    entry[key] += [n for n in names if n not in entry[key]]


def note_blocks(case, spec: CacheSpec, blocks, *, rows=None, layer=None) -> None:
    """An op addressed these blocks: every row, or ``rows[i]`` of ``blocks[i]``; every layer, or ``layer``."""
    entry = _entry(case, spec)
    blocks = torch.as_tensor(blocks, dtype=torch.int64).flatten().cpu()
    if entry is None or blocks.numel() == 0:
        return
    g = spec.geometry
    rows = torch.full_like(blocks, g.block_size - 1) if rows is None else torch.as_tensor(rows, dtype=torch.int64).flatten().cpu()
    # Offsets grow with every index (strides are non-negative): a row's last head and dim is its largest.
    last = spec.layout.offsets(g, layer=g.num_layers - 1 if layer is None else layer, block=blocks[:, None], kv=torch.arange(2)[None, :],
                               slot=rows[:, None], head=g.num_kv_heads - 1, dim=g.head_size - 1)
    _add(entry, "sizes", address_classes(max_block=int(blocks.max()), max_element=int(last.max()), element_size=g.element_size))


def note_write(case, spec: CacheSpec, key, value, slot_mapping, k_scale, v_scale) -> None:
    """A write of these tokens: the rows it addressed and, on fp8 caches, the value classes."""
    slots = slot_mapping.long().cpu()
    written = slots >= 0
    g = spec.geometry
    s = slots[written]
    if s.numel():
        note_blocks(case, spec, s // g.block_size, rows=s % g.block_size, layer=spec.layer)
    entry = _entry(case, spec)
    if entry is None or g.dtype not in R.fp8.FP8_DTYPES or not s.numel():
        return
    names = set()
    for x, scale in ((key, k_scale), (value, v_scale)):
        rows_written = x[: slots.numel()].cpu()[written]
        names |= set(value_classes(rows_written.float() / R.fp8._scale_like(scale, rows_written, 1).cpu(), g.dtype))
    _add(entry, "values", sorted(names))


@functools.cache
def _midpoints(fmt_name: str) -> tuple[torch.Tensor, float]:
    """The midpoints between adjacent non-negative finite codes of a format, and its max."""
    fmt = R.fp8.fp8_format(fmt_name)
    grid = R.fp8.decode_codes(torch.arange(256, dtype=torch.uint8), fmt)
    grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])
    return (grid[1:] + grid[:-1]) / 2, fmt.max_finite


def value_classes(y: torch.Tensor, dtype: torch.dtype) -> list[str]:
    """The fp8 value classes (``reports.coverage.VALUE_CLASSES``) of scaled values ``y``."""
    mids, top = _midpoints(_dtype_name(dtype))
    a = y.abs().flatten()
    y = y.flatten()
    in_range = a < top  # NaN compares False
    i = torch.searchsorted(mids, a.nan_to_num(0.0).clamp(max=top)).clamp(1, mids.numel() - 1)
    nearest = torch.where((a - mids[i - 1]).abs() <= (a - mids[i]).abs(), mids[i - 1], mids[i])
    off = (a - nearest).abs()
    rounds_to_zero = R.fp8.quantize(a.nan_to_num(1.0), 1.0, dtype).float() == 0
    found = {
        "-0": torch.signbit(y) & rounds_to_zero & ~torch.isnan(y),
        "nan": torch.isnan(y),
        "max": a == top,
        ">max": a > top,
        "tie": in_range & (off == 0),
        "near-tie": in_range & (off > 0) & (off <= nearest * NEAR_TIE),
    }
    return [name for name, hit in found.items() if bool(hit.any())]
