"""Where the wrong bytes came from: a failed byte comparison explained in logical coordinates.

:func:`diagnose` takes the expected and actual arena bytes (guard + cache + guard), the initial
(pre-op) bytes when the caller kept them, the cache's spec, the differing element indices and,
for a write, its inputs; it groups the wrong elements by logical coordinate and explains each
group where the bytes allow it (:data:`FAULTS` is the fixed vocabulary)::

    kv-swapped     K[b=1, s=15, h=0..3] holds V[b=1, s=15]'s bytes; V[b=1, s=15] is untouched
    never-written  V[b=1, s=15, h=0..3] was never written: it still holds its initial bytes

Hypotheses are tried in a fixed order, each on the elements the earlier ones left:

1. a guard byte changed: ``out-of-bounds``;
2. the element still holds its initial bytes though the op writes it: ``never-written``;
3. the bytes are where another layout derived from the declared one puts them (kv-first for
   blocks-first, HND for NHD, V in K's tile, x of another element size): ``wrong-layout``;
4. the bytes, with ``WINDOW`` bytes of context, are found once elsewhere in the expected cache:
   the element holds another element's bytes (``kv-swapped``, ``neighbour-slot``,
   ``neighbour-block``, ``other-layer``, ``other-head``, ``other-element``);
5. a whole row equals a write's input row that must not be written (``padding-written``,
   ``extra-row``);
6. the same element under a transformation: fp8 format, fnuz vs fn, scale, rounding, NaN,
   value cast, byte order, one bit (accepted per (layer, block, kv) only where it explains at
   least half of what is left there, so that noise does not read as a pattern);
7. an element whose expected bytes were found elsewhere: the other end of a move;
8. an element the op leaves that changed: ``stray-write`` (``neighbour-*`` when it lies right
   next to bytes the op wrote correctly: a copy that ran on);
9. ``unexplained``.

Every address comes from the reference's offset map (:func:`R.offset_map`, of the declared
layout or of a layout derived from it by permuting its dimension list); fp8 transforms use
reference/fp8.py. The work is vectorised and capped: at most ``EXAMINED`` differing elements
are explained (a ``not-examined`` finding says how many were not), and caches past
``WHOLE_MAP`` elements are mapped only in the blocks the differences touch.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

EXAMINED = 4096  # differing elements explained per failure
WHOLE_MAP = 1 << 22  # caches up to this many elements are mapped whole (and get layout hypotheses)
SAMPLED = 256  # differing elements whose blocks a larger cache's partial map covers
WINDOW = 8  # bytes of context that identify where a run of bytes came from
LISTED = 200  # findings returned (the rest are summed up in one not-examined finding)
ROWS_PER_CANDIDATE_CHECK = 512  # rows compared with a write's input rows

FAULTS = {
    "out-of-bounds": "a guard byte before or after the cache changed: written out of bounds",
    "never-written": "an element the op writes still holds its initial (pre-op) bytes",
    "wrong-layout": "the bytes are where another layout derived from the declared one puts them "
                    "(kv-first for blocks-first, HND for NHD, V in K's tile form, x of another element size)",
    "kv-swapped": "holds the expected bytes of the same element of the other side (K for V, V for K)",
    "neighbour-slot": "holds the bytes of the same element one slot before or after; or, changed though the op "
                      "leaves it, lies right next to a slot the op wrote correctly",
    "neighbour-block": "holds the bytes of the same element in the block before or after; or, changed though the op "
                       "leaves it, lies right next to a block the op wrote correctly (a copy that ran on)",
    "other-layer": "holds the bytes of the same element of another layer",
    "other-head": "holds the bytes of the same element of another head",
    "other-element": "holds the expected bytes of another logical element (or its own bytes are found at one)",
    "padding-written": "holds the input row of a token whose slot is negative (padding)",
    "extra-row": "holds an input row past len(slot_mapping)",
    "fp8-format": "an fp8 code of another format (e4m3 where e5m2 was expected, or the reverse)",
    "fp8-fnuz-vs-fn": "an e4m3fn code where e4m3fnuz was expected, or the reverse (with or without the x2 scale convention)",
    "scale-inverted": "quantised as x*scale instead of x/scale",
    "scale-swapped": "quantised with the other side's scale (k_scale for V, v_scale for K)",
    "fp8-rounding": "an fp8 code one step from the expected: not rounded to nearest-even (truncation, near-ties)",
    "fp8-nan": "a NaN stored as a finite code",
    "value-cast": "the same value with other bits (NaN payload, -0): a value conversion where a bit copy was meant",
    "byte-order": "the expected bytes of the element in reverse order",
    "bit-flip": "the expected bytes with one bit flipped",
    "zeroed": "zero bytes where the expected bytes are not zero",
    "stray-write": "changed though the op must leave it untouched, to bytes found nowhere else",
    "unexplained": "none of the above fits",
    "not-examined": "differing elements past the examined ones (or outside the mapped blocks of a large cache)",
}
_ID = {name: i for i, name in enumerate(FAULTS)}
_MOVES = ("kv-swapped", "neighbour-slot", "neighbour-block", "other-layer", "other-head", "other-element")
KV_NAMES = ("K", "V")
_DIMS = ("layer", "block", "kv", "slot", "head", "dim")


@dataclasses.dataclass(frozen=True)
class WriteInputs:
    """What a ``reshape_and_cache`` was given: its rows explain bytes no expected element has."""

    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Span:
    """A box of logical elements (inclusive ranges), or guard / padding bytes (``bytes``)."""

    kind: str  # "cache" | "guard-before" | "guard-after" | "padding"
    elements: int  # how many elements of the box are in it
    layer: tuple[int, int] | None = None
    block: tuple[int, int] | None = None
    kv: tuple[int, int] | None = None
    slot: tuple[int, int] | None = None
    head: tuple[int, int] | None = None
    dim: tuple[int, int] | None = None
    bytes: tuple[int, int] | None = None  # guard-before: negative offsets from the cache start; after: from its end
    text: str = ""

    @property
    def volume(self) -> int:
        if self.kind != "cache":
            return self.elements
        size = 1
        for lo, hi in (self.layer, self.block, self.kv, self.slot, self.head, self.dim):
            size *= hi - lo + 1
        return size

    def as_dict(self) -> dict:
        if self.kind != "cache":
            return {self.kind: list(self.bytes), "elements": self.elements, "text": self.text}
        out = {name: list(getattr(self, name)) for name in _DIMS}
        out["kv"] = "".join(KV_NAMES[k] for k in range(self.kv[0], self.kv[1] + 1))
        return {**out, "elements": self.elements, "text": self.text}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One group of wrong elements, its fault class (a key of :data:`FAULTS`) and one sentence."""

    fault: str
    where: Span | None
    sentence: str
    source: Span | None = None  # whose bytes they hold (or, for the other end of a move, where its bytes went)

    def as_dict(self) -> dict:
        return {
            "fault": self.fault,
            "elements": self.where.elements if self.where else None,
            "where": self.where.as_dict() if self.where else None,
            "source": self.source.as_dict() if self.source else None,
            "sentence": self.sentence,
        }

    def line(self) -> str:
        return f"{self.fault}: {self.sentence}"


