"""FP8 encoding equals a bit-field oracle; fn↔fnuz conversion keeps values where it claims to."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform.reference import fp8

from . import oracle

ALL_CODES = torch.arange(256, dtype=torch.uint8)


@pytest.mark.parametrize("fmt", fp8.FORMATS)
def test_decode_matches_the_bit_fields(fmt):
    got = fp8.decode_codes(ALL_CODES, fmt).tolist()
    want = [oracle.fp8_decode(c, fmt) for c in range(256)]
    assert [g == w or (g != g and w != w) for g, w in zip(got, want)] == [True] * 256


def exact_ties(fmt):
    """Midpoints between neighbouring finite codes, ±0, ±max, beyond max, tiny negatives."""
    values = sorted({v for v in (oracle.fp8_decode(c, fmt) for c in range(256)) if v == v and abs(v) != float("inf")})
    mids = [(a + b) / 2 for a, b in zip(values, values[1:])]
    top = values[-1]
    return mids + [0.0, -0.0, top, -top, top * 1.5, -top * 4, -1e-9, 1e-9]


@pytest.mark.parametrize("fmt", fp8.FORMATS)
def test_quantize_rounds_ties_to_even_and_saturates(fmt):
    values = exact_ties(fmt)
    got = fp8.quantize(torch.tensor(values, dtype=torch.float32), 1.0, fmt).view(torch.uint8).tolist()
    want = [oracle.fp8_encode(float(torch.tensor(v, dtype=torch.float32)), fmt) for v in values]
    assert got == want


@pytest.mark.parametrize("fmt", fp8.FORMATS)
@given(values=st.lists(st.floats(-1e5, 1e5, width=32), min_size=1, max_size=40), scale=st.sampled_from([0.25, 1.0, 3.0, 0.1]))
def test_quantize_divides_by_the_scale_in_fp32(fmt, values, scale):
    x = torch.tensor(values, dtype=torch.float32)
    got = fp8.quantize(x, scale, fmt).view(torch.uint8).tolist()
    scaled = (x / torch.tensor(scale, dtype=torch.float32)).tolist()
    assert got == [oracle.fp8_encode(v, fmt) for v in scaled]


def test_quantize_matches_torch_casts_where_torch_saturates():
    x = torch.linspace(-448, 448, 9001)
    assert torch.equal(fp8.quantize(x, 1.0, "float8_e4m3fn").view(torch.uint8), x.to(torch.float8_e4m3fn).view(torch.uint8))


def test_per_head_scales_apply_to_their_head():
    x = torch.full((2, 3, 4), 6.0)
    q = fp8.quantize(x, torch.tensor([1.0, 2.0, 3.0]), "float8_e4m3fn", head_dim=1)
    assert q.float()[:, :, 0].tolist() == [[6.0, 3.0, 2.0]] * 2


def test_fn_to_fnuz_keeps_every_value_with_doubled_scale():
    codes, exact = fp8.fn_to_fnuz(ALL_CODES)
    assert bool(exact.all())
    changed = (codes != ALL_CODES).nonzero().flatten().tolist()
    assert changed == [0x7F, 0x80, 0xFF]  # NaN → 0x80, −0 → 0x00, NaN → 0x80
    assert codes[0x80] == 0 and codes[0x7F] == 0x80
    ours = fp8.decode_codes(codes, "float8_e4m3fnuz") * 2
    theirs = fp8.decode_codes(ALL_CODES, "float8_e4m3fn")
    assert torch.equal(ours.nan_to_num(7.0), theirs.nan_to_num(7.0))


def test_fnuz_to_fn_saturates_only_the_two_largest_magnitudes():
    codes, exact = fp8.fnuz_to_fn(ALL_CODES)
    assert (~exact).nonzero().flatten().tolist() == [0x7F, 0xFF]
    assert codes[0x7F] == 0x7E and codes[0xFF] == 0xFE and codes[0x80] == 0x7F


def test_in_range_values_give_identical_bytes_on_fn_and_doubled_fnuz():
    x = torch.arange(-440.0, 440.0, 0.37)
    fn = fp8.quantize(x, 1.0, "float8_e4m3fn").view(torch.uint8)
    fnuz = fp8.quantize(x, 2.0, "float8_e4m3fnuz").view(torch.uint8)
    nonzero = fn != 0x80
    assert torch.equal(fn[nonzero], fnuz[nonzero])


@pytest.mark.parametrize(
    "platform, arch, expected",
    [("cuda", "sm90", torch.float8_e4m3fn), ("rocm", "gfx942", torch.float8_e4m3fnuz), ("rocm", "gfx950", torch.float8_e4m3fn)],
)
def test_platform_fp8_format(platform, arch, expected):
    assert fp8.cache_dtype_for("fp8", torch.bfloat16, platform, arch) == expected
    assert fp8.cache_dtype_for("fp8_e5m2", torch.bfloat16, platform, arch) == torch.float8_e5m2


def test_unknown_kv_cache_dtype_is_named():
    with pytest.raises(ValueError, match="fp8_e3m4"):
        fp8.cache_dtype_for("fp8_e3m4", torch.bfloat16)
