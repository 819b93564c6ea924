"""The steps of a diagnosis, in their order (conformance/harness/diagnosis.py lists them): each
classifies the examined elements the earlier ones left."""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from .diagnosis_examined import Examined
from .diagnosis_faults import FAULT_ID, HOLDERS, MOVES, wrap_widths
from .diagnosis_grid import Grid, row_ids
from .diagnosis_transforms import element_transforms

WINDOW = 8  # bytes of context that identify where a run of bytes came from
DISTINCT = 4  # byte values a window needs to count as evidence (zero pages and fills do not)
CANDIDATE_ROWS = 512  # rows compared with a write's input rows
COMMON_MOVES = 8  # moves of a failure tried on every element left


def classify(d: Examined) -> None:
    """Give every examined element a fault class, the steps in their order."""
    for kind, fault in ((0, "out-of-bounds"), (3, "out-of-bounds"), (2, "stray-write")):
        d.assign(d.kind == kind, fault)
    _unmistakably_never_written(d)
    _wrong_layout(d)
    _moves(d)
    _extend_moves_along_rows(d)
    _drop_small_moves(d)
    _input_rows(d)
    _transforms(d)
    _far_ends_of_moves(d)
    if d.i0 is not None:
        d.assign(d.open() & (d.w == d.i0), "stray-write")
    d.assign(d.open(), "unexplained")