# ----------------------------------------------------------------------------- maps
class Grid:
    """The offset map of some blocks of a cache (all of a small one): grid index ↔ element offset ↔
    logical coordinates. Grid indices run over ``(L, len(blocks), 2, N, H, D)`` in that order."""

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
        pos = torch.searchsorted(self.sorted, offsets).clamp(max=self.sorted.numel() - 1)
        return torch.where(self.sorted[pos] == offsets, self.order[pos], -1)

    def coords(self, index: torch.Tensor) -> torch.Tensor:
        """``(n, 6)`` logical coordinates ``(l, b, kv, n, h, d)`` of grid indices (real block ids)."""
        if index.numel() == 0:
            return torch.empty(0, 6, dtype=torch.int64)
        c = torch.stack(torch.unravel_index(index, self.shape), dim=1)
        c[:, 1] = self.blocks[c[:, 1]]
        return c


def grid_for(spec, guard: int, differing: torch.Tensor) -> Grid:
    """The whole map of a small cache; for a large one, the map of the blocks (and their neighbours)
    of up to ``SAMPLED`` differing elements spread over all of them (``R.coordinates_of``)."""
    layout, g = spec.layout, spec.geometry
    if layout.numel(g) <= WHOLE_MAP:
        return Grid(layout, g)
    first, span = guard // g.element_size, layout.numel(g)
    inside = differing[(differing >= first) & (differing < first + span)] - first
    if inside.numel() > SAMPLED:
        inside = inside[torch.linspace(0, inside.numel() - 1, SAMPLED).long()]
    found = R.coordinates_of(layout, g, inside, chunk_elements=1 << 22)
    blocks = {c["block"] + step for c in found if c is not None for step in (-1, 0, 1)}
    return Grid(layout, g, torch.tensor(sorted(b for b in blocks if 0 <= b < g.num_blocks), dtype=torch.int64))


