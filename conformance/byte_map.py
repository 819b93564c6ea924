"""Where a block's bytes should be vs where a backend put them — the data behind the report's
SVG picture. One cell per (kv, slot, head) row of D elements, in physical order.

Ownership is found by value: random fills make element values (almost) unique, so an element
of the actual block whose bytes equal some logical element's expected bytes is that element's
copy. A V row found in the K plane shows as a V-coloured cell among K cells.
"""

from __future__ import annotations

import torch

from kvconform import reference as R

from .harness import GUARD, Arena

MAX_ELEMENTS = 1 << 22  # no pictures for huge caches (the 2^31 check)


def block_byte_map(expected: Arena, actual: Arena, layer: int, block: int) -> dict | None:
    """JSON-ready picture data for one (layer, block), or None when the cache is too large."""
    spec = actual.spec
    g, layout = spec.geometry, spec.layout
    if layout.numel(g) > MAX_ELEMENTS:
        return None
    bits = R.bits_dtype(g.dtype)
    want = expected.region.cpu().view(bits)
    got = actual.region.detach().cpu().view(bits)
    omap = R.offset_map(layout, g)  # (L, B, 2, N, H, D)
    logical_values = want[omap.flatten()]
    owner = {}  # value -> flat logical index, only for values that occur once
    values, counts = torch.unique(logical_values, return_counts=True)
    unique = set(values[counts == 1].tolist())
    for index, value in enumerate(logical_values.tolist()):
        if value in unique:
            owner[value] = index
    shape = R.logical_shape(g)
    rows = omap[layer, block]  # (2, N, H, D)
    cells = []
    for kv in range(2):
        for n in range(g.block_size):
            for h in range(g.num_kv_heads):
                offs = rows[kv, n, h]
                found = [owner.get(v) for v in got[offs].tolist()]
                ok = bool(torch.equal(got[offs], want[offs]))
                holders = {tuple(int(c) for c in torch.unravel_index(torch.tensor(i), shape))[2:5] for i in found if i is not None}
                actual_row = holders.pop() if len(holders) == 1 and None not in found else None
                cells.append({
                    "offset": int(offs.min()), "row": [kv, n, h], "ok": ok,
                    "actual": list(actual_row) if actual_row else None,
                })
    cells.sort(key=lambda c: c["offset"])
    return {
        "layer": layer, "block": block, "layout": str(layout), "geometry": g.short(),
        "row_elements": g.head_size, "cells": cells,
    }


def first_logical(arena: Arena, elements: list[int]) -> tuple[int, int] | None:
    """(layer, block) of the first differing element that is a logical element."""
    e = arena.spec.geometry.element_size
    inner = [el - GUARD // e for el in elements]
    span = arena.spec.layout.numel(arena.spec.geometry)
    inside = [i for i in inner if 0 <= i < span][:64]
    if not inside or span > MAX_ELEMENTS:
        return None
    for coords in R.coordinates_of(arena.spec.layout, arena.spec.geometry, inside):
        if coords is not None:
            return coords["layer"], coords["block"]
    return None
