"""The offset map and the layout facts derived from it (SPEC §1, §14).

``offset_map(layout, g)`` evaluates :meth:`Layout.offsets` on the whole logical grid: an
int64 tensor of shape ``(L, B, 2, N, H, D)`` whose entry is the element offset of that
logical element inside the allocation. Every fact below is a function of that tensor.
"""

from __future__ import annotations

import functools
import math

import torch

from .geometry import Geometry
from .layouts import LOGICAL_DIMS, Layout


def unravel(index, shape):
    """The coordinates of flat ``index`` (an int or an integer tensor) in a C-ordered ``shape``, as
    :func:`torch.unravel_index` gives them. Not that function: its argument checks import sympy,
    ~2 s of CPU once per process, which a run pays on its first failure."""
    return tuple((index // math.prod(shape[i + 1:])) % n for i, n in enumerate(shape))


def logical_shape(g: Geometry) -> tuple[int, ...]:
    """``(L, B, 2, N, H, D)``."""
    return (g.num_layers, g.num_blocks, 2, g.block_size, g.num_kv_heads, g.head_size)


def logical_grid(g: Geometry, blocks=None, heads=None) -> dict[str, torch.Tensor]:
    """One broadcastable index tensor per logical coordinate, keyed like :data:`LOGICAL_DIMS`.

    ``blocks`` restricts the block axis to those ids, ``heads`` the head axis to those heads
    (in that order).
    """
    shape = logical_shape(g)
    grid = {}
    chosen = {"block": blocks, "head": heads}
    for axis, (name, size) in enumerate(zip(LOGICAL_DIMS, shape)):
        if chosen.get(name) is None:
            grid[name] = _axis(size, axis)
            continue
        values = torch.as_tensor(chosen[name], dtype=torch.int64).flatten().cpu()
        view = [1] * len(shape)
        view[axis] = values.numel()
        grid[name] = values.view(view)
    return grid


@functools.lru_cache(maxsize=64)
def _axis(size: int, axis: int) -> torch.Tensor:
    """``arange(size)`` along ``axis`` of the grid. Shared by every call (a reference op builds a
    grid per call; six fresh aranges took 0.4 ms, the most of a small offset map), so only ever
    read: the grid's users compute with it and never write into it."""
    view = [1] * len(LOGICAL_DIMS)
    view[axis] = size
    return torch.arange(size, dtype=torch.int64).view(view)


def offset_map(layout: Layout, g: Geometry, blocks=None, heads=None) -> torch.Tensor:
    """Element offsets of every logical element, shape ``(L, B, 2, N, H, D)``, int64.

    With ``blocks``, only those blocks: shape ``(L, len(blocks), 2, N, H, D)``; with
    ``heads``, only those heads on the head axis.
    """
    grid = logical_grid(g, blocks, heads)
    # Each index of the grid spans its own axis only (torch.broadcast_shapes said the same, at
    # ~2.5 ms a call: a sixth of a connector interop check's time).
    shape = tuple(values.numel() for values in grid.values())
    return layout.offsets(g, **grid).expand(shape).contiguous()


def coordinates_of(layout: Layout, g: Geometry, element_offsets, chunk_elements: int = 1 << 24) -> list[dict | None]:
    """Inverse map: logical coordinates of each physical element offset (None if unmapped).

    Works block-chunk by block-chunk so that huge caches never materialise their whole map.
    """
    wanted = torch.as_tensor(element_offsets, dtype=torch.int64).flatten()
    found: list[dict | None] = [None] * wanted.numel()
    per_block = g.num_layers * 2 * g.block_size * g.num_kv_heads * g.head_size
    step = max(1, chunk_elements // per_block)
    for first in range(0, g.num_blocks, step):
        blocks = torch.arange(first, min(first + step, g.num_blocks))
        # Offsets grow with every index: a chunk spans [its first element, its last], so
        # chunks far from every wanted offset are skipped without building their map.
        low = layout.offsets(g, block=first, kv=torch.arange(2)).min()
        high = layout.offsets(g, layer=g.num_layers - 1, block=int(blocks[-1]), kv=torch.arange(2), slot=g.block_size - 1,
                              head=g.num_kv_heads - 1, dim=g.head_size - 1).max()
        if not bool(((wanted >= low) & (wanted <= high)).any()):
            continue
        omap = offset_map(layout, g, blocks)
        flat = omap.flatten()
        for index in torch.nonzero(torch.isin(flat, wanted)).flatten().tolist():
            coord = dict(zip(LOGICAL_DIMS, unravel(index, omap.shape)))
            coord["block"] = int(blocks[coord["block"]])
            for i in torch.nonzero(wanted == flat[index]).flatten().tolist():
                found[i] = coord
        if all(c is not None for c in found):
            break
    return found


# ------------------------------------------------------------------------- facts
def is_injective(omap: torch.Tensor) -> bool:
    """No two logical elements share a physical element."""
    return torch.unique(omap).numel() == omap.numel()


def is_in_bounds(omap: torch.Tensor, numel: int) -> bool:
    """Every offset lies inside an allocation of ``numel`` elements."""
    return bool(omap.min() >= 0) and bool(omap.max() < numel)


def _group_extents(omap: torch.Tensor, keep: tuple[str, ...]):
    """Per group of the kept coordinates: (min offset, max offset, element count)."""
    keep_axes = [LOGICAL_DIMS.index(k) for k in keep]
    moved = omap.permute(keep_axes + [a for a in range(omap.dim()) if a not in keep_axes])
    flat = moved.reshape(*moved.shape[: len(keep)], -1)
    return flat.amin(-1), flat.amax(-1), flat.shape[-1]


def is_contiguous_per(omap: torch.Tensor, keep: tuple[str, ...]) -> bool:
    """Each group of elements sharing the ``keep`` coordinates is one contiguous run."""
    lo, hi, count = _group_extents(omap, keep)
    return bool(((hi - lo + 1) == count).all()) and is_injective(omap)


def is_blocks_first(omap: torch.Tensor) -> bool:
    """Within every layer, blocks occupy disjoint ranges in block order (dim 0 = blocks)."""
    lo, hi, _ = _group_extents(omap, ("layer", "block"))
    return bool((hi[:, :-1] < lo[:, 1:]).all())


def is_block_compact(omap: torch.Tensor) -> bool:
    """Each (layer, block) page — its K and V — is one contiguous run (one connector region)."""
    return is_contiguous_per(omap, ("layer", "block"))


def is_layer_compact(omap: torch.Tensor) -> bool:
    """Each layer's elements form one run (E3 ``is_layer_compact``)."""
    return is_contiguous_per(omap, ("layer",))


def is_block_outermost(omap: torch.Tensor) -> bool:
    """All layers' pages of one block are one run (E3 ``is_block_outermost``)."""
    return is_contiguous_per(omap, ("block",))


def is_block_contiguous(omap: torch.Tensor, slot_coord: str = "head") -> bool:
    """Block-compact and each (layer, block, E3-head) run contiguous (E3 ``is_block_contiguous``)."""
    return is_block_compact(omap) and is_contiguous_per(omap, ("layer", "block", slot_coord))


def is_connector_shippable(omap: torch.Tensor) -> bool:
    """Blocks-first with each (layer, block) one contiguous run: what a KV connector ships."""
    return is_blocks_first(omap) and is_block_compact(omap)


def block_byte_runs(omap: torch.Tensor, element_size: int, layer: int, block: int) -> list[tuple[int, int]]:
    """Half-open byte ranges holding one (layer, block): one range iff block-compact."""
    offs = torch.sort(omap[layer, block].flatten()).values
    breaks = torch.nonzero(offs[1:] != offs[:-1] + 1).flatten() + 1
    starts = torch.cat([offs[:1], offs[breaks]])
    ends = torch.cat([offs[breaks - 1], offs[-1:]]) + 1
    return [(int(s) * element_size, int(e) * element_size) for s, e in zip(starts, ends)]


def block_byte_ranges(omap: torch.Tensor, element_size: int) -> torch.Tensor:
    """``(L, B, 2)`` half-open byte range of every (layer, block) page; needs block-compact."""
    if not is_block_compact(omap):
        raise ValueError("block_byte_ranges: layout is not block-compact (a page is several runs)")
    lo, hi, _ = _group_extents(omap, ("layer", "block"))
    return torch.stack([lo, hi + 1], dim=-1) * element_size


def strides_from_offsets(omap: torch.Tensor) -> tuple[int, ...] | None:
    """Logical strides ``(sL, sB, skv, sN, sH, sD)`` if the map is affine, else None."""
    origin = omap[(0,) * omap.dim()]
    strides = []
    for axis in range(omap.dim()):
        if omap.shape[axis] == 1:
            strides.append(0)
            continue
        index = [0] * omap.dim()
        index[axis] = 1
        strides.append(int(omap[tuple(index)] - origin))
    grids = torch.meshgrid(*[torch.arange(n) for n in omap.shape], indexing="ij")
    rebuilt = origin + sum(s * gi for s, gi in zip(strides, grids))
    return tuple(strides) if torch.equal(rebuilt, omap) else None