def _unmistakably_never_written(d: Examined) -> None:
    """Never written, where chance cannot explain it: elements of 2 or more bytes, or rows of
    a 1-byte cache whose every differing element (2 or more) holds its initial byte."""
    found = d.open() & d.never_written()
    if d.e == 1 and bool(found.any()):
        row = torch.where(d.kind == 1, d.index // d.g.head_size, -1)
        ids = torch.unique(row, return_inverse=True)[1]
        differing = torch.bincount(ids[d.kind == 1], minlength=int(ids.max()) + 1)
        holding = torch.bincount(ids[found], minlength=differing.numel())
        found &= (holding[ids] == differing[ids]) & (holding[ids] >= 2)
    d.assign(found, "never-written", tag=0 if d.i0 is not None else 1)


def _wrong_layout(d: Examined) -> None:
    """The derived layout that puts the most of the elements left where the actual bytes
    are, taken when it explains two thirds of them (and at least 4, or all of fewer)."""
    todo = d.open()
    left = int(todo.sum())
    if not d.grid.whole or left == 0:
        return
    best = None
    for alt_id, (layout, g, what) in enumerate(alternative_layouts(d.layout, d.g)):
        d.alternatives.append(what)
        holds = Grid(layout, g).index_of(d.inner.clamp(min=0))  # the element the alternative puts here
        ok = todo & (holds >= 0)
        source = torch.where(ok, holds, 0)
        true_offset = d.grid.offsets[source]
        match = ok & (true_offset != d.inner) & (d.a == d.want_bits[true_offset + d.first]) & d.written(source)
        if best is None or int(match.sum()) > int(best[1].sum()):
            best = (alt_id, match, source)
    if best is not None and int(best[1].sum()) >= max(min(4, left), -(-2 * left // 3)):
        d.assign(best[1], "wrong-layout", best[2], best[0])


def _moves(d: Examined) -> None:
    """Bytes found exactly once, with ``WINDOW`` bytes of context, at another element of the
    expected cache (windows start at every mapped element; a guard byte's source is named too)."""
    todo = d.open() | (d.kind == 0) | (d.kind == 3)
    if not bool(todo.any()):
        return
    starts = (d.grid.offsets + d.first) * d.e
    fits = torch.nonzero(starts + WINDOW <= d.want_bytes.numel()).flatten()
    keys, evidence = _window_keys(d.want_bytes, starts[fits])
    start_index = fits[evidence]
    keys, order = torch.sort(keys[evidence])
    if keys.numel() == 0:
        return
    found = torch.full_like(d.pos, -1)
    for back in range(max(1, WINDOW // d.e)):  # the element at each place of the window
        q = (d.pos - back) * d.e
        look = todo & (found < 0) & (q >= 0) & (q + WINDOW <= d.got_bytes.numel())
        if not bool(look.any()):
            continue
        qkeys, qevidence = _window_keys(d.got_bytes, q[look])
        at = torch.searchsorted(keys, qkeys).clamp(max=keys.numel() - 1)
        after = (at + 1).clamp(max=keys.numel() - 1)
        once = (keys[at] == qkeys) & qevidence & ((after == at) | (keys[after] != qkeys))
        src_offset = d.grid.offsets[start_index[order[at]]] + back
        src = d.grid.index_of(src_offset)
        hit = once & (src >= 0) & (src_offset != d.inner[look])
        found[torch.nonzero(look).flatten()[hit]] = src[hit]
    guards = (found >= 0) & (d.kind != 1)
    d.source[guards] = found[guards]  # still out-of-bounds; the finding names whose bytes they are
    _assign_moves(d, (found >= 0) & (d.kind == 1), found)


def _assign_moves(d: Examined, mask: torch.Tensor, found: torch.Tensor) -> None:
    if not bool(mask.any()):
        return
    delta = d.grid.coords(found.clamp(min=0)) - d.coords
    for name in MOVES:
        chosen = mask & _move_kind(delta, d.g, name, d.coords[:, 1])
        d.assign(chosen, name, found)
        mask = mask & ~chosen


def _extend_moves_along_rows(d: Examined) -> None:
    """A move found for part of a row (the first of its moved elements) tried on the rest of
    that row, then the commonest moves of this failure on every element left: windows of
    repeated values (fp8 edge rows) or of interleaved tiles (AITER's V tile keeps no run of
    one row's dims together) prove nothing on their own, a direct check of a known move does."""
    moved = torch.isin(d.fault, torch.tensor([FAULT_ID[m] for m in MOVES])) & (d.kind == 1)
    todo = d.open()
    if not bool(moved.any()) or not bool(todo.any()):
        return
    row = torch.where(d.kind == 1, d.index // d.g.head_size, -1)
    ids = torch.unique(row, return_inverse=True)[1]
    count = int(ids.max()) + 1
    position = torch.arange(row.numel())
    leader = torch.full((count,), row.numel(), dtype=torch.int64).scatter_reduce(
        0, ids[moved], position[moved], "amin")  # the first moved element of each row
    has = todo & (leader[ids] < row.numel())
    if bool(has.any()):
        lead = leader[ids[has]]
        _try_move(d, has, d.grid.coords(d.source[lead]) - d.coords[lead])
    deltas = d.grid.coords(d.source[moved]) - d.coords[moved]
    ranked = row_ids(deltas)
    for which in torch.argsort(torch.bincount(ranked), descending=True)[:COMMON_MOVES].tolist():
        todo = d.open()
        if not bool(todo.any()):
            break
        delta = deltas[int(torch.nonzero(ranked == which)[0])]
        _try_move(d, todo, delta.expand(int(todo.sum()), 6))


def _try_move(d: Examined, mask: torch.Tensor, delta: torch.Tensor) -> None:
    """Assign the elements of ``mask`` whose actual bytes are the expected bytes at their
    coordinates + ``delta`` (one row of ``delta`` per element of the mask)."""
    src = d.grid.index_at(d.coords[mask] + delta)
    ok = src >= 0
    same = torch.zeros_like(ok)
    same[ok] = d.a[mask][ok] == d.want_bits[d.grid.offsets[src[ok]] + d.first]
    chosen = torch.zeros_like(mask)
    chosen[torch.nonzero(mask).flatten()[same]] = True
    found = torch.full_like(d.pos, -1)
    found[chosen] = src[same]
    _assign_moves(d, chosen, found)


def _drop_small_moves(d: Examined) -> None:
    """A move shared by fewer elements than a window holds is a coincidence of structured data
    (fp8 edge rows repeat the same codes in K and V): those elements stay open."""
    moved = torch.isin(d.fault, torch.tensor([FAULT_ID[m] for m in MOVES])) & (d.kind == 1)
    if not bool(moved.any()):
        return
    delta = d.grid.coords(d.source[moved]) - d.coords[moved]
    ids = row_ids(torch.cat([d.coords[moved, :3], delta], dim=1))
    small = torch.bincount(ids)[ids] < max(2, WINDOW // d.e)
    drop = torch.nonzero(moved).flatten()[small]
    d.fault[drop], d.source[drop] = -1, -1


def _input_rows(d: Examined) -> None:
    """Rows that equal an input row a write must not store: a padding token's, or one past
    len(slot_mapping) (whole rows of D elements, matched exactly once)."""
    todo = d.open()
    if d.writes is None or not bool(todo.any()):
        return
    g, w = d.g, d.writes
    D, H = g.head_size, g.num_kv_heads
    rows = torch.unique(d.index[todo] // D)[:CANDIDATE_ROWS]
    found = d.got_bits[d.grid.offsets[rows[:, None] * D + torch.arange(D)] + d.first]  # (R, D)
    kv = d.grid.coords(rows * D)[:, 2]
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
    element_row = d.index // D
    for mask, fault in ((padded, "padding-written"), (token >= T, "extra-row")):
        hit = todo & torch.isin(element_row, rows[mask])
        if bool(hit.any()):
            tag = torch.zeros_like(d.tag)
            tag[hit] = token[torch.searchsorted(rows, element_row[hit])]
            d.assign(hit, fault, tag=tag)


def _transforms(d: Examined) -> None:
    """Element-wise explanations, the one with the most support in this failure first, each
    taken per (layer, block, kv) group only where it explains half of what is left there."""
    todo = d.open()
    if not bool(todo.any()):
        return
    candidates = [(fault, mask & todo) for fault, mask in element_transforms(d)]
    d.transform_masks = dict(candidates)
    ranked = sorted(enumerate(candidates), key=lambda c: (-int(c[1][1].sum()), c[0]))
    group = row_ids(d.coords[:, :3])
    size = int(group.max()) + 1
    for _, (fault, mask) in ranked:
        left = d.open()
        hit = left & mask
        if not bool(hit.any()):
            continue
        count_left = torch.bincount(group[left], minlength=size)
        count_hit = torch.bincount(group[hit], minlength=size)
        accepted = 2 * count_hit >= count_left
        d.assign(hit & accepted[group], fault, tag=0 if fault != "never-written" or d.i0 is not None else 1)


def _far_ends_of_moves(d: Examined) -> None:
    """An element whose expected bytes another element holds: the far end of that move
    (class of the move; ``tag`` −1 − the holder's tag)."""
    todo = d.open()
    holding = torch.isin(d.fault, torch.tensor([FAULT_ID[m] for m in HOLDERS])) & (d.source >= 0)
    if not bool(todo.any()) or not bool(holding.any()):
        return
    sources, holders = d.source[holding], torch.nonzero(holding).flatten()
    order = torch.argsort(sources)
    sources, holders = sources[order], holders[order]
    at = torch.searchsorted(sources, d.index).clamp(max=sources.numel() - 1)
    hit = todo & (sources[at] == d.index)
    holder = holders[at]
    d.fault[hit] = d.fault[holder[hit]]
    d.source[hit] = d.index[holder[hit]]
    d.tag[hit] = -1 - d.tag[holder[hit]]


# ----------------------------------------------------------------------------- pieces of the steps
def _window_keys(buffer: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``WINDOW`` bytes at each start as one int64, and whether they hold at least
    ``DISTINCT`` byte values (zero pages, constant fills and padded runs prove nothing)."""
    raw = buffer[starts[:, None] + torch.arange(WINDOW)]
    distinct = torch.ones(raw.shape[0], dtype=torch.int64)
    for j in range(1, WINDOW):  # byte j is new if no earlier byte of the window equals it
        distinct += (raw[:, :j] != raw[:, j:j + 1]).all(dim=1)
    return raw.contiguous().view(torch.int64).flatten(), distinct >= DISTINCT


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
