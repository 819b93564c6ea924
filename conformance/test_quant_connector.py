"""Per-token-head quantised caches, connector side: the byte regions a connector registers for a
head slice of some blocks hold exactly that slice's codes **and scales** in every layer, so a slice
moved by its regions lands bit for bit (SPEC §16 PTH-HEAD-SLICE; nvfp4: several runs per side,
NVFP4-HEAD-SLICE)."""

import dataclasses

import pytest
import torch

from kvconform.reference import quant_layouts as QL

from .harness import quant as Q

pytestmark = [pytest.mark.connector, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize("mode", QL.MODES)]
BLOCKS, HEADS = [1, 3], range(1, 3)


def slice_bytes(spec) -> torch.Tensor:
    """Every byte of the slice (codes and scales of heads HEADS, blocks BLOCKS, every slot and layer), sorted."""
    g = spec.geometry
    fields = [f.flatten() for layer in range(g.num_layers) for f in QL.field_offsets(
        g, torch.tensor(BLOCKS)[:, None, None], torch.arange(g.block_size)[:, None], torch.tensor(list(HEADS)), layer).values()]
    return torch.cat(fields).sort().values


@pytest.mark.kvc_clause("PTH-HEAD-SLICE", "NVFP4-HEAD-SLICE")
def test_head_slice_regions_cover_exactly_the_slices_codes_and_scales(case, mode, order):
    spec = Q.quant_spec(case, "quant_regions", mode, order, num_layers=2, num_kv_heads=3)
    arena, _ = Q.allocate(case, spec)
    regions = case.backend.quant_regions(arena.cache, spec, BLOCKS, HEADS)
    covered = torch.cat([torch.arange(start, start + length) for start, length in regions]).sort().values
    Q.assert_byte_sets_equal("quant head-slice regions", case, spec, slice_bytes(spec), covered, f"blocks {BLOCKS}, heads {HEADS}")


@pytest.mark.kvc_clause("PTH-HEAD-SLICE", "NVFP4-HEAD-SLICE")
def test_a_head_slice_moved_by_its_regions_lands_bit_for_bit(case, mode, order):
    spec = Q.quant_spec(case, "quant_regions", mode, order, num_layers=2, num_kv_heads=3)
    producer, _ = Q.allocate(case, spec)
    N = spec.geometry.block_size
    for layer in (0, 1):
        key, value = Q.token_rows(spec, 4, case.seed + layer)
        case.backend.quant_write(producer.cache, key.to(case.device), value.to(case.device), torch.tensor([N, N + 5, 3 * N, 4 * N - 1], device=case.device),
                                 dataclasses.replace(spec, layer=layer))
    consumer, expected = Q.allocate(case, spec, seed_offset=1)
    sent, into = producer.region, consumer.region
    for start, length in case.backend.quant_regions(producer.cache, spec, BLOCKS, HEADS):
        into[start : start + length] = sent[start : start + length]
    where = slice_bytes(spec)
    Q.region_of(expected, spec.geometry)[where] = sent.cpu()[where]
    Q.assert_arena_equal("quant head-slice transfer", case, expected, consumer, f"blocks {BLOCKS}, heads {HEADS} moved by their regions")
