"""Quantised caches, write side: ``triton_reshape_and_cache_flash_per_token_head_quant`` (for
nvfp4 ``reshape_and_cache_nvfp4``) puts every code and every scale where
reference/quant_layouts.py says, encoded as reference/quant_codecs.py says, and changes nothing
else — not other slots' scales, not padding, not other layers, not the guard bytes (SPEC §16
PTH-*, §16.1 NVFP4-*)."""

import dataclasses

import pytest
import torch

from kvconform.reference import quant_layouts as QL

from .harness import quant as Q

pytestmark = [pytest.mark.write, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize(("mode", "v_scales"), Q.VARIANTS, ids=Q.VARIANT_IDS)]


@pytest.mark.kvc_clause("PTH-LAYOUT", "PTH-SCALE-PLACE", "PTH-ENCODE-INT8", "PTH-ENCODE-FP8", "PTH-WRITE-ONLY", "PTH-PAD-1", "PTH-SOURCE-STRIDE",
                        "NVFP4-PAGE", "NVFP4-SWIZZLE", "NVFP4-SCALE-PLACEMENT", "NVFP4-E2M1", "NVFP4-SCALE",
                        "NVFP4-WRITE-ONLY")
def test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes(case, mode, v_scales, order):
    spec = Q.quant_spec(case, "quant_write", mode, order, v_scales)
    N = spec.geometry.block_size
    slots = torch.tensor([0, N + 3, -1, 3 * N - 1, 4 * N + 2, 2 * N + 5, -1])
    key, value = Q.token_rows(spec, len(slots) + 2, case.seed)  # rows past the mapping are not read
    Q.write_and_compare(case, spec, key, value, slots, "qkv rows, two padding slots")


@pytest.mark.kvc_clause("PTH-PAD-1", "PTH-WRITE-ONLY", "NVFP4-WRITE-ONLY")
def test_padding_slots_leave_codes_and_scales_untouched(case, mode, v_scales, order):
    spec = Q.quant_spec(case, "quant_write", mode, order, v_scales)
    key, value = Q.token_rows(spec, 3, case.seed)
    Q.write_and_compare(case, spec, key, value, torch.full((3,), -1), "every slot is -1")


@pytest.mark.kvc_clause("PTH-ENCODE-INT8", "PTH-ENCODE-FP8", "PTH-SCALE-FLOOR", "NVFP4-E2M1", "NVFP4-SCALE")
def test_edge_rows_encode_exactly(case, mode, v_scales, order):
    """A zero row (scale floor), then rows whose values sit on rounding ties of the codes and of
    the scale, at ±max and past it (per mode: pth_edge_rows, nvfp4_edge_rows); V is −K."""
    nvfp4 = mode == QL.NVFP4
    spec = Q.quant_spec(case, "quant_write", mode, order, v_scales, num_kv_heads=1, head_size=64)
    if nvfp4:  # global scales 1 and 2, exact in float32, so the ties stay ties
        spec = dataclasses.replace(spec, k_scale=1.0, v_scale=0.5)
    rows = nvfp4_edge_rows(spec.geometry.head_size) if nvfp4 else pth_edge_rows(mode, spec.geometry.head_size)
    key = rows[:, None, :].to(spec.model_dtype)
    Q.write_and_compare(case, spec, key, -key, torch.tensor([1, 6, 4]), "edge rows (zero, ties, ±max)")


def pth_edge_rows(mode, D):
    """Zero; ±max extremes; ties: amax 127 makes the int8 scale 1 so ±k.5 are ties; amax 448
    does it for fp8 (e4m3 ties between neighbouring codes)."""
    qmax = 127.0 if mode == "int8_per_token_head" else 448.0
    ties = torch.tensor([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -125.5] if mode == "int8_per_token_head"
                        else [8.5, 9.5, -17.0, 19.0, 68.0, -76.0, 272.0, -304.0, 0.0029296875, 0.0009765625])
    rows = torch.stack([torch.zeros(D), torch.linspace(-qmax, qmax, D) * 0.01,
                        torch.cat([torch.tensor([qmax, -qmax]), ties, torch.zeros(D - 2 - len(ties))])])
    rows[1, 0], rows[1, -1] = -3.0, 3.0
    return rows


def nvfp4_edge_rows(D):
    """Groups of 16 (K's global scale 1; V = −K with 2): amax 6 (scale 1) with every e2m1 tie, ±6, a small
    negative that rounds to −0; amax 6.375 (amax/6 = 1.0625, an e4m3 tie: to 1.0, and 6.375
    saturates to 6); amax 3000 (the scale saturates at 448); amax 0.01 (an e4m3 subnormal scale);
    row 0 is zero; row 2 random, in the edge row's swizzle tile (slots 4-7)."""
    ties = torch.tensor([6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -3.5, -5.0, -0.1, 0.0])
    groups = [ties, torch.linspace(-6.375, 6.375, 16), torch.linspace(-3000.0, 1000.0, 16), torch.linspace(0.01, -0.002, 16)]
    edge = torch.cat(groups + [torch.zeros(D - 16 * len(groups))])
    return torch.stack([torch.zeros(D), edge, torch.randn(D, generator=torch.Generator().manual_seed(7))])


@pytest.mark.kvc_clause("PTH-SCALE-INIT", "PTH-LAYER", "NVFP4-WRITE-ONLY")
def test_a_layers_first_use_and_writes_leave_other_layers_untouched(case, mode, v_scales, order):
    spec = Q.quant_spec(case, "quant_write", mode, order, v_scales, num_layers=2, layer=0)
    N = spec.geometry.block_size
    key, value = Q.token_rows(spec, 4, case.seed)
    arena, expected = Q.write_and_compare(case, spec, key, value, torch.tensor([1, N, 2 * N + 1, 3 * N]), "layer 0")
    Q.reallocate(case, arena, expected, layer=1)
    Q.assert_arena_equal("quant layer first use", case, expected, arena, "layer 1's scale views built after layer 0 was written")
    key, value = Q.token_rows(arena.spec, 4, case.seed + 1)
    Q.write_and_compare(case, arena.spec, key, value, torch.tensor([1, N + 1, 2 * N, 4 * N - 1]), "layer 1", arena, expected)
