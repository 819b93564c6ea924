"""Seeded faults of quantised caches (per-token-head modes, nvfp4): ``reference_quant`` with one
step wrong each (issue 36; the field bugs of ../shared/spec/MLA_AND_QUANT_FACTS.md §4, and what
0.33.0's nvfp4 code does differently from it). Each must be caught by the families it names
(``catches``).
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import mutant
from ..reference_quant import ReferenceQuant


class QuantMutant(ReferenceQuant):
    catches: tuple[str, ...] = ()  # check families that must fail
    kills: tuple[str, ...] = ()  # checks that must fail, at least one of each family in catches (tests/mutant_focus.py)
    suite_args: tuple[str, ...] = ()


@mutant("quant_scale_view_from_shape")
class ScaleViewFromShape(QuantMutant):
    """Builds the scale views from the shape, as if every cache were contiguous HND, not from the
    tensor's strides: an NHD cache gets its scales written into other heads' and slots' bytes."""

    catches = ("write", "read")
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes", "test_decode_equals_sdpa_on_the_reference_dequantised_kv")

    def scale_views(self, kv_cache):
        B, H, N, C = kv_cache.shape
        D = C // 2 - QL.SCALE_BYTES
        f32 = torch.tensor([], dtype=torch.float32, device=kv_cache.device).set_(kv_cache.untyped_storage())
        base = kv_cache.storage_offset() // 4
        return tuple(torch.as_strided(f32, (B, N, H), (H * N * C // 4, C // 4, N * C // 4), base + off // 4) for off in (D, C // 2 + D))


@mutant("quant_scales_reset_across_layers")
class ScalesResetAcrossLayers(QuantMutant):
    """A layer's first use fills the scales of every layer of the allocation with 1.0 (scale views
    built over the whole storage): layer 1 coming up resets what layer 0 wrote."""

    catches = ("write",)
    kills = ("test_a_layers_first_use_and_writes_leave_other_layers_untouched",)

    def initialise_scales(self, cache, spec):
        for layer in range(cache.shape[0]):
            for view in self.scale_views(cache[layer]):
                view.fill_(1.0)


@mutant("quant_first_use_fills_k_scales_only")
class FirstUseFillsKScalesOnly(QuantMutant):
    """A layer's first use fills its K scales with 1.0 and leaves its V scales as allocated: neither
    of the two states PTH-SCALE-INIT allows (a fill loop that stops after the first view)."""

    catches = ("write",)
    kills = ("test_a_layers_first_use_and_writes_leave_other_layers_untouched",)

    def initialise_scales(self, cache, spec):
        self.scale_views(cache[spec.layer])[0].fill_(1.0)


@mutant("quant_v_scaled_with_k_scale")
class VScaledWithKScale(QuantMutant):
    """Quantises V with K's scale and stores K's scale for V."""

    catches = ("write",)
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes",)

    def encode(self, key, value, g):
        (k_codes, k_scales), _ = super().encode(key, value, g)
        y = value.float() * (1.0 / k_scales)[..., None]
        if g.mode == "int8_per_token_head":
            v_codes = torch.where(y >= 0, y + 0.5, y - 0.5).clamp(-128, 127).trunc().to(torch.int8).view(torch.uint8)
        else:
            qmax = QC.quant_max(g.mode, self.platform, self.arch())
            v_codes = y.clamp(-qmax, qmax).to(QC.code_dtype(g.mode, self.platform, self.arch())).view(torch.uint8)
        return (k_codes, k_scales), (v_codes, k_scales)


@mutant("quant_int8_round_half_to_even")
class RoundHalfToEven(QuantMutant):
    """int8 codes by ``torch.round`` (ties to even, as vLLM's test reference does) instead of the
    kernel's +0.5 then truncation (ties away from zero)."""

    catches = ("write",)
    kills = ("test_edge_rows_encode_exactly",)

    def encode(self, key, value, g):
        if g.mode != "int8_per_token_head":
            return super().encode(key, value, g)
        out = []
        for x in (key, value):
            _, scales = QC.encode(x, g.mode)
            y = x.float() * (1.0 / scales)[..., None]
            out.append((y.round().clamp(-128, 127).to(torch.int8).view(torch.uint8), scales))
        return tuple(out)


@mutant("quant_no_scale_floor")
class NoScaleFloor(QuantMutant):
    """Omits the 1e-6 floor of the scale: an all-zero row gets scale 0 and NaN codes."""

    catches = ("write",)
    kills = ("test_edge_rows_encode_exactly",)

    def encode(self, key, value, g):
        (k_codes, k_scales), (v_codes, v_scales) = super().encode(key, value, g)
        zero = lambda x: x.float().abs().amax(-1) == 0  # noqa: E731 - the rows the floor decided
        return (k_codes, torch.where(zero(key), 0.0, k_scales)), (v_codes, torch.where(zero(value), 0.0, v_scales))


@mutant("quant_nhd_hnd_strides_swapped")
class StridesSwapped(QuantMutant):
    """Lays an HND cache out with NHD strides and an NHD cache with HND strides."""

    catches = ("write",)
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes",)

    def strides(self, g):
        other = "NHD" if g.order == "HND" else "HND"
        return dataclasses.replace(g, order=other).strides()


@mutant("quant_padding_slot_written")
class PaddingSlotWritten(QuantMutant):
    """Treats slot -1 as the last slot of the cache (Python's negative index), codes and scales."""

    catches = ("write",)
    kills = ("test_padding_slots_leave_codes_and_scales_untouched",)

    def valid_rows(self, slot_mapping):
        return torch.arange(len(slot_mapping), device=slot_mapping.device)


@mutant("quant_decode_ignores_scales")
class DecodeIgnoresScales(QuantMutant):
    """Decodes the codes as values, scale 1 (the per-token-head scale never applied to S and P)."""

    catches = ("read",)
    kills = ("test_decode_equals_sdpa_on_the_reference_dequantised_kv",)

    def decode_values(self, codes, scales, g):
        return super().decode_values(codes, torch.ones_like(scales), g)


@mutant("quant_copy_leaves_scales")
class CopyLeavesScales(QuantMutant):
    """Copies a block's K and V codes but not their scales (the data views, not the page)."""

    catches = ("copy",)
    kills = ("test_copied_blocks_carry_codes_and_scales_in_every_layer",)

    def quant_copy(self, cache, block_mapping, spec):
        for layer in range(cache.shape[0]):
            for view in self.data_views(cache[layer]):
                for src, dst in block_mapping.tolist():
                    view[dst] = view[src].clone()


@mutant("quant_swap_one_layer")
class SwapOneLayer(QuantMutant):
    """Swaps the pages of layer ``spec.layer`` only: the other layers' codes and scales stay behind."""

    catches = ("swap",)
    kills = ("test_swapped_blocks_carry_codes_and_scales_in_every_layer",)

    def quant_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        layer = src_spec.layer
        dst_cache[layer, dst_ids.to(dst_cache.device)] = src_cache[layer, src_ids.to(src_cache.device)].to(dst_cache.device)


@mutant("quant_regions_leave_scales")
class RegionsLeaveScales(QuantMutant):
    """Registers a head slice's K and V codes, run by run, but not the scales between them: the
    consumer decodes the producer's codes with its own stale scales."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_slices_codes_and_scales", "test_a_head_slice_moved_by_its_regions_lands_bit_for_bit")

    def quant_regions(self, cache, spec, block_ids, heads):
        g = spec.geometry
        cells = super().quant_regions(cache, spec, block_ids, heads)
        starts = [start + i * g.cell_bytes for start, length in cells for i in range(length // g.cell_bytes)]
        return [(s + side * g.padded_head, g.head_size) for s in starts for side in (0, 1)]


# ---------------------------------------------------------------- nvfp4 (SPEC §16.1)
@mutant("quant_nvfp4_nibbles_swapped")
class Nvfp4NibblesSwapped(QuantMutant):
    """Packs the even element of each pair in the high nibble (NVFP4-E2M1: ``cvt...e2m1x2 b, odd,
    even`` puts the even one low)."""

    catches = ("write", "read")
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes", "test_decode_equals_sdpa_on_the_reference_dequantised_kv")

    def nvfp4_encode(self, x, k_scale):
        data, scales = super().nvfp4_encode(x, k_scale)
        return (data << 4) | (data >> 4), scales


@mutant("quant_nvfp4_v_scales_linear")
class Nvfp4VScalesLinear(QuantMutant):
    """Stores V's block scales linearly, like K's: the 4 × 4 swizzle the SM100 reader expects is
    left out (NVFP4-SWIZZLE)."""

    catches = ("write", "read")
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes", "test_decode_equals_sdpa_on_the_reference_dequantised_kv")

    def scale_slots(self, slots, g, side):
        return super().scale_slots(slots, g, "k")


@mutant("quant_nvfp4_linear_v_scales_swizzled")
class Nvfp4LinearVScalesSwizzled(QuantMutant):
    """Declares FlashInfer's linear V scales (SM80/90/120) but stores and reads them swizzled, as the
    SM100 kernel does: a reader of the linear page finds each V scale at another slot's or column's
    place (NVFP4-SCALE-PLACEMENT). Its swizzled caches are right."""

    catches = ("write", "read")
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes", "test_decode_equals_sdpa_on_the_reference_dequantised_kv")

    def scale_slots(self, slots, g, side):
        return super().scale_slots(slots, dataclasses.replace(g, v_scales=QL.SWIZZLED), side)


@mutant("quant_nvfp4_k_scales_swizzled")
class Nvfp4KScalesSwizzled(QuantMutant):
    """Swizzles K's block scales too, as ../shared/spec/MLA_AND_QUANT_FACTS.md §5 says; 0.33.0's
    kernel stores them linearly (csrc/nvfp4_kv_cache_kernels.cu:283-290)."""

    catches = ("write",)
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes",)

    def scale_slots(self, slots, g, side):
        if side == "k":  # as V's are on SM100, whatever this cache's V placement
            return super().scale_slots(slots, dataclasses.replace(g, v_scales=QL.SWIZZLED), "v")
        return super().scale_slots(slots, g, side)


@mutant("quant_nvfp4_global_scale_ignored")
class Nvfp4GlobalScaleIgnored(QuantMutant):
    """Computes the block scales without the second level (global scale 1, not 1 / k_scale)."""

    catches = ("write",)
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes", "test_edge_rows_encode_exactly")

    def nvfp4_encode(self, x, k_scale):
        return super().nvfp4_encode(x, 1.0)


@mutant("quant_nvfp4_block_scale_rounded_up")
class Nvfp4BlockScaleRoundedUp(QuantMutant):
    """Rounds each e4m3 block scale up to the next e4m3 value (what nvfp4_ds_mla does), not to
    the nearest: values then use less of e2m1's range (NVFP4-SCALE)."""

    catches = ("write",)
    kills = ("test_edge_rows_encode_exactly",)

    def nvfp4_encode(self, x, k_scale):
        xf = x.float().cpu().unflatten(-1, (-1, QL.NVFP4_GROUP))
        g = QC.ONE / torch.tensor(k_scale, dtype=torch.float32)
        sf = g * (xf.abs().amax(dim=-1) * (QC.ONE / 6.0))
        codes = sf.clamp(max=QC.E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
        codes = torch.where((codes.view(torch.float8_e4m3fn).float() < sf) & (codes < 0x7E), codes + 1, codes)  # the next e4m3 up
        values = codes.view(torch.float8_e4m3fn).float()
        out = torch.where(values != 0, QC.ONE / (values * (QC.ONE / g)), 0.0)
        data = QC.pack_nibbles(QC.e2m1_codes(xf * out[..., None]).flatten(-2))
        return data.to(x.device), codes.to(x.device)


@mutant("quant_nvfp4_v_side_from_head_slot")
class Nvfp4VSideFromHeadSlot(QuantMutant):
    """Starts V's side at ``kv_cache[:, H]`` of the logical ``(B, 2H, N, C)`` tensor, as the SM100
    kernel's caller does (flashinfer.py:2835-2840): right in HND, ``H·C`` bytes into K's side in NHD."""

    catches = ("write",)
    kills = ("test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes",)

    def nvfp4_views(self, kv_cache, g):
        views = super().nvfp4_views(kv_cache, g)
        shift = kv_cache.stride(1) * g.num_kv_heads - g.side_bytes  # 0 in HND
        for name in ("v_data", "v_scale"):
            v = views[name]
            views[name] = torch.as_strided(v, v.shape, v.stride(), v.storage_offset() + shift)
        return views


@mutant("quant_nvfp4_regions_leave_scales")
class Nvfp4RegionsLeaveScales(QuantMutant):
    """Registers a head slice's K and V data runs of an nvfp4 page but not its scale runs."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_slices_codes_and_scales", "test_a_head_slice_moved_by_its_regions_lands_bit_for_bit")

    def registered_views(self, kv_cache, g):
        return [view for name, view in self.nvfp4_views(kv_cache, g).items() if name.endswith("_data")]


@mutant("quant_nvfp4_reblock_copies_stored_scale_rows")
class Nvfp4ReblockCopiesStoredScaleRows(QuantMutant):
    """Re-blocks V's scales by copying each token's *stored* scale row (slot t's row of the swizzled
    plane), as if the page kept its old swizzle: whole 4-slot tiles come out right, the last partial
    tile takes other slots' scales and misses its own (NVFP4-REBLOCK)."""

    catches = ("connector",)
    kills = ("test_reblocked_tokens_land_with_their_codes_and_scales",)

    def reblock_scale_slots(self, slots, g, side):
        return self.scale_slots(slots, g, "k")


@mutant("quant_fp8_e4m3fn_on_gfx942")
class Fp8E4m3fnOnGfx942(QuantMutant):
    """Claims an MI300 (gfx942: e4m3fnuz, vLLM's bound 224) but its per-token-head writer encodes
    fp8 as on CUDA: e4m3fn codes of x / (amax / 448). Every code is a valid fnuz byte, so the
    machine's own reader decodes other values, silently. The platform's golden digest fails it, and
    so do the write and read checks, whose reference encodes for the backend's platform."""

    catches = ("equivalence",)
    kills = ("test_golden_pages_hash_to_the_stored_digest_of_their_mode",)
    platform = "rocm"

    def arch(self):
        return "gfx942"

    def encode(self, key, value, g):
        return QC.encode(key, g.mode, "cuda", "sm90"), QC.encode(value, g.mode, "cuda", "sm90")
