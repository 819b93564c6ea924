"""The findings of a diagnosis (conformance/harness/diagnosis.py): the classified elements
grouped by (fault, layer, block, kv, relation), each group worded as one sentence in logical
coordinates."""

from __future__ import annotations

import dataclasses
import math

import torch

from kvconform import reference as R

from .diagnosis_examined import Examined
from .diagnosis_faults import DIMS, FAULT_ID, FAULTS, HOLDERS, ID_WIDTHS, KV_NAMES, Finding, Span, wrap_widths
from .diagnosis_grid import row_ids

LISTED = 64  # findings returned (the rest are summed up in one not-examined finding)


def findings(d: Examined) -> list[Finding]:
    """One finding per group, in the order of each group's first element (guard bytes before the
    cache first; padding, then guard bytes past its end, last), at most ``LISTED``; then what was not examined."""
    out = []
    if d.pos.numel():
        logical = d.kind == 1
        delta = torch.zeros_like(d.coords)
        related = (d.source >= 0) & logical & (d.fault != FAULT_ID["wrong-layout"])
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
            out.append(_finding(d, torch.nonzero(group == which).flatten()))
    skipped = d.total - min(d.total, d.examined) + d.unmapped
    if skipped:
        why = (f"only the first {d.examined} are examined" if d.total > d.examined else
               "they lie in blocks of this large cache that its partial map leaves out")
        out.append(Finding("not-examined", None, f"{skipped} more differing elements are not explained ({why})"))
    return out


def _finding(d: Examined, members: torch.Tensor) -> Finding:
    fault, kind = list(FAULTS)[int(d.fault[members[0]])], int(d.kind[members[0]])
    if kind != 1:
        return _outside(d, fault, kind, members)
    where = span_of(d.coords[members], d.g)
    sources = d.source[members]
    source = span_of(d.grid.coords(sources[sources >= 0]), d.g) if bool((sources >= 0).any()) else None
    sentence = _sentence(d, fault, where, source, members, int(d.tag[members[0]]))
    if fault == "stray-write":
        fault, sentence = _next_to_written(d, where, members, sentence)
    return Finding(fault, where, sentence, source)


def _sentence(d: Examined, fault: str, where: Span, source: Span | None, members: torch.Tensor, tag: int) -> str:
    w = where.text + _count(where, d.g)
    src = _relative_text(source, where, d.g) if source else ""
    if fault in HOLDERS and tag < 0:  # the far end of a move
        how = f": where {d.alternatives[-1 - tag]} puts them" if fault == "wrong-layout" else ""
        how = _wrapped(where, source, d) if fault == "block-id-wrap" else how
        return f"{w} does not hold its bytes; {src} does{how}"
    if fault in HOLDERS:
        reason = {
            "kv-swapped": ": K and V swapped", "neighbour-slot": ": the neighbouring slot's",
            "neighbour-block": ": the neighbouring block's", "other-layer": ": another layer's",
            "block-id-wrap": _wrapped(where, source, d) if source else "",
            "other-head": f": heads {_signed(source.head[0] - where.head[0])}" if source else "",
            "wrong-layout": f": where {d.alternatives[tag]} puts them" if tag < len(d.alternatives) else "",
        }.get(fault, "")
        untouched = _untouched(d, d.source[members], where)
        return f"{w} holds {src}'s bytes{reason}" + (f"; {untouched} is untouched" if untouched else "")
    if fault == "never-written":
        went = _went_to(d, members)
        still = "holds zeros, as the lazily mapped arena reads where nothing wrote" if tag == 1 else "still holds its initial bytes"
        return f"{w} was never written: it {still}" + (f"; its bytes are at {went}" if went else "")
    if fault in ("padding-written", "extra-row"):
        slots = d.writes.slot_mapping.cpu()
        side = ("key", "value")[where.kv[0]]
        if fault == "padding-written":
            return f"{w} holds the {side} row of token {tag}, whose slot is {int(slots[tag])}: padding was written"
        return f"{w} holds {side} row {tag}, past len(slot_mapping) = {slots.numel()}: rows beyond the tokens were written"
    return f"{w}: {_element_story(d, fault, members)}"


def _element_story(d: Examined, fault: str, members: torch.Tensor) -> str:
    n = members.numel()
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


def _untouched(d: Examined, sources: torch.Tensor, where: Span) -> str:
    """The sources, when every one of them is itself never written."""
    sources = sources[sources >= 0]
    never = d.index[d.fault == FAULT_ID["never-written"]]
    if sources.numel() == 0 or never.numel() == 0 or not bool(torch.isin(sources, never).all()):
        return ""
    return _relative_text(span_of(d.grid.coords(sources), d.g), where, d.g)


def _went_to(d: Examined, members: torch.Tensor) -> str:
    """Where the expected bytes of these elements are (the elements holding them)."""
    holders = torch.isin(d.fault, torch.tensor([FAULT_ID[m] for m in HOLDERS])) & (d.tag >= 0) & torch.isin(d.source, d.index[members])
    return span_of(d.coords[holders], d.g).text if bool(holders.any()) else ""


def _next_to_written(d: Examined, where: Span, members: torch.Tensor, sentence: str) -> tuple[str, str]:
    """A stray write right after (or before) an element the op wrote correctly: a copy or a
    write that ran on into the neighbouring block or slot."""
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


def _outside(d: Examined, fault: str, kind: int, members: torch.Tensor) -> Finding:
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
    values = {name: tuple(torch.unique(coords[:, i]).tolist()) for i, name in enumerate(DIMS)}
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
    named = math.prod(_shown(getattr(span, name))[1] for name in DIMS)
    return f" ({span.elements} of {named} elements)" if span.elements < named else ""


def _relative_text(source: Span, where: Span, g: R.Geometry) -> str:
    """The source box, leaving out the head and dim values it shares with the destination."""
    return _box_text(source, g, tuple(name for name in ("head", "dim") if getattr(source, name) == getattr(where, name)))


def _wrapped(where: Span, source: Span, d: Examined) -> str:
    """``: block ids wrap modulo 2^16 (65537 → 1)``, naming every width the two ids agree with, and
    an address computed in 32 bits where the larger block starts past element 2^31 (same bytes)."""
    a, b = where.block[0], source.block[0]
    widths = [w for w, hit in zip(ID_WIDTHS, wrap_widths(torch.tensor([a]), torch.tensor([b]))[0].tolist()) if hit]
    past = max(a, b) * (d.numel // d.g.num_blocks) >= 1 << 31
    return (f": block ids wrap modulo {' or '.join(f'2^{w}' for w in widths)} ({max(a, b)} → {min(a, b)}"
            + ("; or an address past 2^31 computed in 32 bits" if past else "") + ")")


def _signed(value: int) -> str:
    return f"{'+' if value > 0 else '−'}{abs(value)}"
