"""Where the differing elements are: the offset map of a cache (or of the blocks a failure touches
in a large one) between arena element, grid index and logical coordinates (step 0 of a diagnosis,
conformance/harness/diagnosis.py)."""

from __future__ import annotations

import math

import torch

from kvconform import reference as R

from .diagnosis_faults import EXAMINED

WHOLE_MAP = 1 << 22  # caches up to this many elements are mapped whole (and get layout hypotheses)
SAMPLED = 256  # differing elements whose blocks a larger cache's partial map covers


class Grid:
    """The offset map of some blocks of a cache (all of a small one): grid index ↔ element offset
    ↔ logical coordinates. Grid indices run over ``(L, len(blocks), 2, N, H, D)`` in that order,
    so ``index // D`` is a row (layer, block, kv, slot, head) and rows are in logical order."""

    def __init__(self, layout: R.Layout, g: R.Geometry, blocks: torch.Tensor | None = None):
        omap = R.offset_map(layout, g, blocks)
        self.g, self.shape = g, tuple(omap.shape)
        self.blocks = torch.arange(g.num_blocks) if blocks is None else blocks
        self.whole = blocks is None
        self.offsets = omap.flatten()
        self.sorted, self.order = torch.sort(self.offsets)

    def index_of(self, offsets: torch.Tensor) -> torch.Tensor:
        """Grid index of each element offset, -1 where no mapped element is."""
        if self.sorted.numel() == 0 or offsets.numel() == 0:
            return torch.full_like(offsets, -1)
        pos = torch.searchsorted(self.sorted, offsets.contiguous()).clamp(max=self.sorted.numel() - 1)
        return torch.where(self.sorted[pos] == offsets, self.order[pos], -1)

    def coords(self, index: torch.Tensor) -> torch.Tensor:
        """``(n, 6)`` logical coordinates ``(l, b, kv, n, h, d)`` of grid indices (real block ids)."""
        if index.numel() == 0:
            return torch.empty(0, 6, dtype=torch.int64)
        c = torch.stack(R.unravel(index, self.shape), dim=1)
        c[:, 1] = self.blocks[c[:, 1]]
        return c

    def index_at(self, coords: torch.Tensor) -> torch.Tensor:
        """Grid index of logical coordinates ``(n, 6)``, -1 outside the cache or the mapped blocks."""
        at = torch.searchsorted(self.blocks, coords[:, 1].contiguous()).clamp(max=self.blocks.numel() - 1)
        local = coords.clone()
        local[:, 1] = at
        extent = torch.tensor(self.shape)
        inside = ((local >= 0) & (local < extent)).all(dim=1) & (self.blocks[at] == coords[:, 1])
        strides = torch.tensor([math.prod(self.shape[i + 1:]) for i in range(6)])
        return torch.where(inside, (local * strides).sum(dim=1), -1)


def grid_for(spec, guard: int, differing: torch.Tensor, examined: int = EXAMINED) -> Grid:
    """The whole map of a small cache; for a large one, the map of the blocks (and their
    neighbours) that hold the first ``examined`` differing elements and up to ``SAMPLED`` more
    spread over the rest."""
    layout, g = spec.layout, spec.geometry
    if layout.numel(g) <= WHOLE_MAP:
        return Grid(layout, g)
    first, span = guard // g.element_size, layout.numel(g)
    inside = differing[(differing >= first) & (differing < first + span)] - first
    if inside.numel() > examined:
        inside = torch.cat([inside[:examined], inside[torch.linspace(examined, inside.numel() - 1, SAMPLED).long()]])
    blocks = blocks_holding(layout, g, inside)
    near = torch.unique(torch.cat([blocks - 1, blocks, blocks + 1]))
    return Grid(layout, g, near[(near >= 0) & (near < g.num_blocks)])


def blocks_holding(layout: R.Layout, g: R.Geometry, offsets: torch.Tensor) -> torch.Tensor:
    """The blocks whose elements span each element offset. Offsets grow with every logical index
    (as ``R.coordinates_of`` relies on), so per (layer, kv) the blocks' first elements ascend and
    block ``b`` spans its elements (0, 0, 0) to (N−1, H−1, D−1): a bisection over
    :meth:`Layout.offsets`, about log2(B) small evaluations instead of a scan of the map."""
    found = [torch.empty(0, dtype=torch.int64)]
    last = (g.block_size - 1, g.num_kv_heads - 1, g.head_size - 1)
    for layer in range(g.num_layers):
        for kv in (0, 1):
            start = lambda b: layout.offsets(g, layer=layer, block=b, kv=kv)  # noqa: E731
            lo, hi = torch.zeros_like(offsets), torch.full_like(offsets, g.num_blocks - 1)
            while bool((lo < hi).any()):  # the last block whose first element is at or before the offset
                mid = (lo + hi + 1) // 2
                before = start(mid) <= offsets
                lo, hi = torch.where(before, mid, lo), torch.where(before, hi, mid - 1)
            end = layout.offsets(g, layer=layer, block=lo, kv=kv, slot=last[0], head=last[1], dim=last[2])
            found.append(lo[(start(lo) <= offsets) & (offsets <= end)])
    return torch.unique(torch.cat(found))


def distinct_rows(grid: Grid, spec, guard: int, elements: torch.Tensor) -> torch.Tensor:
    """A row id per arena element: one per (layer, block, kv, slot) of a logical element, -1 for
    the guard before the cache, -2 after it, -3 padding or unmapped."""
    g = spec.geometry
    first, span = guard // g.element_size, spec.layout.numel(g)
    index = grid.index_of(elements - first)
    row = torch.where(index >= 0, index // (g.num_kv_heads * g.head_size), -3)
    return torch.where(elements < first, -1, torch.where(elements >= first + span, -2, row))


def row_ids(rows: torch.Tensor) -> torch.Tensor:
    """An id per row of an integer matrix, equal ids for equal rows (ids are 0..count-1): the
    columns' ids combined one column at a time (``torch.unique(dim=0)`` is far slower)."""
    ids = torch.zeros(rows.shape[0], dtype=torch.int64)
    for column in rows.T:
        values, inverse = torch.unique(column, return_inverse=True)
        ids = torch.unique(ids * values.numel() + inverse, return_inverse=True)[1]
    return ids