def distinct_rows(grid: Grid, spec, guard: int, elements: torch.Tensor) -> torch.Tensor:
    """A row id per arena element: one per (layer, block, kv, slot) row, one per guard side and
    one for padding / unmapped elements, so that rows can be counted and sampled."""
    first, span = guard // spec.geometry.element_size, spec.layout.numel(spec.geometry)
    index = grid.index_of(elements - first)
    g = spec.geometry
    row = torch.where(index >= 0, index // (g.num_kv_heads * g.head_size), -3)
    row = torch.where(elements < first, -1, row)
    return torch.where(elements >= first + span, -2, row)


# ----------------------------------------------------------------------------- diagnosis
def diagnose(spec, expected: torch.Tensor, actual: torch.Tensor, differing: torch.Tensor, *, guard: int,
             initial: torch.Tensor | None = None, writes: WriteInputs | None = None, zero_fill: bool = False,
             grid: Grid | None = None) -> list[Finding]:
    """Findings for the differing arena elements (indices in cache-dtype units from the arena
    start, ascending). ``expected``, ``actual``, ``initial``: the uint8 arena bytes (guard + cache +
    guard) on the CPU. ``zero_fill``: the arena reads zeros where nothing wrote (lazily mapped)."""
    return _Diagnosis(spec, expected, actual, differing, guard, initial, writes, zero_fill, grid).findings()


class _Diagnosis:
    def __init__(self, spec, expected, actual, differing, guard, initial, writes, zero_fill, grid):
        self.spec, self.g, self.layout = spec, spec.geometry, spec.layout
        g = self.g
        self.e, self.first = g.element_size, guard // g.element_size
        self.numel = self.layout.numel(g)
        self.nbytes = self.numel * self.e
        self.total = differing.numel()
        self.grid = grid or grid_for(spec, guard, differing)
        self.bytes = {"want": expected, "got": actual, "init": initial}
        bits = R.bits_dtype(g.dtype)
        self.want_bits, self.got_bits = expected.view(bits), actual.view(bits)
        self.init_bits = initial.view(bits) if initial is not None else None
        self.writes, self.zero_fill = writes, zero_fill

        pos = differing[:EXAMINED].to(torch.int64)
        inner = pos - self.first
        index = torch.where((inner >= 0) & (inner < self.numel), self.grid.index_of(inner.clamp(0, max(self.numel - 1, 0))), -1)
        self.kind = torch.where(inner < 0, 0, torch.where(inner >= self.numel, 3, torch.where(index >= 0, 1, 2)))
        if not self.grid.whole:  # unmapped blocks of a large cache: not examined here
            self.unmapped = int(((self.kind == 2)).sum())
            keep = self.kind != 2
            pos, inner, index, self.kind = pos[keep], inner[keep], index[keep], self.kind[keep]
        else:
            self.unmapped = 0
        self.pos, self.inner, self.index = pos, inner, index
        self.coords = torch.zeros(pos.numel(), 6, dtype=torch.int64)
        logical = self.kind == 1
        self.coords[logical] = self.grid.coords(index[logical])
        self.w, self.a = self.want_bits[pos], self.got_bits[pos]
        self.i0 = self.init_bits[pos] if self.init_bits is not None else None
        n = pos.numel()
        self.fault = torch.full((n,), -1, dtype=torch.int64)
        self.source = torch.full((n,), -1, dtype=torch.int64)  # grid index of the element whose bytes it holds
        self.tag = torch.zeros(n, dtype=torch.int64)  # layout alternative / token / 1 for the far end of a move
        self.alternatives: list[str] = []

    # ------------------------------------------------------------------ helpers
    def _open(self, logical_only: bool = True) -> torch.Tensor:
        mask = self.fault < 0
        return mask & (self.kind == 1) if logical_only else mask

    def _set(self, mask: torch.Tensor, fault: str, source=None, tag=None) -> None:
        self.fault[mask] = _ID[fault]
        if source is not None:
            self.source[mask] = source[mask] if source.numel() == mask.numel() else source
        if tag is not None:
            self.tag[mask] = tag[mask] if isinstance(tag, torch.Tensor) else tag

    def _written(self, grid_index: torch.Tensor) -> torch.Tensor:
        """Whether the op writes each element (expected differs from the initial bytes); True when unknown."""
        if self.init_bits is None:
            return torch.ones_like(grid_index, dtype=torch.bool)
        at = self.grid.offsets[grid_index] + self.first
        return self.want_bits[at] != self.init_bits[at]

    # ------------------------------------------------------------------ hypotheses
    def findings(self) -> list[Finding]:
        self._set(self.kind == 0, "out-of-bounds")
        self._set(self.kind == 3, "out-of-bounds")
        self._set(self.kind == 2, "stray-write")  # page padding: no logical element lives there
        self._never_written()
        self._wrong_layout()
        self._moves()
        self._input_rows()
        self._transforms()
        self._far_ends_of_moves()
        self._stray_writes()
        self._set(self._open(), "unexplained")
        return _Report(self).findings()

    def _never_written(self) -> None:
        if self.i0 is not None:
            self._set(self._open() & (self.a == self.i0) & (self.w != self.i0), "never-written")
        elif self.zero_fill:
            self._set(self._open() & (self.a == 0) & (self.w != 0), "never-written", tag=1)

    def _wrong_layout(self) -> None:
        """Layouts derived from the declared one by permuting its dimension list: the one that
        explains at least two thirds of the elements left (and 4 or more) wins."""
        todo = self._open()
        if not self.grid.whole or int(todo.sum()) == 0:
            return
        best = None
        for alt_id, (layout, g, what) in enumerate(alternative_layouts(self.layout, self.g)):
            self.alternatives.append(what)
            alt = Grid(layout, g)
            where = alt.index_of(self.inner.clamp(min=0))  # which logical element the alternative puts here
            ok = todo & (where >= 0)
            source = torch.where(ok, where, 0)
            true_offset = self.grid.offsets[source]
            match = ok & (true_offset != self.inner) & (self.got_bits[self.pos] == self.want_bits[true_offset + self.first]) & self._written(source)
            if best is None or int(match.sum()) > int(best[1].sum()):
                best = (alt_id, match, source)
        if best is None:
            return
        alt_id, match, source = best
        left = int(todo.sum())
        if int(match.sum()) >= max(min(4, left), -(-2 * left // 3)):
            self._set(match, "wrong-layout", source, alt_id)

    def _moves(self) -> None:
        """Bytes found once, with ``WINDOW`` bytes of context, at another element of the expected cache."""
        todo = self._open(logical_only=False) | (self.kind == 0) | (self.kind == 3)
        if int(todo.sum()) == 0:
            return
        want, got = self.bytes["want"], self.bytes["got"]
        starts = (self.grid.offsets + self.first) * self.e
        fits = starts + WINDOW <= want.numel()
        keys, constant = _window_keys(want, starts[fits])
        start_index = torch.nonzero(fits).flatten()[~constant]
        keys, order = torch.sort(keys[~constant])
        if keys.numel() == 0:
            return
        found = torch.full_like(self.pos, -1)
        for back in range(max(1, WINDOW // self.e)):
            look = todo & (found < 0)
            q = (self.pos - back) * self.e
            look &= (q >= 0) & (q + WINDOW <= got.numel())
            if not bool(look.any()):
                continue
            qkeys, qconstant = _window_keys(got, q[look])
            at = torch.searchsorted(keys, qkeys).clamp(max=keys.numel() - 1)
            nxt = (at + 1).clamp(max=keys.numel() - 1)
            unique = (keys[at] == qkeys) & ~qconstant & ((nxt == at) | (keys[nxt] != qkeys))
            src_offset = self.grid.offsets[start_index[order[at]]] + back
            src = self.grid.index_of(src_offset)
            hit = unique & (src >= 0) & (src_offset != self.inner[look])
            chosen = torch.nonzero(look).flatten()[hit]
            found[chosen] = src[hit]
        moved = found >= 0
        guards = moved & ((self.kind == 0) | (self.kind == 3))
        self.source[guards] = found[guards]  # out-of-bounds stays the class; the source is named
        logical = moved & (self.kind == 1)
        if not bool(logical.any()):
            return
        delta = self.grid.coords(found.clamp(min=0)) - self.coords
        for name in _MOVES:
            mask = logical & _move_kind(delta, self.g, name)
            self._set(mask, name, found)
            logical &= ~mask

    def _input_rows(self) -> None:
        """Rows that equal an input row a write must not store: a padding token's, or one past len(slot_mapping)."""
        if self.writes is None:
            return
        todo = self._open()
        if not bool(todo.any()):
            return
        g, w = self.g, self.writes
        D = g.head_size
        rows = torch.unique(self.index[todo] // D)[:ROWS_PER_CANDIDATE_CHECK]
        row_elements = rows[:, None] * D + torch.arange(D)
        found = self.got_bits[self.grid.offsets[row_elements] + self.first]  # (R, D)
        kv = self.grid.coords(rows * D)[:, 2]
        slots = w.slot_mapping.cpu().long()
        bits = R.bits_dtype(g.dtype)
        row_token = torch.full_like(rows, -1)
        row_head = torch.zeros_like(rows)
        for side, (x, scale) in enumerate(((w.key, w.k_scale), (w.value, w.v_scale))):
            encoded = R.ops.encode(x.cpu(), g, scale.cpu() if isinstance(scale, torch.Tensor) else scale, head_dim=1).view(bits)
            candidates = encoded.reshape(-1, D)  # (T'·H, D)
            mine = kv == side
            if not bool(mine.any()):
                continue
            same = (found[mine][:, None, :] == candidates[None]).all(dim=-1)  # (R_side, T'·H)
            single = same.sum(dim=1) == 1
            which = same.float().argmax(dim=1)
            index = torch.nonzero(mine).flatten()[single]
            row_token[index], row_head[index] = which[single] // g.num_kv_heads, which[single] % g.num_kv_heads
        T = slots.numel()
        padded = (row_token >= 0) & (row_token < T) & (slots[row_token.clamp(0, max(T - 1, 0))] < 0) if T else torch.zeros_like(rows, dtype=torch.bool)
        extra = row_token >= T
        element_row = self.index // D
        for mask, fault in ((padded, "padding-written"), (extra, "extra-row")):
            hit = todo & torch.isin(element_row, rows[mask])
            if bool(hit.any()):
                token = row_token[torch.searchsorted(rows, element_row[hit])]
                tag = torch.zeros_like(self.tag)
                tag[hit] = token
                self._set(hit, fault, tag=tag)

    def _transforms(self) -> None:
        """The same element under a known transformation, accepted per (layer, block, kv) group
        where it explains at least half the elements left there (or all of a group of ≤ 4)."""
        todo = self._open()
        if not bool(todo.any()):
            return
        group = row_ids(self.coords[:, :3])
        for fault, mask in _element_transforms(self, todo):
            left = self._open()
            hit = left & mask
            if not bool(hit.any()):
                continue
            size = int(group.max()) + 1
            count_left = torch.bincount(group[left], minlength=size)
            count_hit = torch.bincount(group[hit], minlength=size)
            accepted = (2 * count_hit >= count_left) | (count_left <= 4)
            self._set(hit & accepted[group], fault)

    def _far_ends_of_moves(self) -> None:
        """An element whose expected bytes another element holds: the far end of that move."""
        todo = self._open()
        moved = torch.isin(self.fault, torch.tensor([_ID[m] for m in _MOVES + ("wrong-layout",)])) & (self.source >= 0)
        if not bool(todo.any()) or not bool(moved.any()):
            return
        sources, holders = self.source[moved], torch.nonzero(moved).flatten()
        order = torch.argsort(sources)
        sources, holders = sources[order], holders[order]
        at = torch.searchsorted(sources, self.index).clamp(max=sources.numel() - 1)
        hit = todo & (sources[at] == self.index)
        holder = holders[at]
        for fault_id in torch.unique(self.fault[holder[hit]]).tolist():
            mask = hit & (self.fault[holder] == fault_id)
            self.fault[mask] = fault_id
            self.source[mask] = self.index[holder[mask]]
            self.tag[mask] = -1 - self.tag[holder[mask]]  # the far end; keeps the alternative / 0

    def _stray_writes(self) -> None:
        if self.i0 is None:
            return
        self._set(self._open() & (self.w == self.i0), "stray-write")


# ----------------------------------------------------------------------------- hypotheses' pieces
def _window_keys(buffer: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``WINDOW`` bytes at each start as one int64, and whether they are all one byte value
    (zero pages, constant fills: such windows are everywhere and prove nothing)."""
    raw = buffer[starts[:, None] + torch.arange(WINDOW)]
    return raw.contiguous().view(torch.int64).flatten(), (raw == raw[:, :1]).all(dim=1)


def _move_kind(delta: torch.Tensor, g: R.Geometry, name: str) -> torch.Tensor:
    """Which coordinate differences ``source − destination`` (``(n, 6)``) are moves of this kind."""
    nonzero = delta != 0
    only = lambda *cols: nonzero[:, list(cols)].any(dim=1) & ~nonzero[:, [c for c in range(6) if c not in cols]].any(dim=1)  # noqa: E731
    if name == "kv-swapped":
        return only(2)
    if name == "neighbour-slot":
        return only(1, 3) & ((delta[:, 1] * g.block_size + delta[:, 3]).abs() == 1)
    if name == "neighbour-block":
        return only(1) & (delta[:, 1].abs() == 1)
    if name == "other-layer":
        return only(0)
    if name == "other-head":
        return only(4)
    return torch.ones(delta.shape[0], dtype=torch.bool)


def alternative_layouts(layout: R.Layout, g: R.Geometry) -> list[tuple[R.Layout, R.Geometry, str]]:
    """Layouts a kernel gets instead of the declared one by one confusion, each with what it is:
    the block and K/V dims swapped (kv-first vs blocks-first), N and H swapped (NHD vs HND), V in
    K's tile form or K in V's, and x = 16 // e of another element size."""
    out = []

    def swapped(dims, a, b):
        dims = list(dims)
        i, j = dims.index(a), dims.index(b)
        dims[i], dims[j] = dims[j], dims[i]
        return tuple(dims)

    def add(candidate, geometry, what):
        try:
            candidate.validate(geometry)
        except ValueError:
            return
        if candidate.numel(geometry) == layout.numel(g) and (candidate.k_dims, candidate.v_dims, geometry.x) != (layout.k_dims, layout.v_dims, g.x):
            out.append((candidate, geometry, what))

    dims = layout.k_dims
    if "B" in dims and "2" in dims and abs(dims.index("B") - dims.index("2")) == 1:
        kv_outer = dims.index("2") < dims.index("B")
        add(dataclasses.replace(layout, k_dims=swapped(layout.k_dims, "B", "2"), v_dims=swapped(layout.v_dims, "B", "2")), g,
            "blocks-first (blocks outside K/V)" if kv_outer else "kv-first (K/V planes outside the blocks)")
    if not layout.is_tiled and "N" in dims and "H" in dims:
        head_major = dims.index("H") < dims.index("N")
        add(dataclasses.replace(layout, k_dims=swapped(dims, "N", "H"), v_dims=swapped(dims, "N", "H")), g,
            "NHD (slot outside head)" if head_major else "HND (head outside slot)")
    if layout.is_tiled:
        common = 0
        while layout.k_dims[common] == layout.v_dims[common]:
            common += 1
        k_tile, v_tile = layout.k_dims[common:], layout.v_dims[common:]
        if len(k_tile) == len(v_tile):
            add(dataclasses.replace(layout, v_dims=layout.v_dims[:common] + k_tile), g, f"V in K's tile form [{','.join(k_tile)}]".replace("x:d", "x"))
            add(dataclasses.replace(layout, k_dims=layout.k_dims[:common] + v_tile), g, f"K in V's tile form [{','.join(v_tile)}]".replace("x:n", "x"))
        for dtype in (torch.uint8, torch.bfloat16, torch.float32):
            other = dataclasses.replace(g, dtype=dtype)
            if other.x != g.x:
                add(layout, other, f"x = 16 // {other.element_size} = {other.x} (a {other.element_size}-byte dtype's) instead of {g.x}")
    return out


def _element_transforms(d: _Diagnosis, todo: torch.Tensor):
    """``(fault, mask)`` per transformation of an element's expected bytes, most specific first."""
    g = d.g
    n = d.pos.numel()
    none = torch.zeros(n, dtype=torch.bool)
    fp8 = g.dtype in R.fp8.FP8_DTYPES
    x, scale, other_scale = _inputs_of(d) if d.writes is not None else (None, None, None)
    known = torch.zeros(n, dtype=torch.bool) if x is None else ~torch.isnan(scale)
    if fp8:
        fmt = R.fp8.fp8_format(g.dtype)
        w_codes, a_codes = d.w.view(torch.uint8), d.a.view(torch.uint8)
        want, got = R.fp8.decode_codes(w_codes, fmt), R.fp8.decode_codes(a_codes, fmt)
        input_nan = known & torch.isnan(x) if x is not None else none
        yield "fp8-nan", (torch.isnan(want) | input_nan) & ~torch.isnan(got)
        for fault, others in _other_formats(fmt):
            mask = none.clone()
            for other, ratio in others:
                mask |= _reencoded_equal(a_codes, w_codes, fmt, other, ratio)
                if x is not None:
                    mask |= known & (R.fp8.quantize(x, (scale * ratio).nan_to_num(1.0), other, head_dim=-1).view(torch.uint8) == a_codes)
            yield fault, mask
        if x is not None:
            safe = scale.nan_to_num(1.0)
            yield "scale-inverted", known & (R.fp8.quantize(x, 1 / safe, fmt, head_dim=-1).view(torch.uint8) == a_codes) & (safe != 1)
            swap = known & (other_scale != scale)
            yield "scale-swapped", swap & (R.fp8.quantize(x, other_scale.nan_to_num(1.0), fmt, head_dim=-1).view(torch.uint8) == a_codes)
        finite = torch.isfinite(want) & torch.isfinite(got)
        adjacent = ((w_codes & 0x80) == (a_codes & 0x80)) & ((w_codes & 0x7F).int() - (a_codes & 0x7F).int()).abs().eq(1)
        if x is not None:
            y = x / scale.nan_to_num(1.0)
            bracket = known & ((got - y) * (want - y) <= 0)
            adjacent = torch.where(known, bracket & adjacent, adjacent)
        yield "fp8-rounding", finite & adjacent
        yield "value-cast", (want == got) | (torch.isnan(want) & torch.isnan(got))
    else:
        want, got = d.w.view(g.dtype).float(), d.a.view(g.dtype).float()
        yield "value-cast", (want == got) | (torch.isnan(want) & torch.isnan(got))
        if d.e > 1:
            flipped = d.w.view(torch.uint8).view(n, d.e).flip(1).contiguous().view(d.w.dtype).flatten()
            yield "byte-order", flipped == d.a
    yield "bit-flip", _popcount(d.w ^ d.a) == 1
    yield "zeroed", (d.a == 0) & (d.w != 0)


def _other_formats(fmt):
    """Per fault class, the other fp8 formats a code may be in and the value ratio that maps the
    other format's value to this one's (the ×2 scale convention between e4m3fn and e4m3fnuz)."""
    F = R.fp8.FORMATS
    if fmt.name == "float8_e4m3fnuz":
        yield "fp8-fnuz-vs-fn", [(F["float8_e4m3fn"], 0.5), (F["float8_e4m3fn"], 1.0)]
    if fmt.name == "float8_e4m3fn":
        yield "fp8-fnuz-vs-fn", [(F["float8_e4m3fnuz"], 2.0), (F["float8_e4m3fnuz"], 1.0)]
    if fmt.name == "float8_e5m2":
        yield "fp8-format", [(F["float8_e4m3fn"], 1.0), (F["float8_e4m3fnuz"], 1.0)]
    else:
        yield "fp8-format", [(F["float8_e5m2"], 1.0)]


def _reencoded_equal(a_codes, w_codes, fmt, other, ratio) -> torch.Tensor:
    """The actual code, read as ``other`` and scaled by ``ratio``, re-encodes to the expected one
    (NaN for NaN; the other format's ±max for a saturated ±max of this one)."""
    value = R.fp8.decode_codes(a_codes, other) * ratio
    want = R.fp8.decode_codes(w_codes, fmt)
    same = R.fp8.quantize(value, 1.0, fmt).view(torch.uint8) == w_codes
    nan = torch.isnan(value) & torch.isnan(want)
    saturated = (value.abs() == other.max_finite * ratio) & (want.abs() == fmt.max_finite) & (torch.sign(value) == torch.sign(want))
    return same | nan | saturated


def _inputs_of(d: _Diagnosis):
    """Per examined element: the input value a write stored there, its side's scale and the other
    side's (NaN where no written token's element is there)."""
    g, w = d.g, d.writes
    n = d.pos.numel()
    slots = w.slot_mapping.cpu().long()
    T = slots.numel()
    written = torch.nonzero(slots >= 0).flatten()
    ordered, order = torch.sort(slots[written])
    c = d.coords
    slot = c[:, 1] * g.block_size + c[:, 3]
    at = torch.searchsorted(ordered, slot).clamp(max=max(ordered.numel() - 1, 0))
    hit = (d.kind == 1) & (c[:, 0] == d.spec.layer) if ordered.numel() else torch.zeros(n, dtype=torch.bool)
    if ordered.numel():
        hit &= ordered[at] == slot
    token = torch.where(hit, written[order[at]] if ordered.numel() else at, 0).clamp(max=max(T - 1, 0))
    x = torch.full((n,), float("nan"))
    scale, other_scale = x.clone(), x.clone()
    if not bool(hit.any()):
        return x, scale, other_scale
    scales = [torch.as_tensor(s, dtype=torch.float32).cpu().flatten() for s in (w.k_scale, w.v_scale)]
    for side, rows in enumerate((w.key, w.value)):
        mine = hit & (c[:, 2] == side)
        if not bool(mine.any()):
            continue
        x[mine] = rows.cpu().float()[token[mine], c[mine, 4], c[mine, 5]]
        for target, which in ((scale, side), (other_scale, 1 - side)):
            s = scales[which]
            target[mine] = s[c[mine, 4]] if s.numel() > 1 else s[0]
    return x, scale, other_scale


def row_ids(rows: torch.Tensor) -> torch.Tensor:
    """An id per row of an integer matrix, equal ids for equal rows (ids are 0..count-1): the
    columns' ids combined one column at a time (``torch.unique(dim=0)`` is far slower)."""
    ids = torch.zeros(rows.shape[0], dtype=torch.int64)
    for column in rows.T:
        values, inverse = torch.unique(column, return_inverse=True)
        ids = torch.unique(ids * values.numel() + inverse, return_inverse=True)[1]
    return ids


def _popcount(bits: torch.Tensor) -> torch.Tensor:
    value = bits.to(torch.int64) & ((1 << (8 * bits.element_size())) - 1)
    count = torch.zeros_like(value)
    for _ in range(8 * bits.element_size()):
        count += value & 1
        value = value >> 1
    return count


# ----------------------------------------------------------------------------- findings
class _Report:
    """Groups the classified elements by (fault, layer, block, kv, relation) and words each group."""

    def __init__(self, d: _Diagnosis):
        self.d = d

    def findings(self) -> list[Finding]:
        d = self.d
        out = []
        if d.pos.numel():
            delta = torch.zeros_like(d.coords)
            has_source = (d.source >= 0) & (d.kind == 1)
            delta[has_source] = d.grid.coords(d.source[has_source]) - d.coords[has_source]
            relation = torch.where((d.fault == _ID["wrong-layout"]).unsqueeze(1), torch.zeros_like(delta), delta)
            key = torch.cat([d.kind[:, None], d.fault[:, None], d.coords[:, :3], relation, d.tag[:, None]], dim=1)
            key[d.kind != 1, 2:] = 0
            key[d.kind != 1, -1] = d.tag[d.kind != 1]
            inverse = row_ids(key)
            groups = torch.empty(int(inverse.max()) + 1)
            order_key = torch.where(d.kind == 1, d.index, d.pos + (d.kind == 3).long() * (1 << 60) + (d.kind == 2).long() * (1 << 59)
                                    - (d.kind == 0).long() * (1 << 61))
            first = torch.full((groups.shape[0],), 1 << 62, dtype=torch.int64).scatter_reduce(0, inverse, order_key, "amin")
            for rank, group in enumerate(torch.argsort(first).tolist()):
                if rank == LISTED:
                    out.append(Finding("not-examined", None, f"{groups.shape[0] - LISTED} more groups of differing elements are not listed"))
                    break
                out.append(self._finding(torch.nonzero(inverse == group).flatten()))
        skipped = d.total - min(d.total, EXAMINED) + d.unmapped
        if skipped:
            why = f"only the first {EXAMINED} are examined" if d.total > EXAMINED else "they lie in blocks this large cache's map does not cover"
            out.append(Finding("not-examined", None, f"{skipped} more differing elements are not explained ({why})"))
        return out

    def _finding(self, members: torch.Tensor) -> Finding:
        d = self.d
        fault = list(FAULTS)[int(d.fault[members[0]])]
        kind = int(d.kind[members[0]])
        if kind != 1:
            return self._outside(fault, kind, members)
        where = span_of(d.coords[members], d.g)
        tag = int(d.tag[members[0]])
        sources = d.source[members]
        source = span_of(d.grid.coords(sources[sources >= 0]), d.g) if bool((sources >= 0).any()) else None
        far = tag < 0 and fault in _MOVES + ("wrong-layout",)
        sentence = self._sentence(fault, where, source, members, tag, far)
        if fault == "stray-write":
            fault, sentence = self._next_to_written(where, members, sentence)
        return Finding(fault, where, sentence, source)

    def _sentence(self, fault, where, source, members, tag, far) -> str:
        d = self.d
        w = where.text
        src = _relative_text(source, where, d.g) if source else ""
        if far:
            what = d.alternatives[-1 - tag] if fault == "wrong-layout" else ""
            return f"{w} does not hold its bytes; {src} does{(': where ' + what + ' puts them') if what else ''}"
        if fault == "never-written":
            went = self._went_to(members)
            still = "still holds zeros, as the lazily mapped arena reads where nothing wrote" if tag == 1 else "still holds its initial bytes"
            return f"{w} was never written: it {still}" + (f"; its bytes are at {went}" if went else "")
        if fault in _MOVES:
            reason = {"kv-swapped": ": K and V swapped", "neighbour-slot": ": the neighbouring slot's",
                      "neighbour-block": ": the neighbouring block's", "other-layer": ": another layer's",
                      "other-head": f": head {_signed(int(source.head[0]) - int(where.head[0]))}" if source else ""}.get(fault, "")
            untouched = self._untouched(d.source[members])
            return f"{w} holds {src}'s bytes{reason}" + (f"; {untouched} is untouched" if untouched else "")
        if fault == "wrong-layout":
            untouched = self._untouched(d.source[members])
            return (f"{w} holds {src}'s bytes: where {d.alternatives[tag]} puts them"
                    + (f"; {untouched} is untouched" if untouched else ""))
        if fault in ("padding-written", "extra-row"):
            token, T = tag, d.writes.slot_mapping.numel()
            side = ("key", "value")[int(where.kv[0])]
            if fault == "padding-written":
                return f"{w} holds the {side} row of token {token}, whose slot is {int(d.writes.slot_mapping.cpu()[token])}: padding was written"
            return f"{w} holds {side} row {token}, past len(slot_mapping) = {T}: rows beyond the tokens were written"
        return f"{w}: {self._element_story(fault, members)}"

    def _element_story(self, fault, members) -> str:
        d = self.d
        g = d.g
        n = members.numel()
        if fault == "fp8-nan":
            codes = sorted({f"{c:02x}" for c in d.a[members].view(torch.uint8).tolist()})
            return f"a NaN stored as finite code{'s' if len(codes) > 1 else ''} {', '.join(codes[:3])} (FP8-NAN: a NaN must stay a NaN)"
        if fault == "fp8-fnuz-vs-fn":
            other = "float8_e4m3fn" if g.dtype == torch.float8_e4m3fnuz else "float8_e4m3fnuz"
            return f"{other} codes where {str(g.dtype).removeprefix('torch.')} was expected (−0, saturation and NaN codes differ)"
        if fault == "fp8-format":
            other = "e4m3" if g.dtype == torch.float8_e5m2 else "e5m2"
            return f"{other} codes where {str(g.dtype).removeprefix('torch.')} was expected"
        if fault == "scale-inverted":
            return "quantised as x·scale instead of x / scale"
        if fault == "scale-swapped":
            side = int(d.coords[members[0], 2])
            return f"{KV_NAMES[side]} quantised with {('v_scale', 'k_scale')[side]} instead of {('k_scale', 'v_scale')[side]}"
        if fault == "fp8-rounding":
            fmt = R.fp8.fp8_format(g.dtype)
            want = R.fp8.decode_codes(d.w[members].view(torch.uint8), fmt).abs()
            got = R.fp8.decode_codes(d.a[members].view(torch.uint8), fmt).abs()
            toward_zero = bool((got < want).all())
            return (f"{n} code{'s' if n > 1 else ''} one step from the expected"
                    + (", toward zero: truncated instead of rounded to nearest-even" if toward_zero else ": not rounded to the nearest code (near-ties taken for ties?)"))
        if fault == "value-cast":
            return "the same values with other bits (NaN payload or −0): a value cast where a bit copy was meant"
        if fault == "byte-order":
            return f"the expected bytes of each element in reverse order ({g.element_size}-byte elements)"
        if fault == "bit-flip":
            first = int(members[0])
            diff = int(d.w[first] ^ d.a[first]) & ((1 << (8 * g.element_size)) - 1)
            bit = diff.bit_length() - 1
            return f"one bit differs (bit {bit % 8} of byte {bit // 8}" + (f"; {n} elements like it)" if n > 1 else ")")
        if fault == "zeroed":
            return "holds zero bytes where the expected bytes are not zero"
        if fault == "stray-write":
            return "changed though the op must leave it untouched (its new bytes are nowhere in the expected cache)"
        return f"{n} element{'s' if n > 1 else ''} differ; no known fault explains {'them' if n > 1 else 'it'}"

    def _untouched(self, sources: torch.Tensor) -> str:
        """The sources, when all of them are themselves never written."""
        d = self.d
        sources = sources[sources >= 0]
        never = d.index[d.fault == _ID["never-written"]]
        if sources.numel() == 0 or never.numel() == 0 or not bool(torch.isin(sources, never).all()):
            return ""
        return span_of(d.grid.coords(sources), d.g).text

    def _went_to(self, members: torch.Tensor) -> str:
        """Where the expected bytes of these elements went (elements holding them as a move)."""
        d = self.d
        moved = torch.isin(d.fault, torch.tensor([_ID[m] for m in _MOVES + ("wrong-layout",)])) & torch.isin(d.source, d.index[members])
        return span_of(d.coords[moved], d.g).text if bool(moved.any()) else ""

    def _next_to_written(self, where: Span, members: torch.Tensor, sentence: str) -> tuple[str, str]:
        """A stray write right after (or before) elements the op wrote correctly: a copy or a
        write that ran on into the neighbouring block or slot."""
        d = self.d
        offsets = d.inner[members]
        for side, offset in (("after", int(offsets.min()) - 1), ("before", int(offsets.max()) + 1)):
            if not 0 <= offset < d.numel:
                continue
            index = d.grid.index_of(torch.tensor([offset]))
            if int(index[0]) < 0:
                continue
            at = offset + d.first
            correct = d.want_bits[at] != d.init_bits[at] and d.got_bits[at] == d.want_bits[at]
            if not bool(correct):
                continue
            c = d.grid.coords(index)[0]
            neighbour = span_of(c[None], d.g).text
            if int(c[1]) != where.block[0]:
                return "neighbour-block", f"{where.text} was overwritten though the op leaves it: it lies right {side} {neighbour}, which the op wrote — the copy ran on into the neighbouring block"
            return "neighbour-slot", f"{where.text} was overwritten though the op leaves it: it lies right {side} {neighbour}, which the op wrote — the write ran on into the neighbouring slot"
        return "stray-write", sentence

    def _outside(self, fault: str, kind: int, members: torch.Tensor) -> Finding:
        d = self.d
        byte = d.pos[members] * d.e
        if kind == 2:
            lo, hi = int(byte.min()) - d.first * d.e, int(byte.max()) + d.e - 1 - d.first * d.e
            where = Span("padding", members.numel(), bytes=(lo, hi), text=f"padding bytes {lo}..{hi} of the cache")
            return Finding(fault, where, f"{members.numel() * d.e} page padding bytes (no logical element) at cache bytes {lo}..{hi} were written")
        if kind == 0:
            lo, hi = int(byte.min()) - d.first * d.e, int(byte.max()) + d.e - 1 - d.first * d.e
            where = Span("guard-before", members.numel(), bytes=(lo, hi), text=f"guard bytes {lo}..{hi} before the cache")
            place = f"{hi - lo + 1} bytes before the cache ({lo}..{hi})"
        else:
            lo = int(byte.min()) - d.first * d.e - d.nbytes
            hi = int(byte.max()) + d.e - 1 - d.first * d.e - d.nbytes
            where = Span("guard-after", members.numel(), bytes=(lo, hi), text=f"guard bytes +{lo}..+{hi} past the end of the cache")
            place = f"{hi - lo + 1} bytes past the end of the cache (+{lo}..+{hi})"
        sources = d.source[members]
        source = span_of(d.grid.coords(sources[sources >= 0]), d.g) if bool((sources >= 0).any()) else None
        holds = f"; they hold {source.text}'s bytes" if source else ""
        return Finding(fault, where, f"guard {place} changed: written out of bounds{holds}", source)


def span_of(coords: torch.Tensor, g: R.Geometry) -> Span:
    """The box around logical coordinates ``(n, 6)``, worded ``K[b=1, s=15, h=0..3]``."""
    lo, hi = coords.amin(dim=0).tolist(), coords.amax(dim=0).tolist()
    ranges = dict(zip(_DIMS, zip(lo, hi)))
    unique = int(row_ids(coords).max()) + 1
    span = Span("cache", unique, **ranges)
    return dataclasses.replace(span, text=_box_text(span, g) + (f" ({unique} of {span.volume} elements)" if unique < span.volume else ""))


def _box_text(span: Span, g: R.Geometry, skip=()) -> str:
    def rng(r):
        return f"{r[0]}" if r[0] == r[1] else f"{r[0]}..{r[1]}"

    side = "".join(KV_NAMES[k] for k in range(span.kv[0], span.kv[1] + 1))
    side = "K/V" if side == "KV" else side
    parts = []
    if g.num_layers > 1 and "layer" not in skip:
        parts.append(f"l={rng(span.layer)}")
    parts.append(f"b={rng(span.block)}")
    parts.append(f"s={rng(span.slot)}")
    if g.num_kv_heads > 1 and "head" not in skip:
        parts.append(f"h={rng(span.head)}")
    if span.dim != (0, g.head_size - 1) and "dim" not in skip:
        parts.append(f"d={rng(span.dim)}")
    return f"{side}[{', '.join(parts)}]"


def _relative_text(source: Span, where: Span, g: R.Geometry) -> str:
    """The source box, leaving out the head and dim ranges it shares with the destination."""
    skip = tuple(name for name in ("head", "dim") if getattr(source, name) == getattr(where, name))
    return _box_text(source, g, skip)


def _signed(value: int) -> str:
    return f"{'+' if value > 0 else '−'}{abs(value)}"
