"""Step 6 of a diagnosis (conformance/harness/diagnosis.py): the same element under a
transformation — an fp8 code of another format, a scale misapplied, one bit, a rounding step, a
value cast, reversed bytes, zeros — each as a mask over the examined elements."""

from __future__ import annotations

import torch

from kvconform import reference as R

from .diagnosis_examined import Examined


def element_transforms(d: Examined):
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


def _constant_factor(d: Examined, want, got, fmt) -> torch.Tensor:
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


def _inputs_of(d: Examined):
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
