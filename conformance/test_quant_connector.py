"""Per-token-head quantised caches, connector side: the byte regions a connector registers for a
head slice of some blocks hold exactly that slice's codes **and scales** in every layer, so a slice
moved by its regions lands bit for bit (SPEC §16 PTH-HEAD-SLICE; nvfp4: several runs per side,
NVFP4-HEAD-SLICE); a sequence re-blocked to another block size keeps every token's codes and
scales (NVFP4-REBLOCK)."""

import dataclasses

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from .harness import quant as Q

pytestmark = [pytest.mark.connector, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize(("mode", "v_scales"), Q.VARIANTS, ids=Q.VARIANT_IDS)]
BLOCKS, HEADS = [1, 3], range(1, 3)


def slice_bytes(spec) -> torch.Tensor:
    """Every byte of the slice (codes and scales of heads HEADS, blocks BLOCKS, every slot and layer), sorted."""
    g = spec.geometry
    fields = [f.flatten() for layer in range(g.num_layers) for f in QL.field_offsets(
        g, torch.tensor(BLOCKS)[:, None, None], torch.arange(g.block_size)[:, None], torch.tensor(list(HEADS)), layer).values()]
    return torch.cat(fields).sort().values


@pytest.mark.kvc_clause("PTH-HEAD-SLICE", "NVFP4-HEAD-SLICE")
def test_head_slice_regions_cover_exactly_the_slices_codes_and_scales(case, mode, v_scales, order):
    spec = Q.quant_spec(case, "quant_regions", mode, order, v_scales, num_layers=2, num_kv_heads=3)
    arena, _ = Q.allocate(case, spec)
    regions = case.backend.quant_regions(arena.cache, spec, BLOCKS, HEADS)
    covered = torch.cat([torch.arange(start, start + length) for start, length in regions]).sort().values
    Q.assert_byte_sets_equal("quant head-slice regions", case, spec, slice_bytes(spec), covered, f"blocks {BLOCKS}, heads {HEADS}")


@pytest.mark.kvc_clause("PTH-HEAD-SLICE", "NVFP4-HEAD-SLICE")
def test_a_head_slice_moved_by_its_regions_lands_bit_for_bit(case, mode, v_scales, order):
    spec = Q.quant_spec(case, "quant_regions", mode, order, v_scales, num_layers=2, num_kv_heads=3)
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


@pytest.mark.kvc_clause("NVFP4-REBLOCK")
@pytest.mark.parametrize("sizes", [(16, 32), (32, 16)], ids=["N16to32", "N32to16"])
def test_reblocked_tokens_land_with_their_codes_and_scales(case, mode, v_scales, order, sizes):
    """A sequence moved between block sizes: every token's codes and scales land at its new slot,
    nothing else changes; 2·32 + 5 tokens end in a partial block and a partial swizzle tile."""
    tokens = 2 * max(sizes) + 5
    gen = torch.Generator().manual_seed(case.seed)
    specs = [Q.quant_spec(case, "quant_reblock", mode, order, v_scales, num_layers=2, block_size=n, num_blocks=-(-tokens // n) + 2) for n in sizes]
    tables = [torch.randperm(s.geometry.num_blocks, generator=gen)[: -(-tokens // n)].tolist() for s, n in zip(specs, sizes)]
    producer, _ = Q.allocate(case, specs[0])
    slots = torch.tensor(tables[0])[torch.arange(tokens) // sizes[0]] * sizes[0] + torch.arange(tokens) % sizes[0]
    for layer in (0, 1):
        key, value = Q.token_rows(specs[0], tokens, case.seed + layer)
        case.backend.quant_write(producer.cache, key.to(case.device), value.to(case.device), slots.to(case.device), dataclasses.replace(specs[0], layer=layer))
    consumer, expected = Q.allocate(case, specs[1], seed_offset=1)
    QC.reblock(producer.region.cpu(), specs[0].geometry, Q.region_of(expected, specs[1].geometry), specs[1].geometry, tables[0], tables[1], tokens)
    case.backend.quant_reblock(producer.cache, specs[0], consumer.cache, specs[1], tables[0], tables[1], tokens)
    Q.assert_arena_equal("quant re-blocking", case, expected, consumer, f"{tokens} tokens from blocks {tables[0]} (N={sizes[0]}) into {tables[1]} (N={sizes[1]})")
