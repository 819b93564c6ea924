"""Seeded faults of fp8 caches: the scale, rounding, saturation, NaN and the fp8 format of the codes
(e4m3fn, e4m3fnuz, e5m2), in the writer and the decode kernel.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from ..reference_backend import flat_storage
from . import mutant
from .base import Gfx942Mutant, Mutant, place_rows


@mutant("fp8_scale_multiplied")
class Fp8ScaleMultiplied(Mutant):
    """Quantises ``x · scale`` instead of ``x / scale``."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        if spec.geometry.dtype in R.fp8.FP8_DTYPES:
            k_scale, v_scale = 1 / k_scale, 1 / v_scale
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)


@mutant("fp8_truncates_instead_of_rne")
class TruncatingFp8(Mutant):
    """Rounds toward zero instead of to nearest-even when quantising to fp8."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        rows = []
        for x, scale in ((key, k_scale), (value, v_scale)):
            exact = (x.float() / R.fp8._scale_like(scale, x, 1)).abs()
            codes = R.ops.encode(x, g, scale, head_dim=1).view(torch.uint8).to(torch.int16)
            magnitude = R.fp8.decode_codes(codes.to(torch.uint8), g.dtype).abs()
            codes = torch.where((magnitude > exact) & (codes & 0x7F != 0), codes - 1, codes)  # one code toward zero
            rows.append(codes.to(torch.uint8).view(g.dtype))
        place_rows(cache, spec, slot_mapping, rows)


@mutant("fn_to_fnuz_without_negative_zero_fix")
class FnToFnuzWithoutNegativeZeroFix(Gfx942Mutant):
    """Stores e4m3fn codes of ``2·x/scale`` as fnuz bits: −0 (0x80) becomes fnuz NaN and
    saturation lands on 448/2 instead of 240."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        if spec.geometry.dtype != torch.float8_e4m3fnuz:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        rows = [R.fp8.quantize(x, scale / 2, "float8_e4m3fn", head_dim=1).view(torch.float8_e4m3fnuz) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)


@mutant("fnuz_read_as_fn")
class FnuzReadAsFn(Gfx942Mutant):
    """Decode kernel reads the gfx942 cache's e4m3fnuz bytes as e4m3fn (values doubled)."""

    catches = ("read",)
    kills = ("test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        if spec.geometry.dtype != torch.float8_e4m3fnuz:
            return super().decode(cache, query, block_table, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)
        as_fn = dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, dtype=torch.float8_e4m3fn))
        return R.paged_decode_attention(query, flat_storage(cache, spec), spec.layout, as_fn.geometry, block_table, seq_lens,
                                        scale=scale, k_scale=k_scale, v_scale=v_scale)


def scaled(x: torch.Tensor, scale) -> torch.Tensor:
    """``x / scale`` in fp32, a scale per tensor or per KV head (dim 1 of ``[T, H, D]``)."""
    return x.float() / R.fp8._scale_like(scale, x, 1)


@mutant("fp8_nan_saturates_to_max")
class Fp8NanSaturatesToMax(Mutant):
    """Saturates with ``fmaxf(fminf(y, max), -max)``: IEEE fmin/fmax return the non-NaN operand,
    so a NaN is stored as +max, a finite value (FP8-NAN)."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        top = R.fp8.fp8_format(g.dtype).max_finite
        rows = [R.fp8.quantize(torch.nan_to_num(scaled(x, scale), nan=top), 1.0, g.dtype) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)


@mutant("fp8_near_ties_rounded_as_ties")
class Fp8NearTiesRoundedAsTies(Mutant):
    """A software round-to-nearest-even that calls a value a tie when it is within 2^-19 of one
    (a tolerance "for division error"): values a hair off a tie go to the even code instead of
    the nearer one (FP8-ENCODE near-ties)."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        fmt = R.fp8.fp8_format(g.dtype)
        grid = R.fp8.decode_codes(torch.arange(256, dtype=torch.uint8), fmt)
        grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])  # index i holds code i: its parity is the code's
        rows = []
        for x, scale in ((key, k_scale), (value, v_scale)):
            y = scaled(x, scale).cpu()
            a = y.abs()
            upper = torch.searchsorted(grid, a.nan_to_num(0.0).clamp(max=fmt.max_finite)).clamp(1, grid.numel() - 1)
            tie = (grid[upper - 1] + grid[upper]) / 2
            near = (a != tie) & ((a - tie).abs() <= tie * 2.0**-19)
            even = torch.where(upper % 2 == 0, grid[upper], grid[upper - 1])
            rows.append(R.fp8.quantize(torch.where(near, torch.copysign(even, y), y), 1.0, g.dtype).to(x.device))
        place_rows(cache, spec, slot_mapping, rows)


@mutant("fp8_e5m2_written_as_e4m3")
class E5m2CacheWrittenAsE4m3(Mutant):
    """An ``fp8_e5m2`` cache written with the platform's e4m3 codes (vLLM 0.33.0's TRITON_ATTN and
    Triton flash writer view every fp8 cache as ``current_platform.fp8_dtype()``: seen on the
    H200, docs/VLLM.md). The bytes are e4m3 while the cache says e5m2 (−2.75: e4m3fn c3, e5m2 c2)."""

    catches = ("write", "equivalence")
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values", "test_canonical_bytes_equal_the_committed_reference_digests")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype != torch.float8_e5m2:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        as_e4m3 = dataclasses.replace(g, dtype=self.cache_dtype("fp8_e4m3", spec.model_dtype))
        rows = [R.ops.encode(x, as_e4m3, scale, head_dim=1).view(torch.uint8).view(g.dtype) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)
