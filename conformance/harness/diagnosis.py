"""Where the wrong bytes came from: a failed byte comparison explained in logical coordinates.

:func:`diagnose` takes the expected and actual arena bytes (guard + cache + guard), the initial
(pre-op) bytes when the caller kept them, the cache's spec, the differing element indices and,
for a write, its inputs. It groups the wrong elements by logical coordinate and explains each
group where the bytes allow it, with a fault class from the fixed vocabulary :data:`FAULTS`::

    kv-swapped: K[b=1, s=15, h=0..3] holds V[b=1, s=15]'s bytes: K and V swapped; V[b=1, s=15] is untouched
    never-written: V[b=1, s=15, h=0..3] was never written: it still holds its initial bytes; its bytes are at K[b=1, s=15]

Explanations are tried in a fixed order, each on the elements the earlier ones left:

1. a guard byte changed (``out-of-bounds``), or a padding byte of a padded page;
2. the element still holds its initial bytes though the op writes it (``never-written``) —
   taken here only where that is unmistakable (elements of 2+ bytes, or a whole row of a 1-byte
   cache; otherwise it competes in step 6);
3. the bytes are where a layout derived from the declared one by one confusion puts them
   (kv-first for blocks-first, HND for NHD, V in K's tile form, x of another element size):
   ``wrong-layout``, when that explains two thirds of what is left;
4. the bytes, with ``WINDOW`` bytes of context, are found exactly once at another element of the
   expected cache: the element holds that element's bytes (``kv-swapped``, ``neighbour-slot``,
   ``neighbour-block``, ``other-layer``, ``other-head``, ``other-element``); a move found for part
   of a row is then tried, element by element, on the rest of that row;
5. a whole row equals an input row that a write must not store (``padding-written``,
   ``extra-row``);
6. the same element under a transformation — never written, an fp8 code of another format,
   fnuz vs fn, the scale inverted or swapped, a constant factor, one bit, a rounding step, a
   value cast, reversed bytes, zeros. Single 1-byte elements match some of these by chance, so
   they compete: the transformation that explains the most elements of this failure goes first,
   and each is taken in a (layer, block, kv) group only where it explains at least half of what
   is left there;
7. an element whose expected bytes another element holds: the far end of a move;
8. an element the op leaves that changed: ``stray-write`` (``neighbour-block`` /
   ``neighbour-slot`` when it lies right next to bytes the op wrote correctly: a copy that ran on);
9. ``unexplained``.

Every address comes from the reference's offset map (:func:`R.offset_map` of the declared layout,
or of a layout derived from it by permuting its dimension list); fp8 transforms use
reference/fp8.py. The work is vectorised and capped: at most ``EXAMINED`` differing elements
are explained (a ``not-examined`` finding says how many were not), and caches past
``WHOLE_MAP`` elements are mapped only in the blocks the differences touch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math

import torch

from kvconform import reference as R

EXAMINED = 4096  # differing elements explained per failure
WHOLE_MAP = 1 << 22  # caches up to this many elements are mapped whole (and get layout hypotheses)
SAMPLED = 256  # differing elements whose blocks a larger cache's partial map covers
WINDOW = 8  # bytes of context that identify where a run of bytes came from
DISTINCT = 4  # byte values a window needs to count as evidence (zero pages and fills do not)
LISTED = 64  # findings returned (the rest are summed up in one not-examined finding)
CANDIDATE_ROWS = 512  # rows compared with a write's input rows
COMMON_MOVES = 8  # moves of a failure tried on every element left

FAULTS = {
    "out-of-bounds": "a guard byte before or after the cache changed: written out of bounds",
    "never-written": "an element the op writes still holds its initial (pre-op) bytes",
    "wrong-layout": "the bytes are where a layout derived from the declared one puts them (kv-first for "
                    "blocks-first, HND for NHD, V in K's tile form, x of another element size)",
    "kv-swapped": "holds the expected bytes of the same element of the other side (K for V, V for K)",
    "neighbour-slot": "holds the bytes of the same element one slot before or after; or, changed though the op "
                      "leaves it, lies right next to a slot the op wrote correctly",
    "neighbour-block": "holds the bytes of the same element in the block before or after; or, changed though the "
                       "op leaves it, lies right next to a block the op wrote correctly (a copy that ran on)",
    "block-id-wrap": "holds the bytes of the same element of a block whose id is the same modulo 2^16, 2^20 or 2^32: "
                     "block ids truncated to 16, 20 or 32 bits (or an address past 2^31 computed in 32 bits)",
    "other-layer": "holds the bytes of the same element of another layer",
    "other-head": "holds the bytes of the same element of another head",
    "other-element": "holds the expected bytes of another logical element",
    "padding-written": "holds the input row of a token whose slot is negative (padding)",
    "extra-row": "holds an input row past len(slot_mapping)",
    "fp8-format": "an fp8 code of another format (e4m3 where e5m2 was expected, or the reverse)",
    "fp8-fnuz-vs-fn": "an e4m3fn code where e4m3fnuz was expected, or the reverse (with or without the x2 scale convention)",
    "scale-inverted": "quantised as x*scale instead of x/scale",
    "scale-swapped": "quantised with the other side's scale (k_scale for V, v_scale for K)",
    "value-scaled": "fp8 values a constant factor off the expected (a scale applied wrongly; the inputs were not at hand)",
    "fp8-rounding": "an fp8 code one step from the expected: not rounded to nearest-even (truncation, near-ties)",
    "fp8-nan": "a NaN stored as a finite code",
    "value-cast": "the same value with other bits (NaN payload, -0): a value conversion where a bit copy was meant",
    "byte-order": "the expected bytes of the element in reverse order",
    "bit-flip": "the expected bytes with one bit flipped",
    "zeroed": "zero bytes where the expected bytes are not zero",
    "stray-write": "changed though the op must leave it untouched, to bytes found nowhere else (or page padding written)",
    "unexplained": "none of the above fits",
    "not-examined": "differing elements not explained: past the examined ones, outside the mapped blocks of a large cache, or in groups past the listed ones",
}
_ID = {name: i for i, name in enumerate(FAULTS)}
_MOVES = ("kv-swapped", "neighbour-slot", "neighbour-block", "block-id-wrap", "other-layer", "other-head", "other-element")
_HOLDERS = _MOVES + ("wrong-layout",)  # classes whose elements hold another element's bytes
KV_NAMES = ("K", "V")
_DIMS = ("layer", "block", "kv", "slot", "head", "dim")
ID_WIDTHS = (16, 20, 32)  # block id fields a kernel truncates to: int16, a 20-bit field, int32
_OUTSIDE = {0: "guard-before", 2: "padding", 3: "guard-after"}  # element kinds; 1 is a logical element


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
    """Logical elements as a box (each coordinate's distinct values), or guard / padding bytes."""

    kind: str  # "cache" | "guard-before" | "guard-after" | "padding"
    elements: int  # distinct elements in it
    layer: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    kv: tuple[int, ...] = ()
    slot: tuple[int, ...] = ()
    head: tuple[int, ...] = ()
    dim: tuple[int, ...] = ()
    bytes: tuple[int, int] | None = None  # guard-before: offsets before the cache start (< 0); after: past its end
    text: str = ""  # K[b=1, s=0,15, h=0..2]; guard bytes +0..+7 past the end of the cache

    def as_dict(self) -> dict:
        if self.kind != "cache":
            return {self.kind: list(self.bytes), "elements": self.elements, "text": self.text}
        out = {name: [min(getattr(self, name)), max(getattr(self, name))] for name in _DIMS}
        out["kv"] = "/".join(KV_NAMES[k] for k in self.kv)
        return {**out, "elements": self.elements, "text": self.text}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One group of wrong elements, its fault class (a key of :data:`FAULTS`) and one sentence."""

    fault: str
    where: Span | None  # None for not-examined
    sentence: str
    source: Span | None = None  # whose bytes they hold (for the far end of a move: who holds theirs)

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
        c = torch.stack(torch.unravel_index(index, self.shape), dim=1)
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


def grid_for(spec, guard: int, differing: torch.Tensor) -> Grid:
    """The whole map of a small cache; for a large one, the map of the blocks (and their
    neighbours) that hold the first ``EXAMINED`` differing elements and up to ``SAMPLED`` more
    spread over the rest."""
    layout, g = spec.layout, spec.geometry
    if layout.numel(g) <= WHOLE_MAP:
        return Grid(layout, g)
    first, span = guard // g.element_size, layout.numel(g)
    inside = differing[(differing >= first) & (differing < first + span)] - first
    if inside.numel() > EXAMINED:
        inside = torch.cat([inside[:EXAMINED], inside[torch.linspace(EXAMINED, inside.numel() - 1, SAMPLED).long()]])
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


# ----------------------------------------------------------------------------- diagnosis
def diagnose(spec, expected: torch.Tensor, actual: torch.Tensor, differing: torch.Tensor, *, guard: int,
             initial: torch.Tensor | None = None, writes: WriteInputs | None = None, zero_fill: bool = False,
             grid: Grid | None = None) -> list[Finding]:
    """Findings for the differing arena elements (indices in cache-dtype units from the arena
    start, ascending). ``expected``, ``actual``, ``initial``: the uint8 arena bytes (guard + cache +
    guard) on the CPU. ``zero_fill``: the arena reads zeros where nothing wrote (lazily mapped).

    Runs on one CPU thread: its tensors are small, and a busy machine's thread pool costs more
    than it gives (searchsorted and isin ran 7-15 times slower on two loaded cores)."""
    with one_thread():
        return _Diagnosis(spec, expected, actual, differing, guard, initial, writes, zero_fill, grid).findings()


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread for the block (small tensors; see :func:`diagnose`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class _Diagnosis:
    """The examined elements and, per element, its fault class, the grid index of the element
    whose bytes it holds (``source``) and a ``tag`` (layout alternative, token, far end)."""

    def __init__(self, spec, expected, actual, differing, guard, initial, writes, zero_fill, grid):
        self.spec, self.g, self.layout = spec, spec.geometry, spec.layout
        g = self.g
        self.e, self.first = g.element_size, guard // g.element_size
        self.numel = self.layout.numel(g)
        self.nbytes = self.numel * self.e
        self.total = differing.numel()
        self.grid = grid or grid_for(spec, guard, differing)
        self.want_bytes, self.got_bytes = expected, actual
        bits = R.bits_dtype(g.dtype)
        self.want_bits, self.got_bits = expected.view(bits), actual.view(bits)
        self.init_bits = initial.view(bits) if initial is not None else None
        self.writes, self.zero_fill = writes, zero_fill
        self.alternatives: list[str] = []
        self.transform_masks: dict[str, torch.Tensor] = {}

        pos = differing[:EXAMINED].to(torch.int64)
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

    # ------------------------------------------------------------------ helpers
    def open(self) -> torch.Tensor:
        """Logical elements not explained yet."""
        return (self.fault < 0) & (self.kind == 1)

    def assign(self, mask: torch.Tensor, fault: str, source: torch.Tensor | None = None, tag=None) -> None:
        self.fault[mask] = _ID[fault]
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

    # ------------------------------------------------------------------ steps
    def findings(self) -> list[Finding]:
        for kind, fault in ((0, "out-of-bounds"), (3, "out-of-bounds"), (2, "stray-write")):
            self.assign(self.kind == kind, fault)
        self._unmistakably_never_written()
        self._wrong_layout()
        self._moves()
        self._extend_moves_along_rows()
        self._drop_small_moves()
        self._input_rows()
        self._transforms()
        self._far_ends_of_moves()
        if self.i0 is not None:
            self.assign(self.open() & (self.w == self.i0), "stray-write")
        self.assign(self.open(), "unexplained")
        return _Report(self).findings()

    def _unmistakably_never_written(self) -> None:
        """Never written, where chance cannot explain it: elements of 2 or more bytes, or rows of
        a 1-byte cache whose every differing element (2 or more) holds its initial byte."""
        found = self.open() & self.never_written()
        if self.e == 1 and bool(found.any()):
            row = torch.where(self.kind == 1, self.index // self.g.head_size, -1)
            ids = torch.unique(row, return_inverse=True)[1]
            differing = torch.bincount(ids[self.kind == 1], minlength=int(ids.max()) + 1)
            holding = torch.bincount(ids[found], minlength=differing.numel())
            found &= (holding[ids] == differing[ids]) & (holding[ids] >= 2)
        self.assign(found, "never-written", tag=0 if self.i0 is not None else 1)

    def _wrong_layout(self) -> None:
        """The derived layout that puts the most of the elements left where the actual bytes
        are, taken when it explains two thirds of them (and at least 4, or all of fewer)."""
        todo = self.open()
        left = int(todo.sum())
        if not self.grid.whole or left == 0:
            return
        best = None
        for alt_id, (layout, g, what) in enumerate(alternative_layouts(self.layout, self.g)):
            self.alternatives.append(what)
            holds = Grid(layout, g).index_of(self.inner.clamp(min=0))  # the element the alternative puts here
            ok = todo & (holds >= 0)
            source = torch.where(ok, holds, 0)
            true_offset = self.grid.offsets[source]
            match = ok & (true_offset != self.inner) & (self.a == self.want_bits[true_offset + self.first]) & self.written(source)
            if best is None or int(match.sum()) > int(best[1].sum()):
                best = (alt_id, match, source)
        if best is not None and int(best[1].sum()) >= max(min(4, left), -(-2 * left // 3)):
            self.assign(best[1], "wrong-layout", best[2], best[0])

    def _moves(self) -> None:
        """Bytes found exactly once, with ``WINDOW`` bytes of context, at another element of the
        expected cache (windows start at every mapped element; a guard byte's source is named too)."""
        todo = self.open() | (self.kind == 0) | (self.kind == 3)
        if not bool(todo.any()):
            return
        starts = (self.grid.offsets + self.first) * self.e
        fits = torch.nonzero(starts + WINDOW <= self.want_bytes.numel()).flatten()
        keys, evidence = _window_keys(self.want_bytes, starts[fits])
        start_index = fits[evidence]
        keys, order = torch.sort(keys[evidence])
        if keys.numel() == 0:
            return
        found = torch.full_like(self.pos, -1)
        for back in range(max(1, WINDOW // self.e)):  # the element at each place of the window
            q = (self.pos - back) * self.e
            look = todo & (found < 0) & (q >= 0) & (q + WINDOW <= self.got_bytes.numel())
            if not bool(look.any()):
                continue
            qkeys, qevidence = _window_keys(self.got_bytes, q[look])
            at = torch.searchsorted(keys, qkeys).clamp(max=keys.numel() - 1)
            after = (at + 1).clamp(max=keys.numel() - 1)
            once = (keys[at] == qkeys) & qevidence & ((after == at) | (keys[after] != qkeys))
            src_offset = self.grid.offsets[start_index[order[at]]] + back
            src = self.grid.index_of(src_offset)
            hit = once & (src >= 0) & (src_offset != self.inner[look])
            found[torch.nonzero(look).flatten()[hit]] = src[hit]
        guards = (found >= 0) & (self.kind != 1)
        self.source[guards] = found[guards]  # still out-of-bounds; the finding names whose bytes they are
        self._assign_moves((found >= 0) & (self.kind == 1), found)

    def _assign_moves(self, mask: torch.Tensor, found: torch.Tensor) -> None:
        if not bool(mask.any()):
            return
        delta = self.grid.coords(found.clamp(min=0)) - self.coords
        for name in _MOVES:
            chosen = mask & _move_kind(delta, self.g, name, self.coords[:, 1])
            self.assign(chosen, name, found)
            mask = mask & ~chosen

    def _extend_moves_along_rows(self) -> None:
        """A move found for part of a row (the first of its moved elements) tried on the rest of
        that row, then the commonest moves of this failure on every element left: windows of
        repeated values (fp8 edge rows) or of interleaved tiles (AITER's V tile keeps no run of
        one row's dims together) prove nothing on their own, a direct check of a known move does."""
        moved = torch.isin(self.fault, torch.tensor([_ID[m] for m in _MOVES])) & (self.kind == 1)
        todo = self.open()
        if not bool(moved.any()) or not bool(todo.any()):
            return
        row = torch.where(self.kind == 1, self.index // self.g.head_size, -1)
        ids = torch.unique(row, return_inverse=True)[1]
        count = int(ids.max()) + 1
        position = torch.arange(row.numel())
        leader = torch.full((count,), row.numel(), dtype=torch.int64).scatter_reduce(
            0, ids[moved], position[moved], "amin")  # the first moved element of each row
        has = todo & (leader[ids] < row.numel())
        if bool(has.any()):
            lead = leader[ids[has]]
            self._try_move(has, self.grid.coords(self.source[lead]) - self.coords[lead])
        deltas = self.grid.coords(self.source[moved]) - self.coords[moved]
        ranked = row_ids(deltas)
        for which in torch.argsort(torch.bincount(ranked), descending=True)[:COMMON_MOVES].tolist():
            todo = self.open()
            if not bool(todo.any()):
                break
            delta = deltas[int(torch.nonzero(ranked == which)[0])]
            self._try_move(todo, delta.expand(int(todo.sum()), 6))

    def _try_move(self, mask: torch.Tensor, delta: torch.Tensor) -> None:
        """Assign the elements of ``mask`` whose actual bytes are the expected bytes at their
        coordinates + ``delta`` (one row of ``delta`` per element of the mask)."""
        src = self.grid.index_at(self.coords[mask] + delta)
        ok = src >= 0
        same = torch.zeros_like(ok)
        same[ok] = self.a[mask][ok] == self.want_bits[self.grid.offsets[src[ok]] + self.first]
        chosen = torch.zeros_like(mask)
        chosen[torch.nonzero(mask).flatten()[same]] = True
        found = torch.full_like(self.pos, -1)
        found[chosen] = src[same]
        self._assign_moves(chosen, found)

    def _drop_small_moves(self) -> None:
        """A move shared by fewer elements than a window holds is a coincidence of structured data
        (fp8 edge rows repeat the same codes in K and V): those elements stay open."""
        moved = torch.isin(self.fault, torch.tensor([_ID[m] for m in _MOVES])) & (self.kind == 1)
        if not bool(moved.any()):
            return
        delta = self.grid.coords(self.source[moved]) - self.coords[moved]
        ids = row_ids(torch.cat([self.coords[moved, :3], delta], dim=1))
        small = torch.bincount(ids)[ids] < max(2, WINDOW // self.e)
        drop = torch.nonzero(moved).flatten()[small]
        self.fault[drop], self.source[drop] = -1, -1

    def _input_rows(self) -> None:
        """Rows that equal an input row a write must not store: a padding token's, or one past
        len(slot_mapping) (whole rows of D elements, matched exactly once)."""
        todo = self.open()
        if self.writes is None or not bool(todo.any()):
            return
        g, w = self.g, self.writes
        D, H = g.head_size, g.num_kv_heads
        rows = torch.unique(self.index[todo] // D)[:CANDIDATE_ROWS]
        found = self.got_bits[self.grid.offsets[rows[:, None] * D + torch.arange(D)] + self.first]  # (R, D)
        kv = self.grid.coords(rows * D)[:, 2]
        token, bits = torch.full_like(rows, -1), R.bits_dtype(g.dtype)
        for side, (x, scale) in enumerate(((w.key, w.k_scale), (w.value, w.v_scale))):
            mine = kv == side
            if not bool(mine.any()):
                continue
            scale = scale.cpu() if isinstance(scale, torch.Tensor) else scale
            candidates = R.ops.encode(x.cpu(), g, scale, head_dim=1).view(bits).reshape(-1, D)  # (T'·H, D)
            same = (found[mine][:, None, :] == candidates[None]).all(dim=-1)
            once = same.sum(dim=1) == 1
            token[torch.nonzero(mine).flatten()[once]] = same[once].float().argmax(dim=1) // H
        slots = w.slot_mapping.cpu().long()
        T = slots.numel()
        padded = (token >= 0) & (token < T) & (slots[token.clamp(0, max(T - 1, 0))] < 0) if T else token < -1
        element_row = self.index // D
        for mask, fault in ((padded, "padding-written"), (token >= T, "extra-row")):
            hit = todo & torch.isin(element_row, rows[mask])
            if bool(hit.any()):
                tag = torch.zeros_like(self.tag)
                tag[hit] = token[torch.searchsorted(rows, element_row[hit])]
                self.assign(hit, fault, tag=tag)

    def _transforms(self) -> None:
        """Element-wise explanations, the one with the most support in this failure first, each
        taken per (layer, block, kv) group only where it explains half of what is left there."""
        todo = self.open()
        if not bool(todo.any()):
            return
        candidates = [(fault, mask & todo) for fault, mask in _element_transforms(self)]
        self.transform_masks = dict(candidates)
        ranked = sorted(enumerate(candidates), key=lambda c: (-int(c[1][1].sum()), c[0]))
        group = row_ids(self.coords[:, :3])
        size = int(group.max()) + 1
        for _, (fault, mask) in ranked:
            left = self.open()
            hit = left & mask
            if not bool(hit.any()):
                continue
            count_left = torch.bincount(group[left], minlength=size)
            count_hit = torch.bincount(group[hit], minlength=size)
            accepted = 2 * count_hit >= count_left
            self.assign(hit & accepted[group], fault, tag=0 if fault != "never-written" or self.i0 is not None else 1)

    def _far_ends_of_moves(self) -> None:
        """An element whose expected bytes another element holds: the far end of that move
        (class of the move; ``tag`` −1 − the holder's tag)."""
        todo = self.open()
        holding = torch.isin(self.fault, torch.tensor([_ID[m] for m in _HOLDERS])) & (self.source >= 0)
        if not bool(todo.any()) or not bool(holding.any()):
            return
        sources, holders = self.source[holding], torch.nonzero(holding).flatten()
        order = torch.argsort(sources)
        sources, holders = sources[order], holders[order]
        at = torch.searchsorted(sources, self.index).clamp(max=sources.numel() - 1)
        hit = todo & (sources[at] == self.index)
        holder = holders[at]
        self.fault[hit] = self.fault[holder[hit]]
        self.source[hit] = self.index[holder[hit]]
        self.tag[hit] = -1 - self.tag[holder[hit]]


# ----------------------------------------------------------------------------- pieces of the steps
def _window_keys(buffer: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``WINDOW`` bytes at each start as one int64, and whether they hold at least
    ``DISTINCT`` byte values (zero pages, constant fills and padded runs prove nothing)."""
    raw = buffer[starts[:, None] + torch.arange(WINDOW)]
    distinct = torch.ones(raw.shape[0], dtype=torch.int64)
    for j in range(1, WINDOW):  # byte j is new if no earlier byte of the window equals it
        distinct += (raw[:, :j] != raw[:, j:j + 1]).all(dim=1)
    return raw.contiguous().view(torch.int64).flatten(), distinct >= DISTINCT


def wrap_widths(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(n, len(ID_WIDTHS))``: for which widths w the smaller of two block ids is the larger one
    modulo 2^w (what the larger id becomes truncated to w bits)."""
    low, high = torch.minimum(a, b), torch.maximum(a, b)
    return torch.stack([(low != high) & (high % (1 << w) == low) for w in ID_WIDTHS], dim=1)


def _move_kind(delta: torch.Tensor, g: R.Geometry, name: str, block: torch.Tensor) -> torch.Tensor:
    """Which coordinate differences ``source − destination`` (``(n, 6)``) of elements in blocks
    ``block`` are moves of this kind."""
    moved = [delta[:, c] != 0 for c in range(6)]

    def only(*cols):
        out = torch.zeros(delta.shape[0], dtype=torch.bool)
        for c in cols:
            out |= moved[c]
        for c in range(6):
            if c not in cols:
                out &= ~moved[c]
        return out

    if name == "kv-swapped":
        return only(2)
    if name == "neighbour-slot":
        return only(1, 3) & ((delta[:, 1] * g.block_size + delta[:, 3]).abs() == 1)
    if name == "neighbour-block":
        return only(1) & (delta[:, 1].abs() == 1)
    if name == "block-id-wrap":
        return only(1) & wrap_widths(block, block + delta[:, 1]).any(dim=1)
    if name == "other-layer":
        return only(0)
    if name == "other-head":
        return only(4)
    return torch.ones(delta.shape[0], dtype=torch.bool)


def alternative_layouts(layout: R.Layout, g: R.Geometry) -> list[tuple[R.Layout, R.Geometry, str]]:
    """Layouts a kernel uses instead of the declared one by one confusion, each with what it is:
    the block and K/V dims swapped (kv-first vs blocks-first), N and H swapped (NHD vs HND), V in
    K's tile form or K in V's, and x = 16 // e of another element size. Derived by permuting the
    declared dimension list; their addresses come from :meth:`Layout.offsets`."""
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
        changed = (candidate.k_dims, candidate.v_dims, geometry.x) != (layout.k_dims, layout.v_dims, g.x)
        if changed and candidate.numel(geometry) == layout.numel(g):
            out.append((candidate, geometry, what))

    dims = layout.k_dims
    if "B" in dims and "2" in dims and abs(dims.index("B") - dims.index("2")) == 1:
        kv_outer = dims.index("2") < dims.index("B")
        add(dataclasses.replace(layout, k_dims=swapped(layout.k_dims, "B", "2"), v_dims=swapped(layout.v_dims, "B", "2")), g,
            "the blocks-first layout (blocks outside K/V)" if kv_outer else "the kv-first layout (K/V planes outside the blocks)")
    if not layout.is_tiled and "N" in dims and "H" in dims:
        head_major = dims.index("H") < dims.index("N")
        add(dataclasses.replace(layout, k_dims=swapped(dims, "N", "H"), v_dims=swapped(dims, "N", "H")), g,
            "NHD (slot outside head)" if head_major else "HND (head outside slot)")
    if layout.is_tiled:
        common = 0
        while layout.k_dims[common] == layout.v_dims[common]:
            common += 1
        k_tile, v_tile = layout.k_dims[common:], layout.v_dims[common:]
        tile = lambda dims: ",".join(dims).replace("x:d", "x").replace("x:n", "x")  # noqa: E731
        add(dataclasses.replace(layout, v_dims=layout.v_dims[:common] + k_tile), g, f"V in K's tile form [{tile(k_tile)}]")
        add(dataclasses.replace(layout, k_dims=layout.k_dims[:common] + v_tile), g, f"K in V's tile form [{tile(v_tile)}]")
        for dtype in (torch.uint8, torch.bfloat16, torch.float32):
            other = dataclasses.replace(g, dtype=dtype)
            if other.x != g.x:
                add(layout, other, f"x = 16 // {other.element_size} = {other.x} (of a {other.element_size}-byte dtype) instead of {g.x}")
    return out


def _element_transforms(d: _Diagnosis):
    """``(fault, mask)`` per element-wise explanation, in their order of priority (which breaks ties)."""
    g, n = d.g, d.pos.numel()
    none = torch.zeros(n, dtype=torch.bool)
    yield "never-written", d.never_written()
    if g.dtype not in R.fp8.FP8_DTYPES:
        want, got = d.w.view(g.dtype).float(), d.a.view(g.dtype).float()
        yield "bit-flip", _popcount(d.w ^ d.a) == 1
        yield "value-cast", (want == got) | (torch.isnan(want) & torch.isnan(got))
        if d.e > 1:
            yield "byte-order", d.w.view(torch.uint8).view(n, d.e).flip(1).contiguous().view(d.w.dtype).flatten() == d.a
        yield "zeroed", (d.a == 0) & (d.w != 0)
        return
    fmt = R.fp8.fp8_format(g.dtype)
    w_codes, a_codes = d.w.view(torch.uint8), d.a.view(torch.uint8)
    want, got = R.fp8.decode_codes(w_codes, fmt), R.fp8.decode_codes(a_codes, fmt)
    x, scale, other_scale = _inputs_of(d)
    known = ~torch.isnan(scale)
    safe = scale.nan_to_num(1.0)

    def encoded(with_scale, form=fmt):
        return R.fp8.quantize(x, with_scale, form, head_dim=-1).view(torch.uint8)

    yield "fp8-nan", (torch.isnan(want) | (known & torch.isnan(x))) & ~torch.isnan(got)
    for fault, others in _other_formats(fmt):
        mask = none.clone()
        for other, ratio in others:
            mask |= _reencoded_equal(a_codes, w_codes, fmt, other, ratio)
            mask |= known & (encoded(safe * ratio, other) == a_codes)
        yield fault, mask
    yield "scale-inverted", known & (safe != 1) & (encoded(1 / safe) == a_codes)
    yield "scale-swapped", known & (other_scale != scale) & (encoded(other_scale.nan_to_num(1.0)) == a_codes)
    yield "value-scaled", _constant_factor(d, want, got, fmt)
    yield "bit-flip", _popcount(d.w ^ d.a) == 1
    adjacent = ((w_codes & 0x80) == (a_codes & 0x80)) & ((w_codes & 0x7F).int() - (a_codes & 0x7F).int()).abs().eq(1)
    y = x / safe  # where a write's input is known, the wrong code must lie on the other side of x / scale
    d.scaled = torch.where(known, y, float("nan"))
    adjacent &= ~known | ((got - y) * (want - y) <= 0)
    yield "fp8-rounding", torch.isfinite(want) & torch.isfinite(got) & adjacent
    yield "value-cast", (want == got) | (torch.isnan(want) & torch.isnan(got))
    yield "zeroed", (d.a == 0) & (d.w != 0)


def _other_formats(fmt):
    """Per fault class, the other fp8 formats a code may be in and the ratio that turns the
    other format's value into this one's (the ×2 scale convention between e4m3fn and e4m3fnuz)."""
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
    """The actual code, read as ``other`` and scaled by ``ratio``, is the expected value: exactly
    (±0 alike), within the expected format's rounding (e4m3 bytes where e5m2 was expected), NaN
    for NaN, or the other format's ±max for a saturated ±max of this one."""
    value = R.fp8.decode_codes(a_codes, other) * ratio
    want = R.fp8.decode_codes(w_codes, fmt)
    exact = value == want
    coarser = fmt.name == "float8_e5m2" and other.name != "float8_e5m2"
    rounded = (R.fp8.quantize(value, 1.0, fmt).view(torch.uint8) == w_codes) & (value != 0) if coarser else torch.zeros_like(exact)
    nan = torch.isnan(value) & torch.isnan(want)
    saturated = (value.abs() == other.max_finite * ratio) & (want.abs() == fmt.max_finite) & (torch.sign(value) == torch.sign(want))
    return exact | rounded | nan | saturated


def _constant_factor(d: _Diagnosis, want, got, fmt) -> torch.Tensor:
    """Elements whose value is one factor (per side, the median ratio, not within a rounding step
    of 1) times the expected, within the format's rounding: a scale applied wrongly."""
    out = torch.zeros_like(want, dtype=torch.bool)
    usable = d.open() & torch.isfinite(want) & torch.isfinite(got) & (want != 0) & (got != 0)
    step = 2.0 ** -(3 if fmt.name != "float8_e5m2" else 2)
    for side in (0, 1):
        mine = usable & (d.coords[:, 2] == side)
        if int(mine.sum()) < 4:
            continue
        ratio = got / want
        factor = float(ratio[mine].median())
        if abs(factor - 1) <= 2 * step:
            continue
        out |= mine & ((ratio / factor - 1).abs() <= step)
    return out


def _inputs_of(d: _Diagnosis):
    """Per examined element: the input value a write stored there, its side's scale and the other
    side's (NaN where no written token's element is there, or no write inputs are at hand)."""
    g, n = d.g, d.pos.numel()
    x = torch.full((n,), float("nan"))
    scale, other_scale = x.clone(), x.clone()
    if d.writes is None:
        return x, scale, other_scale
    w = d.writes
    slots = w.slot_mapping.cpu().long()
    written = torch.nonzero(slots >= 0).flatten()
    if written.numel() == 0:
        return x, scale, other_scale
    ordered, order = torch.sort(slots[written])
    c = d.coords
    slot = c[:, 1] * g.block_size + c[:, 3]
    at = torch.searchsorted(ordered, slot).clamp(max=ordered.numel() - 1)
    hit = (d.kind == 1) & (c[:, 0] == d.spec.layer) & (ordered[at] == slot)
    token = written[order[at]]
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


def _popcount(bits: torch.Tensor) -> torch.Tensor:
    width = 8 * bits.element_size()
    value = bits.to(torch.int64) & ((1 << width) - 1)
    count = torch.zeros_like(value)
    for _ in range(width):
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
            logical = d.kind == 1
            delta = torch.zeros_like(d.coords)
            related = (d.source >= 0) & logical & (d.fault != _ID["wrong-layout"])
            delta[related] = d.grid.coords(d.source[related]) - d.coords[related]
            key = torch.cat([d.kind[:, None], d.fault[:, None], d.coords[:, :3], delta, d.tag[:, None]], dim=1)
            key[~logical, 2:-1] = 0
            group = row_ids(key)
            order_key = torch.where(logical, d.index, d.pos + (d.kind == 3).long() * (1 << 60) + (d.kind == 2).long() * (1 << 59)
                                    - (d.kind == 0).long() * (1 << 61))
            count = int(group.max()) + 1
            first = torch.full((count,), 1 << 62, dtype=torch.int64).scatter_reduce(0, group, order_key, "amin")
            for rank, which in enumerate(torch.argsort(first).tolist()):
                if rank == LISTED:
                    out.append(Finding("not-examined", None, f"{count - LISTED} more groups of differing elements are not listed"))
                    break
                out.append(self._finding(torch.nonzero(group == which).flatten()))
        skipped = d.total - min(d.total, EXAMINED) + d.unmapped
        if skipped:
            why = (f"only the first {EXAMINED} are examined" if d.total > EXAMINED else
                   "they lie in blocks of this large cache that its partial map leaves out")
            out.append(Finding("not-examined", None, f"{skipped} more differing elements are not explained ({why})"))
        return out

    def _finding(self, members: torch.Tensor) -> Finding:
        d = self.d
        fault, kind = list(FAULTS)[int(d.fault[members[0]])], int(d.kind[members[0]])
        if kind != 1:
            return self._outside(fault, kind, members)
        where = span_of(d.coords[members], d.g)
        sources = d.source[members]
        source = span_of(d.grid.coords(sources[sources >= 0]), d.g) if bool((sources >= 0).any()) else None
        sentence = self._sentence(fault, where, source, members, int(d.tag[members[0]]))
        if fault == "stray-write":
            fault, sentence = self._next_to_written(where, members, sentence)
        return Finding(fault, where, sentence, source)

    def _sentence(self, fault: str, where: Span, source: Span | None, members: torch.Tensor, tag: int) -> str:
        d = self.d
        w = where.text + _count(where, d.g)
        src = _relative_text(source, where, d.g) if source else ""
        if fault in _HOLDERS and tag < 0:  # the far end of a move
            how = f": where {d.alternatives[-1 - tag]} puts them" if fault == "wrong-layout" else ""
            how = _wrapped(where, source, d) if fault == "block-id-wrap" else how
            return f"{w} does not hold its bytes; {src} does{how}"
        if fault in _HOLDERS:
            reason = {
                "kv-swapped": ": K and V swapped", "neighbour-slot": ": the neighbouring slot's",
                "neighbour-block": ": the neighbouring block's", "other-layer": ": another layer's",
                "block-id-wrap": _wrapped(where, source, d) if source else "",
                "other-head": f": heads {_signed(source.head[0] - where.head[0])}" if source else "",
                "wrong-layout": f": where {d.alternatives[tag]} puts them" if tag < len(d.alternatives) else "",
            }.get(fault, "")
            untouched = self._untouched(d.source[members], where)
            return f"{w} holds {src}'s bytes{reason}" + (f"; {untouched} is untouched" if untouched else "")
        if fault == "never-written":
            went = self._went_to(members)
            still = "holds zeros, as the lazily mapped arena reads where nothing wrote" if tag == 1 else "still holds its initial bytes"
            return f"{w} was never written: it {still}" + (f"; its bytes are at {went}" if went else "")
        if fault in ("padding-written", "extra-row"):
            slots = d.writes.slot_mapping.cpu()
            side = ("key", "value")[where.kv[0]]
            if fault == "padding-written":
                return f"{w} holds the {side} row of token {tag}, whose slot is {int(slots[tag])}: padding was written"
            return f"{w} holds {side} row {tag}, past len(slot_mapping) = {slots.numel()}: rows beyond the tokens were written"
        return f"{w}: {self._element_story(fault, members)}"

    def _element_story(self, fault: str, members: torch.Tensor) -> str:
        d, n = self.d, members.numel()
        dtype = str(d.g.dtype).removeprefix("torch.")
        if fault == "fp8-nan":
            codes = sorted({f"{c:02x}" for c in d.a[members].view(torch.uint8).tolist()})
            return f"a NaN stored as finite code{'s' if len(codes) > 1 else ''} {', '.join(codes[:3])} (FP8-NAN: a NaN stays a NaN)"
        if fault == "fp8-fnuz-vs-fn":
            other = "float8_e4m3fn" if dtype == "float8_e4m3fnuz" else "float8_e4m3fnuz"
            return f"{other} codes where {dtype} was expected (they differ at −0, saturation and NaN)"
        if fault == "fp8-format":
            return f"{'e4m3' if dtype == 'float8_e5m2' else 'e5m2'} codes where {dtype} was expected"
        side = int(d.coords[members[0], 2])
        swapped = f"{KV_NAMES[side]} quantised with {('v_scale', 'k_scale')[side]} instead of {('k_scale', 'v_scale')[side]}"
        if fault in ("scale-inverted", "scale-swapped"):
            other = "scale-swapped" if fault == "scale-inverted" else "scale-inverted"
            both = bool(d.transform_masks.get(other, torch.zeros(0, dtype=torch.bool))[members].all()) if other in d.transform_masks else False
            said = "quantised as x·scale instead of x / scale" if fault == "scale-inverted" else swapped
            also = "x·scale" if fault == "scale-swapped" else swapped
            return said + (f" (or {also}: at these scales both give these codes)" if both else "")
        if fault == "value-scaled":
            fmt = R.fp8.fp8_format(d.g.dtype)
            ratio = R.fp8.decode_codes(d.a[members].view(torch.uint8), fmt) / R.fp8.decode_codes(d.w[members].view(torch.uint8), fmt)
            return f"values ×{float(ratio.median()):.4g} of the expected: a scale applied the wrong way or to the wrong side"
        if fault == "fp8-rounding":
            fmt = R.fp8.fp8_format(d.g.dtype)
            got = R.fp8.decode_codes(d.a[members].view(torch.uint8), fmt)
            want = R.fp8.decode_codes(d.w[members].view(torch.uint8), fmt)
            tie, y = (got + want) / 2, d.scaled[members]
            near_ties = bool((~torch.isnan(y)).all()) and bool(((y - tie).abs() <= tie.abs() * 2.0**-16).all())
            toward_zero = bool((got.abs() < want.abs()).all())
            if near_ties and toward_zero:
                how = ", toward zero, each a hair off a tie: truncated, or near-ties rounded as ties"
            elif near_ties:
                how = ": values a hair off a tie (x / scale = tie·(1 ± 2^-20)) rounded as ties, not to the nearer code"
            elif toward_zero:
                how = ", toward zero: truncated instead of rounded to nearest-even"
            else:
                how = ": not rounded to the nearest code (ties to even)"
            return f"{n} code{'s' if n > 1 else ''} one step from the expected{how}"
        if fault == "value-cast":
            return "the same values with other bits (NaN payload or −0): a value cast where a bit copy was meant"
        if fault == "byte-order":
            return f"the expected bytes of each element in reverse order ({d.e}-byte elements)"
        if fault == "bit-flip":
            first = int(members[0])
            bit = ((int(d.w[first]) ^ int(d.a[first])) & ((1 << (8 * d.e)) - 1)).bit_length() - 1
            return f"one bit differs (bit {bit % 8} of byte {bit // 8}{f'; {n} elements like it' if n > 1 else ''})"
        if fault == "zeroed":
            return "zero bytes where the expected bytes are not zero"
        if fault == "stray-write":
            return "changed though the op must leave it untouched (to bytes found nowhere in the expected cache)"
        return f"{n} element{'s' if n > 1 else ''} differ; no known fault explains {'them' if n > 1 else 'it'}"

    def _untouched(self, sources: torch.Tensor, where: Span) -> str:
        """The sources, when every one of them is itself never written."""
        d = self.d
        sources = sources[sources >= 0]
        never = d.index[d.fault == _ID["never-written"]]
        if sources.numel() == 0 or never.numel() == 0 or not bool(torch.isin(sources, never).all()):
            return ""
        return _relative_text(span_of(d.grid.coords(sources), d.g), where, d.g)

    def _went_to(self, members: torch.Tensor) -> str:
        """Where the expected bytes of these elements are (the elements holding them)."""
        d = self.d
        holders = torch.isin(d.fault, torch.tensor([_ID[m] for m in _HOLDERS])) & (d.tag >= 0) & torch.isin(d.source, d.index[members])
        return span_of(d.coords[holders], d.g).text if bool(holders.any()) else ""

    def _next_to_written(self, where: Span, members: torch.Tensor, sentence: str) -> tuple[str, str]:
        """A stray write right after (or before) an element the op wrote correctly: a copy or a
        write that ran on into the neighbouring block or slot."""
        d = self.d
        offsets = d.inner[members]
        for side, offset in (("after", int(offsets.min()) - 1), ("before", int(offsets.max()) + 1)):
            if not 0 <= offset < d.numel:
                continue
            index = d.grid.index_of(torch.tensor([offset]))
            at = offset + d.first
            if int(index[0]) < 0 or not (d.want_bits[at] != d.init_bits[at] and d.got_bits[at] == d.want_bits[at]):
                continue
            c = d.grid.coords(index)[0]
            neighbour = span_of(c[None], d.g).text
            what = "block" if int(c[1]) != where.block[0] else "slot"
            return (f"neighbour-{what}", f"{where.text}{_count(where, d.g)} was overwritten though the op leaves it: it lies right "
                    f"{side} {neighbour}, which the op wrote — the {'copy' if what == 'block' else 'write'} ran on into the neighbouring {what}")
        return "stray-write", sentence

    def _outside(self, fault: str, kind: int, members: torch.Tensor) -> Finding:
        d = self.d
        byte = d.pos[members] * d.e - d.first * d.e  # from the cache start
        lo, hi = int(byte.min()), int(byte.max()) + d.e - 1
        if kind == 2:
            where = Span("padding", members.numel(), bytes=(lo, hi), text=f"padding bytes {lo}..{hi} of the cache")
            return Finding(fault, where, f"{members.numel() * d.e} page padding bytes (no logical element) at cache bytes {lo}..{hi} were written")
        if kind == 0:
            where = Span("guard-before", members.numel(), bytes=(lo, hi), text=f"guard bytes {lo}..{hi} before the cache")
            place = f"{members.numel() * d.e} guard bytes before the cache ({lo}..{hi})"
        else:
            lo, hi = lo - d.nbytes, hi - d.nbytes
            where = Span("guard-after", members.numel(), bytes=(lo, hi), text=f"guard bytes +{lo}..+{hi} past the end of the cache")
            place = f"{members.numel() * d.e} guard bytes past the end of the cache (+{lo}..+{hi})"
        sources = d.source[members]
        source = span_of(d.grid.coords(sources[sources >= 0]), d.g) if bool((sources >= 0).any()) else None
        return Finding(fault, where, f"{place} changed: written out of bounds" + (f"; they hold {source.text}'s bytes" if source else ""), source)


def span_of(coords: torch.Tensor, g: R.Geometry) -> Span:
    """The box around logical coordinates ``(n, 6)``: each coordinate's distinct values."""
    values = {name: tuple(torch.unique(coords[:, i]).tolist()) for i, name in enumerate(_DIMS)}
    span = Span("cache", int(row_ids(coords).max()) + 1, **values)
    return dataclasses.replace(span, text=_box_text(span, g))


def _shown(values: tuple[int, ...]) -> tuple[str, int]:
    """A coordinate's values as text and how many elements the text names: ``3``, ``0..15``
    (a range, counted whole), ``0,15`` (up to four values apart)."""
    lo, hi = values[0], values[-1]
    if len(values) == 1:
        return f"{lo}", 1
    if len(values) == hi - lo + 1 or len(values) > 4:
        return f"{lo}..{hi}", hi - lo + 1
    return ",".join(str(v) for v in values), len(values)


def _box_text(span: Span, g: R.Geometry, skip=()) -> str:
    side = "/".join(KV_NAMES[k] for k in span.kv)
    parts = []
    for name, short, show in (("layer", "l", g.num_layers > 1), ("block", "b", True), ("slot", "s", True),
                              ("head", "h", g.num_kv_heads > 1), ("dim", "d", span.dim != tuple(range(g.head_size)))):
        if show and name not in skip:
            parts.append(f"{short}={_shown(getattr(span, name))[0]}")
    return f"{side}[{', '.join(parts)}]"


def _count(span: Span, g: R.Geometry) -> str:
    """`` (n of m elements)`` when the box text names more elements than the span holds."""
    named = math.prod(_shown(getattr(span, name))[1] for name in _DIMS)
    return f" ({span.elements} of {named} elements)" if span.elements < named else ""


def _relative_text(source: Span, where: Span, g: R.Geometry) -> str:
    """The source box, leaving out the head and dim values it shares with the destination."""
    return _box_text(source, g, tuple(name for name in ("head", "dim") if getattr(source, name) == getattr(where, name)))


def _wrapped(where: Span, source: Span, d: _Diagnosis) -> str:
    """``: block ids wrap modulo 2^16 (65537 → 1)``, naming every width the two ids agree with, and
    an address computed in 32 bits where the larger block starts past element 2^31 (same bytes)."""
    a, b = where.block[0], source.block[0]
    widths = [w for w, hit in zip(ID_WIDTHS, wrap_widths(torch.tensor([a]), torch.tensor([b]))[0].tolist()) if hit]
    past = max(a, b) * (d.numel // d.g.num_blocks) >= 1 << 31
    return (f": block ids wrap modulo {' or '.join(f'2^{w}' for w in widths)} ({max(a, b)} → {min(a, b)}"
            + ("; or an address past 2^31 computed in 32 bits" if past else "") + ")")


def _signed(value: int) -> str:
    return f"{'+' if value > 0 else '−'}{abs(value)}"
