"""The nvfp4 reference (reference/quant_layouts.py, quant_codecs.py; SPEC §16.1 NVFP4-*): e2m1
codes and their ties, the nibble order, the two-level block scale, the V-scale swizzle and the
page map — on tiny exact data, then held against vLLM 0.33.0's own views
(``_nvfp4_kv_views``, ``nvfp4_split_data_scale``) and its test dequantiser
(``dequant_nvfp4_kv_cache``), read from its sdist. vLLM's nvfp4 writer is CUDA for SM100 only."""

from __future__ import annotations

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import vllm_sdist

FLASHINFER = "vllm/v1/attention/backends/flashinfer.py"
TORCH_UTILS = "vllm/utils/torch_utils.py"
TEST_UTILS = "tests/kernels/quantization/nvfp4_utils.py"
TEST_QUANT = "tests/kernels/quantization/test_nvfp4_quant.py"
STAND_INS = "import torch\n_KVPair = tuple\nFLOAT4_E2M1_MAX = 6.0  # scalar_types.float4_e2m1f.max()\n"


def geometry(order, **kw):
    return QL.QuantGeometry(**{"num_blocks": 3, "block_size": 8, "num_kv_heads": 2, "head_size": 64, "mode": "nvfp4", "order": order, **kw})


def test_every_e2m1_code_round_trips():
    codes = torch.arange(16, dtype=torch.uint8)
    assert torch.equal(QC.e2m1_codes(QC.e2m1_values(codes)), codes)
    assert QC.e2m1_values(codes).tolist()[:8] == [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def test_e2m1_ties_go_to_the_even_code_and_large_values_saturate_at_six():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert QC.e2m1_values(QC.e2m1_codes(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert QC.e2m1_values(QC.e2m1_codes(-ties)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]
    past = torch.tensor([0.2500001, 5.0000005, 7.0, 1e30, float("inf"), -1e30])
    assert QC.e2m1_values(QC.e2m1_codes(past)).tolist() == [0.5, 6.0, 6.0, 6.0, 6.0, -6.0]


def test_a_negative_value_rounding_to_zero_keeps_its_sign_bit():
    assert QC.e2m1_codes(torch.tensor([-0.1, 0.1, -0.0])).tolist() == [8, 0, 8]


def test_the_even_element_is_the_low_nibble():
    assert QC.pack_nibbles(torch.tensor([1, 2, 7, 15], dtype=torch.uint8)).tolist() == [0x21, 0xF7]
    assert QC.unpack_nibbles(torch.tensor([0x21, 0xF7], dtype=torch.uint8)).tolist() == [1, 2, 7, 15]


def test_the_block_scale_is_amax_over_six_times_the_global_scale_rounded_to_e4m3():
    x = torch.zeros(2, 32)
    x[0, :16] = torch.linspace(-6.0, 6.0, 16)  # amax 6, k_scale 0.5 (global 2): sf = 2 · 6/6 = 2; ±6 / (2 · 0.5) = ±6
    x[1, 16:] = 6.5  # amax 6.5: 2·6.5/6 = 2.1666… rounds to e4m3 2.25 (nearest; neighbours 2.0, 2.25)
    data, sf = QC.nvfp4_encode(x, 0.5)
    assert sf.view(torch.float8_e4m3fn).float().tolist() == [[2.0, 0.0], [0.0, 2.25]]
    assert QC.unpack_nibbles(data[0])[[0, 15]].tolist() == [0xF, 0x7]
    assert torch.equal(QC.unpack_nibbles(data[0])[16:], torch.zeros(16, dtype=torch.uint8))  # a zero group: sf 0, codes 0
    assert set(QC.unpack_nibbles(data[1])[16:].tolist()) == {7}  # 6.5 / (2.25 · 0.5) = 5.78 rounds to 6, code 7


def test_the_swizzle_permutes_each_four_by_four_tile_of_slots_and_scale_columns():
    for S in (4, 8):
        t, s = torch.meshgrid(torch.arange(8), torch.arange(S), indexing="ij")
        rows, cols = QL.swizzled(t, s, S)
        flat = (rows * S + cols).flatten()
        assert torch.equal(flat.sort().values, torch.arange(8 * S))  # a bijection of the (slot, scale) plane
        assert torch.equal(rows // 4, t // 4)  # within the slot's tile of four rows
        assert torch.equal(rows * S + cols, (t // 4 * 4 + s // (S // 4)) * S + (s % (S // 4)) * 4 + t % 4)


@pytest.mark.parametrize("order", QL.ORDERS)
def test_fields_tile_every_page_byte_exactly_once(order):
    g = geometry(order, num_layers=2)
    b, t, h = torch.meshgrid(torch.arange(g.num_blocks), torch.arange(g.block_size), torch.arange(g.num_kv_heads), indexing="ij")
    offs = [f.flatten() for layer in range(2) for f in QL.field_offsets(g, b, t, h, layer).values()]
    assert torch.equal(torch.cat(offs).sort().values, torch.arange(g.nbytes()))
    assert g.page_bytes == 2 * g.num_kv_heads * g.block_size * (g.head_size // 2 + g.head_size // 16)


@pytest.mark.parametrize("order", QL.ORDERS)
def test_k_scales_are_linear_and_v_scales_swizzled_after_each_sides_data(order):
    g = geometry(order)
    H, N, half, S = g.num_kv_heads, g.block_size, g.head_size // 2, g.head_size // 16
    f = QL.field_offsets(g, 1, 5, 1)
    row = 1 * N + 5 if order == "HND" else 5 * H + 1
    assert f["k_data"].tolist() == list(range(g.page_bytes + row * half, g.page_bytes + row * half + half))
    assert f["k_scale"].tolist() == [g.page_bytes + H * N * half + row * S + s for s in range(S)]
    v_scales = g.page_bytes + g.side_bytes + H * N * half  # slot 5, scales 0..3 → rows 4..7, column 1
    assert f["v_scale"].tolist() == [v_scales + ((1 * N + r) if order == "HND" else (r * H + 1)) * S + 1 for r in (4, 5, 6, 7)]
    assert QL.coordinates_of(g, int(f["v_scale"][2])) == {"layer": 0, "block": 1, "slot": 5, "head": 1, "field": "v_scale", "byte": 2}


@pytest.mark.parametrize("order", QL.ORDERS)
def test_a_head_slice_is_four_runs_per_block_in_hnd_and_per_slot_in_nhd(order):
    g = geometry(order, num_kv_heads=4, num_layers=2)
    runs = QL.head_slice_ranges(g, [0, 2], range(1, 3))
    assert len(runs) == 2 * 2 * 4 * (1 if order == "HND" else g.block_size)
    got = torch.cat([torch.arange(s, s + n) for s, n in runs]).sort().values
    want = torch.cat([f.flatten() for layer in range(2) for f in QL.field_offsets(
        g, torch.tensor([0, 2])[:, None, None], torch.arange(g.block_size)[:, None], torch.arange(1, 3), layer).values()])
    assert torch.equal(got, want.sort().values)


def stored_row_copy(src, src_g, dst, dst_g, src_table, dst_table, tokens):
    """Re-blocking that moves V's scales as stored bytes: slot t's row of the swizzled plane (the
    positions K's linear scales take, one side on)."""
    t = torch.arange(tokens)
    ends = [QL.field_offsets(g, torch.tensor(table)[t // g.block_size][:, None], (t % g.block_size)[:, None], torch.arange(g.num_kv_heads))
            for g, table in ((src_g, src_table), (dst_g, dst_table))]
    for name in ("k_data", "k_scale", "v_data"):
        dst[ends[1][name].flatten()] = src[ends[0][name].flatten()]
    dst[(ends[1]["k_scale"] + dst_g.side_bytes).flatten()] = src[(ends[0]["k_scale"] + src_g.side_bytes).flatten()]


@pytest.mark.parametrize("order", QL.ORDERS)
def test_whole_swizzle_tiles_survive_re_blocking_as_bytes_but_a_partial_tile_does_not(order):
    """The swizzle depends on the slot through t/4 and t mod 4 only, not on the block size
    (SPEC NVFP4-REBLOCK): 16 tokens re-blocked 8 → 16 by stored rows are right, 13 are not."""
    src_g, dst_g = geometry(order, block_size=8), geometry(order, block_size=16, num_blocks=2)
    src = torch.randint(0, 256, (src_g.nbytes(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    for tokens, same in ((16, True), (13, False)):
        want, got = torch.zeros(dst_g.nbytes(), dtype=torch.uint8), torch.zeros(dst_g.nbytes(), dtype=torch.uint8)
        QC.reblock(src, src_g, want, dst_g, [2, 0], [1], tokens)
        stored_row_copy(src, src_g, got, dst_g, [2, 0], [1], tokens)
        assert torch.equal(want, got) is same, tokens


def test_geometries_the_swizzle_cannot_tile_are_refused():
    for block_size, head_size in ((6, 64), (8, 32), (8, 80)):
        with pytest.raises(ValueError, match="nvfp4 needs"):
            geometry("HND", block_size=block_size, head_size=head_size)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM's nvfp4 page views, its test dequantiser and its quantiser's torch reference, loaded without vLLM."""
    src = vllm_sdist.read_sources(vllm_sdist.sdist(tmp_path_factory), (FLASHINFER, TORCH_UTILS, TEST_UTILS, TEST_QUANT))
    text = "\n\n".join((STAND_INS, vllm_sdist.definitions(src[TORCH_UTILS], "nvfp4_kv_cache_full_dim", "nvfp4_split_data_scale"),
                        vllm_sdist.definitions(src[FLASHINFER], "_nvfp4_kv_views"),
                        vllm_sdist.definitions(src[TEST_UTILS], "kE2M1ToFloat", "break_fp4_bytes", "dequant_nvfp4_kv_cache"),
                        vllm_sdist.definitions(src[TEST_QUANT], "BLOCK_SIZE", "cast_to_fp4", "get_reciprocal", "ref_nvfp4_quant")))
    return vllm_sdist.load_module(tmp_path_factory.mktemp("vllm_nvfp4"), "vllm_nvfp4_extract", text)


def vllm_logical_cache(g, region):
    """The ``(B, 2H, N, C)`` uint8 tensor vLLM allocates for one layer, in ``g.order``'s strides."""
    return torch.as_strided(region, g.shape(), g.strides())


@pytest.mark.parametrize("order", QL.ORDERS)
def test_vllm_page_views_address_the_reference_bytes(vllm, order):
    g = geometry(order)
    (k_data, v_data), (k_scale, v_scale), layout = vllm._nvfp4_kv_views(vllm_logical_cache(g, torch.zeros(g.nbytes(), dtype=torch.uint8)), g.num_kv_heads)
    assert layout == order
    b, t, h = torch.meshgrid(torch.arange(g.num_blocks), torch.arange(g.block_size), torch.arange(g.num_kv_heads), indexing="ij")
    ours = QL.field_offsets(g, b, t, h)
    for name, view, n in (("k_data", k_data, g.head_size // 2), ("v_data", v_data, g.head_size // 2), ("k_scale", k_scale, g.head_size // 16)):
        idx = (b, h, t) if order == "HND" else (b, t, h)
        theirs = sum(i[..., None] * st for i, st in zip(idx, view.stride())) + torch.arange(n) + view.storage_offset()
        assert torch.equal(theirs, ours[name]), name
    # vLLM views V's scale region linearly, like K's: the swizzle inside it is the writer's and reader's
    v_linear = sum(i[..., None] * st for i, st in zip((b, h, t) if order == "HND" else (b, t, h), v_scale.stride())) + torch.arange(g.head_size // 16)
    assert torch.equal(v_linear + v_scale.storage_offset(), ours["k_scale"] + g.side_bytes)
    assert torch.equal(ours["v_scale"].flatten().sort().values, (ours["k_scale"] + g.side_bytes).flatten().sort().values)


@pytest.mark.parametrize("order", QL.ORDERS)
def test_vllm_test_dequantiser_reads_what_the_reference_wrote(vllm, order):
    """Nibble order, scale placement and V's swizzle together: vLLM's ``dequant_nvfp4_kv_cache``
    (K linear, V swizzled) over vLLM's views equals the reference's own decode, exactly."""
    g = geometry(order, num_kv_heads=3, head_size=128)
    slots = torch.arange(g.num_blocks * g.block_size)
    gen = torch.Generator().manual_seed(3)
    key, value = ((torch.randn(len(slots), g.num_kv_heads, g.head_size, generator=gen) * 4).bfloat16() for _ in range(2))
    region = torch.zeros(g.nbytes(), dtype=torch.uint8)
    QC.write(key, value, region, g, slots, k_scale=0.75, v_scale=1.25)
    (k_data, v_data), (k_scale, v_scale), _ = vllm._nvfp4_kv_views(vllm_logical_cache(g, region), g.num_kv_heads)
    to_hnd = (lambda x: x) if order == "HND" else (lambda x: x.permute(0, 2, 1, 3))
    table = torch.arange(g.num_blocks)[None, :]
    ours_k, ours_v, _ = QC.dequantised_kv(region, g, table, torch.tensor([len(slots)]), k_scale=0.75, v_scale=1.25)
    for data, scale, checkpoint, swizzled, ours in ((k_data, k_scale, 0.75, False, ours_k), (v_data, v_scale, 1.25, True, ours_v)):
        theirs = vllm.dequant_nvfp4_kv_cache(to_hnd(data), to_hnd(scale), checkpoint, g.head_size, g.block_size, swizzled_scales=swizzled)
        assert torch.equal(theirs.permute(0, 2, 1, 3).reshape(1, -1, g.num_kv_heads, g.head_size), ours), "swizzled V" if swizzled else "linear K"


@pytest.mark.parametrize("k_scale", [1.0, 0.75, 0.01])
def test_the_encoder_equals_vllms_torch_reference_of_its_quantiser(vllm, k_scale):
    """``ref_nvfp4_quant`` (tests/kernels/quantization/test_nvfp4_quant.py: the same two-level
    scale, e2m1 by thresholds) gives the reference's e2m1 values and e4m3 scales, ties included."""
    x = (torch.randn(64, 128, generator=torch.Generator().manual_seed(5)) * 3).bfloat16()
    x[0, :16] = torch.tensor([6.0, -6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -1.25, -3.5, -5.0, -0.1, 0.0])
    x[1, :16] = torch.linspace(-6.375, 6.375, 16)  # amax / 6 = 1.0625: an e4m3 tie
    data, sf = QC.nvfp4_encode(x, k_scale)
    values, scales = vllm.ref_nvfp4_quant(x, torch.tensor(1.0) / torch.tensor(k_scale, dtype=torch.float32))
    assert torch.equal(sf.view(torch.float8_e4m3fn).float(), scales)
    assert torch.equal(QC.e2m1_values(QC.unpack_nibbles(data)), values)
