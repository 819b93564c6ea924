"""The examined elements of a failed comparison and what a diagnosis has found of each so far:
its fault class, the element whose bytes it holds, a tag (conformance/harness/diagnosis.py)."""

from __future__ import annotations

import torch

from kvconform import reference as R

from .diagnosis_faults import FAULT_ID


class Examined:
    """The examined elements and, per element, its fault class, the grid index of the element
    whose bytes it holds (``source``) and a ``tag`` (layout alternative, token, far end)."""

    def __init__(self, spec, expected, actual, differing, guard, initial, writes, zero_fill, grid, examined):
        self.spec, self.g, self.layout = spec, spec.geometry, spec.layout
        g = self.g
        self.e, self.first = g.element_size, guard // g.element_size
        self.numel = self.layout.numel(g)
        self.nbytes = self.numel * self.e
        self.total, self.examined = differing.numel(), examined
        self.grid = grid
        self.want_bytes, self.got_bytes = expected, actual
        bits = R.bits_dtype(g.dtype)
        self.want_bits, self.got_bits = expected.view(bits), actual.view(bits)
        self.init_bits = initial.view(bits) if initial is not None else None
        self.writes, self.zero_fill = writes, zero_fill
        self.alternatives: list[str] = []
        self.transform_masks: dict[str, torch.Tensor] = {}

        pos = differing[:examined].to(torch.int64)
        inner = pos - self.first
        inside = (inner >= 0) & (inner < self.numel)
        index = torch.where(inside, self.grid.index_of(inner.clamp(0, max(self.numel - 1, 0))), -1)
        kind = torch.where(inner < 0, 0, torch.where(inner >= self.numel, 3, torch.where(index >= 0, 1, 2)))
        self.unmapped = 0
        if not self.grid.whole:  # elements in blocks a large cache's map leaves out are not examined
            keep = kind != 2
            self.unmapped = int((~keep).sum())
            pos, inner, index, kind = pos[keep], inner[keep], index[keep], kind[keep]
        self.pos, self.inner, self.index, self.kind = pos, inner, index, kind
        self.coords = torch.zeros(pos.numel(), 6, dtype=torch.int64)
        self.coords[kind == 1] = self.grid.coords(index[kind == 1])
        self.w, self.a = self.want_bits[pos], self.got_bits[pos]
        self.i0 = self.init_bits[pos] if self.init_bits is not None else None
        n = pos.numel()
        self.fault = torch.full((n,), -1, dtype=torch.int64)
        self.source = torch.full((n,), -1, dtype=torch.int64)
        self.tag = torch.zeros(n, dtype=torch.int64)
        self.scaled = torch.full((n,), float("nan"))  # x / scale, where a write's input is known (fp8)

    def open(self) -> torch.Tensor:
        """Logical elements not explained yet."""
        return (self.fault < 0) & (self.kind == 1)

    def assign(self, mask: torch.Tensor, fault: str, source: torch.Tensor | None = None, tag=None) -> None:
        self.fault[mask] = FAULT_ID[fault]
        if source is not None:
            self.source[mask] = source[mask]
        if tag is not None:
            self.tag[mask] = tag[mask] if isinstance(tag, torch.Tensor) else tag

    def written(self, grid_index: torch.Tensor) -> torch.Tensor:
        """Whether the op writes each element (its expected bytes differ from the initial ones);
        True where that is not known."""
        if self.init_bits is None:
            return torch.ones_like(grid_index, dtype=torch.bool)
        at = self.grid.offsets[grid_index] + self.first
        return self.want_bits[at] != self.init_bits[at]

    def never_written(self) -> torch.Tensor:
        """Elements still holding their initial bytes (zeros for a lazily mapped arena) though the op writes them."""
        if self.i0 is not None:
            return (self.a == self.i0) & (self.w != self.i0)
        if self.zero_fill:
            return (self.a == 0) & (self.w != 0)
        return torch.zeros_like(self.a, dtype=torch.bool)
