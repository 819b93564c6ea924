"""Where a block's bytes should be vs where a backend put them — the data behind the report's
SVG picture. One cell per (kv, slot, head) row of D elements, in physical order.

Ownership is found by row content: a logical row is D elements of seeded random data, so its
bytes are (almost surely) unique in the cache even when single element values repeat — as
they do for 1-byte fp8 and 2-byte bf16/fp16 caches, whose 256 or 65 536 values collide within
a few hundred elements. The D elements the backend left at a row's place are that logical
row's copy when they equal its expected bytes; a V row found in the K plane shows as a
V-coloured cell among K cells, a row from another block names that block.
"""

from __future__ import annotations

import torch

from kvconform import reference as R

from .case import GUARD, Arena

MAX_ELEMENTS = 1 << 22  # no pictures for huge caches (the 2^31 check)


def _row_owners(logical_rows: torch.Tensor, found_rows: torch.Tensor) -> torch.Tensor:
    """For each found row, the index of the one logical row with the same elements, or -1
    (no logical row has them, or several do: ownership would be a guess)."""
    count = logical_rows.shape[0]
    _, inverse = torch.unique(torch.cat([logical_rows, found_rows]), dim=0, return_inverse=True)
    logical_ids, found_ids = inverse[:count], inverse[count:]
    holders = torch.bincount(logical_ids, minlength=int(inverse.max()) + 1)
    owner = torch.full_like(holders, -1)
    owner[logical_ids] = torch.arange(count)
    return torch.where(holders[found_ids] == 1, owner[found_ids], -1)


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
    row_offsets = omap[layer, block].reshape(-1, g.head_size)  # (2·N·H, D), rows in (kv, n, h) order
    found = got[row_offsets]
    ok = (found == want[row_offsets]).all(dim=1)
    owners = _row_owners(want[omap.reshape(-1, g.head_size)], found)
    rows_shape = R.logical_shape(g)[:5]  # (L, B, 2, N, H)
    cells = []
    for index in range(row_offsets.shape[0]):
        kv, n, h = R.unravel(index, rows_shape[2:])
        cell = {"offset": int(row_offsets[index].min()), "row": [kv, n, h], "ok": bool(ok[index]), "actual": None}
        owner = int(owners[index])
        if not cell["ok"] and owner >= 0:
            src_layer, src_block, src_kv, src_n, src_h = R.unravel(owner, rows_shape)
            cell["actual"] = [src_kv, src_n, src_h]
            if (src_layer, src_block) != (layer, block):
                cell["actual_block"] = [src_layer, src_block]
        cells.append(cell)
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
