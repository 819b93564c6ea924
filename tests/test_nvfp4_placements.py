"""nvfp4's two V-scale placements (SPEC NVFP4-SCALE-PLACEMENT, reference/quant_layouts.py
``field_offsets`` with ``v_scales``): swizzled (vLLM 0.33.0's SM100 kernel) and linear (FlashInfer's
writer on SM80/90/120, measured on an H200 by tests/real_kernels_gpu/flashinfer_nvfp4_probe.py).
The linear one is the probe's measured formula; both hold the same bytes at permuted offsets; a
page converts between them exactly and decodes to the same K and V; read with the other placement
it gives other values."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL


def geometry(order, v_scales=QL.SWIZZLED, **kw):
    return QL.QuantGeometry(**{"num_blocks": 3, "block_size": 8, "num_kv_heads": 2, "head_size": 64, "mode": QL.NVFP4, "order": order,
                               "num_layers": 2, "v_scales": v_scales, **kw})


def every_cell(g):
    return torch.arange(g.num_blocks)[:, None, None], torch.arange(g.block_size)[:, None], torch.arange(g.num_kv_heads)


def written_page(g, seed=3):
    """A zeroed cache with every slot of blocks 0 and 2, both layers, written by the reference."""
    region = torch.zeros(g.nbytes(), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(seed)
    slots = torch.cat([torch.arange(g.block_size), 2 * g.block_size + torch.arange(g.block_size)])
    for layer in range(g.num_layers):
        key, value = (torch.randn(len(slots), g.num_kv_heads, g.head_size, generator=gen) * 4 for _ in "kv")
        QC.write(key, value, region, g, slots, layer=layer, k_scale=0.75, v_scale=1.25)
    return region


@pytest.mark.parametrize("order", QL.ORDERS)
def test_linear_v_scales_sit_where_k_scales_sit_one_side_on(order):
    """The probe's formula, under which all 336 V scales FlashInfer wrote on the H200 agreed."""
    g = geometry(order, QL.LINEAR)
    for layer in range(g.num_layers):
        at = QL.field_offsets(g, *every_cell(g), layer)
        assert torch.equal(at["v_scale"], at["k_scale"] + g.side_bytes), f"v_scale ≠ k_scale + side_bytes [{order}, layer {layer}]"


@pytest.mark.parametrize("order", QL.ORDERS)
def test_the_placements_differ_only_in_where_each_v_scale_byte_sits_within_its_heads_plane(order):
    swizzled, linear = (QL.field_offsets(geometry(order, p), *every_cell(geometry(order)), 1) for p in QL.V_SCALE_PLACEMENTS)
    for field in ("k_data", "k_scale", "v_data"):
        assert torch.equal(swizzled[field], linear[field]), f"{field} moved with the V-scale placement [{order}]"
    assert not torch.equal(swizzled["v_scale"], linear["v_scale"]), f"the placements coincide [{order}]"
    per_head = [offsets.transpose(1, 2).flatten(2).sort().values for offsets in (swizzled["v_scale"], linear["v_scale"])]
    assert torch.equal(*per_head), f"a (block, head)'s V-scale bytes are not the same set in both placements [{order}]"


@pytest.mark.parametrize("order", QL.ORDERS)
def test_a_head_slice_registers_the_same_runs_in_both_placements(order):
    g = geometry(order, num_kv_heads=4)
    assert QL.head_slice_ranges(g, [0, 2], range(1, 3)) == QL.head_slice_ranges(dataclasses.replace(g, v_scales=QL.LINEAR), [0, 2], range(1, 3))


def test_a_linear_v_scale_byte_names_its_own_slot():
    g = geometry("HND", QL.LINEAR)
    at = QL.field_offsets(g, 1, 5, 1)
    assert QL.coordinates_of(g, int(at["v_scale"][2])) == {"layer": 0, "block": 1, "slot": 5, "head": 1, "field": "v_scale", "byte": 2}


@pytest.mark.parametrize("order", QL.ORDERS)
@pytest.mark.parametrize("source", QL.V_SCALE_PLACEMENTS)
def test_a_page_converted_to_the_other_placement_decodes_the_same_and_converts_back_bit_for_bit(order, source):
    g = geometry(order, source)
    other = dataclasses.replace(g, v_scales=QL.LINEAR if source == QL.SWIZZLED else QL.SWIZZLED)
    page, converted, back = written_page(g), torch.zeros(g.nbytes(), dtype=torch.uint8), torch.zeros(g.nbytes(), dtype=torch.uint8)
    tokens, table = g.num_blocks * g.block_size, list(range(g.num_blocks))
    QC.reblock(page, g, converted, other, table, table, tokens)
    QC.reblock(converted, other, back, g, table, table, tokens)
    assert torch.equal(back, page), f"{source} → {other.v_scales} → {source} changed bytes [{order}]"
    for layer in range(g.num_layers):
        kv, kv_other = (QC.dequantised_kv(p, geo, [[0, 1, 2]], [tokens], layer=layer, k_scale=0.75, v_scale=1.25)
                        for p, geo in ((page, g), (converted, other)))
        assert all(torch.equal(a, b) for a, b in zip(kv, kv_other)), f"decoded K/V differ after {source} → {other.v_scales} [{order}, layer {layer}]"


@pytest.mark.parametrize("order", QL.ORDERS)
def test_a_linear_page_read_as_swizzled_gives_other_v_values_and_the_same_k(order):
    g = geometry(order, QL.LINEAR)
    page = written_page(g)
    (k, v, _), (k_wrong, v_wrong, _) = (QC.dequantised_kv(page, geo, [[0]], [g.block_size], k_scale=0.75, v_scale=1.25)
                                        for geo in (g, dataclasses.replace(g, v_scales=QL.SWIZZLED)))
    assert torch.equal(k, k_wrong), f"K depends on V's placement [{order}]"
    assert not torch.equal(v, v_wrong), f"V read with the wrong placement came out right [{order}]"


def test_only_nvfp4_has_a_v_scale_placement():
    with pytest.raises(ValueError, match="v_scales"):
        QL.QuantGeometry(num_blocks=1, block_size=16, num_kv_heads=1, head_size=64, mode="int8_per_token_head", v_scales=QL.LINEAR)
    with pytest.raises(ValueError, match="v_scales"):
        geometry("HND", "diagonal")
