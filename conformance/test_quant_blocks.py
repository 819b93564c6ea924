"""Per-token-head quantised caches, blocks: a copied or swapped block carries its codes and its
scales, in every layer, and nothing else changes (SPEC §16 PTH-BLOCKS, NVFP4-BLOCKS)."""

import dataclasses

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from .harness import quant as Q

pytestmark = [pytest.mark.kvc_layouts("quant"), pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize(("mode", "v_scales"), Q.VARIANTS, ids=Q.VARIANT_IDS)]


def written_cache(case, op, mode, v_scales, order):
    """A two-layer cache with tokens written in blocks 0 and 2 of each layer."""
    spec = Q.quant_spec(case, op, mode, order, v_scales, num_layers=2)
    N = spec.geometry.block_size
    arena, expected = Q.allocate(case, spec)
    Q.reallocate(case, arena, expected, layer=1)
    for layer in (0, 1):
        arena.spec = spec = dataclasses.replace(spec, layer=layer)
        key, value = Q.token_rows(spec, 4, case.seed + layer)
        Q.write_and_compare(case, spec, key, value, torch.tensor([0, N - 1, 2 * N, 2 * N + 3]), f"layer {layer}", arena, expected)
    return arena, expected


@pytest.mark.copy
@pytest.mark.kvc_clause("PTH-BLOCKS", "NVFP4-BLOCKS")
def test_copied_blocks_carry_codes_and_scales_in_every_layer(case, mode, v_scales, order):
    arena, expected = written_cache(case, "quant_copy", mode, v_scales, order)
    mapping = torch.tensor([[0, 1], [2, 4]])
    QC.copy_blocks(Q.region_of(expected, arena.spec.geometry), arena.spec.geometry, mapping)
    case.backend.quant_copy(arena.cache, mapping.to(case.device), arena.spec)
    Q.assert_arena_equal("quant copy", case, expected, arena, f"block_mapping {mapping.tolist()}")


@pytest.mark.swap
@pytest.mark.kvc_clause("PTH-BLOCKS", "NVFP4-BLOCKS")
def test_swapped_blocks_carry_codes_and_scales_in_every_layer(case, mode, v_scales, order):
    device, _ = written_cache(case, "quant_swap", mode, v_scales, order)
    host, host_expected = Q.allocate(case, device.spec, seed_offset=1)
    src, dst = torch.tensor([2, 0]), torch.tensor([3, 1])
    QC.swap_blocks(device.region.cpu(), device.spec.geometry, Q.region_of(host_expected, host.spec.geometry), host.spec.geometry, src, dst)
    case.backend.quant_swap(device.cache, device.spec, host.cache, host.spec, src.to(case.device), dst)
    Q.assert_arena_equal("quant swap out", case, host_expected, host, f"device blocks {src.tolist()} -> host blocks {dst.tolist()}")
