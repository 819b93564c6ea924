"""Reference latent caches (SPEC §17) equal a brute-force per-token oracle typed out from the clauses."""

import functools
import math
import struct

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from . import oracle

L = R.latent
FORMATS = {
    f.label(): f for f in (
        L.LatentFormat(kind="mla"),
        L.LatentFormat(kind="mla", kv_lora_rank=32, rope_dim=8, model_dtype=torch.float16),
        L.LatentFormat(kind="mla", kv_lora_rank=32, rope_dim=8, cache_dtype="fp8"),
        L.LatentFormat(kind="mla", kv_lora_rank=32, rope_dim=8, cache_dtype="fp8_e5m2"),
        L.LatentFormat(kind="mla", kv_lora_rank=32, rope_dim=8, cache_dtype="fp8", platform="rocm", arch="gfx942"),
        L.LatentFormat(kind="fp8_ds_mla"),
        L.LatentFormat(kind="fp8_ds_mla", model_dtype=torch.float16, platform="rocm", arch="gfx942"),
        L.LatentFormat(kind="indexer"),
        L.LatentFormat(kind="indexer", scale_format="ue8m0", platform="rocm", arch="gfx942"),
        L.LatentFormat(kind="indexer", scale_format="mx"),
        L.LatentFormat(kind="indexer", kv_lora_rank=256, scale_format="ue8m0"),
        L.LatentFormat(kind="indexer", platform="rocm", arch="gfx942", indexer_layout="shuffle"),
    )
}


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


@functools.cache
def encode(value: float, fmt: str) -> int:
    return oracle.fp8_encode(value, fmt)


def oracle_scale(amax: float, fmt) -> float:
    """SPEC DSMLA-SCALE / IDX-SCALE for 0.33.0, in doubles rounded to float32 at each kernel step."""
    divisor = 224.0 if fmt.platform == "rocm" and "gfx942" in fmt.arch else 448.0
    if fmt.kind == "fp8_ds_mla":
        scale = max(f32(amax / divisor), f32(1e-4))
    else:
        scale = f32(max(amax, f32(1e-4)) / divisor)
    pow2 = fmt.kind == "fp8_ds_mla" or fmt.scale_format != "float32"
    return 2.0 ** math.ceil(math.log2(scale)) if pow2 else scale


def oracle_token_bytes(fmt, kv_c_row, k_pe_row, scale=1.0) -> bytes:
    """One token's bytes in record order (indexer: values then scale bytes), value by value."""
    e4m3 = fmt.e4m3.name
    if fmt.kind == "mla":
        row = list(kv_c_row.float().tolist()) + list(k_pe_row.float().tolist())
        if fmt.cache_dtype == "auto":
            return torch.cat([kv_c_row, k_pe_row]).contiguous().view(torch.uint8).numpy().tobytes()
        name = e4m3 if fmt.cache_dtype != "fp8_e5m2" else "float8_e5m2"
        return bytes(encode(f32(v / scale), name) for v in row)
    group = 128
    values, scales = [], []
    row = kv_c_row.float().tolist()
    for start in range(0, len(row), group):
        tile = row[start:start + group]
        s = oracle_scale(max(abs(v) for v in tile), fmt)
        scales.append(s)
        values += [encode(f32(v / s), e4m3) for v in tile]
    if fmt.kind == "fp8_ds_mla":
        return bytes(values) + struct.pack("<4f", *scales) + k_pe_row.contiguous().view(torch.uint8).numpy().tobytes()
    if fmt.scale_format == "mx":
        return bytes(values) + bytes(int(math.log2(s)) + 127 for s in scales for _ in range(4))  # UE8M0 of 2^k: k + 127
    return bytes(values) + b"".join(struct.pack("<f", s) for s in scales)


def oracle_token_offsets(geom, layer, block, row) -> list[int]:
    """Byte offsets of one token, typed out from IDX-LAYOUT / DSMLA-RECORD / MLA-SHAPE."""
    W, N, B = geom.fmt.entry_bytes(), geom.block_size, geom.num_blocks
    base = (layer * B + block) * N * W
    if geom.fmt.kind != "indexer":
        return [base + row * W + j for j in range(W)]
    D = geom.fmt.kv_lora_rank
    if geom.fmt.indexer_layout == "shuffle" and N > 1:  # 16 rows x 16 bytes per tile, tiles row-group-major
        values = [base + (row // 16) * 16 * D + (j // 16) * 256 + (row % 16) * 16 + j % 16 for j in range(D)]
    else:
        values = [base + row * D + j for j in range(D)]
    return values + [base + N * D + row * (D // 32) + j for j in range(D // 32)]


def inputs(fmt, tokens, extra=0, seed=0, magnitude=3.0):
    """kv_c and k_pe as strided slices of one projection output (vLLM splits one matmul's output)."""
    gen = torch.Generator().manual_seed(seed)
    out = (torch.randn(tokens + extra, fmt.width() + 5, generator=gen) * magnitude).to(fmt.model_dtype)
    return out[:, :fmt.kv_lora_rank], out[:, fmt.kv_lora_rank:fmt.width()]


def write(fmt, geom, region, kv_c, k_pe, slots, layer=0, scale=0.25):
    if fmt.kind == "mla":
        L.concat_and_cache_mla(kv_c, k_pe, region, geom, slots, scale=torch.tensor([scale]), layer=layer)
    elif fmt.kind == "fp8_ds_mla":
        L.concat_and_cache_ds_mla(kv_c, k_pe, region, geom, slots, layer=layer)
    else:
        L.indexer_k_quant_and_cache(kv_c[:slots.numel()], region, geom, slots, layer=layer)


def block_sizes(fmt):
    return [1, 16, 32] if fmt.indexer_layout == "shuffle" else [1, 2, 16]  # shuffled tiles hold 16 rows


@st.composite
def cases(draw, formats=tuple(FORMATS)):
    fmt = FORMATS[draw(st.sampled_from(formats), label="format")]
    geom = L.LatentGeometry(num_blocks=draw(st.integers(1, 3)), block_size=draw(st.sampled_from(block_sizes(fmt))), fmt=fmt,
                            num_layers=draw(st.integers(1, 2)))
    capacity = geom.num_blocks * geom.block_size
    slots = draw(st.lists(st.integers(0, capacity - 1), unique=True, min_size=1, max_size=min(3, capacity)), label="slots")
    pads = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)), label="padding")
    slots = torch.tensor([-1 if p else s for s, p in zip(slots, pads)], dtype=draw(st.sampled_from([torch.int32, torch.int64])))
    return geom, slots, draw(st.integers(0, geom.num_layers - 1), label="layer")


@given(cases())
def test_field_offsets_are_the_typed_out_formula_injective_and_inside_the_allocation(case):
    geom, _, layer = case
    blocks = torch.arange(geom.num_blocks).repeat_interleave(geom.block_size)
    rows = torch.arange(geom.block_size).repeat(geom.num_blocks)
    offsets = L.record_offsets(geom, blocks, rows, layer)
    expected = [oracle_token_offsets(geom, layer, b, r) for b, r in zip(blocks.tolist(), rows.tolist())]
    assert offsets.tolist() == expected
    assert offsets.unique().numel() == offsets.numel() == geom.layer_bytes()
    assert 0 <= int(offsets.min()) and int(offsets.max()) < geom.nbytes()


@given(cases())
def test_coordinates_of_inverts_field_offsets(case):
    geom, _, layer = case
    blocks, rows = torch.tensor([geom.num_blocks - 1]), torch.tensor([geom.block_size - 1])
    for field, offsets in L.field_offsets(geom, blocks, rows, layer).items():
        found = L.coordinates_of(geom, offsets[0])
        assert set(found["field"]) == {field}
        assert found["layer"].unique().tolist() == [layer] and found["block"].unique().tolist() == blocks.tolist()
        assert found["row"].unique().tolist() == rows.tolist() and found["byte"].tolist() == list(range(offsets.shape[1]))


@given(cases(), st.integers(0, 2))
def test_writers_store_each_token_as_the_oracle_and_touch_nothing_else(case, extra_rows):
    geom, slots, layer = case
    fmt = geom.fmt
    region = torch.randint(0, 256, (geom.nbytes(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    expected = region.clone()
    kv_c, k_pe = inputs(fmt, slots.numel(), extra_rows if fmt.kind != "indexer" else 0)
    write(fmt, geom, region, kv_c, k_pe, slots, layer)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            offsets = oracle_token_offsets(geom, layer, *divmod(slot, geom.block_size))
            expected[offsets] = torch.tensor(list(oracle_token_bytes(fmt, kv_c[t], k_pe[t], 0.25)), dtype=torch.uint8)
    assert_bytes_equal("writer", geom, region, expected)


def assert_bytes_equal(what, geom, actual, expected):
    wrong = torch.nonzero(actual != expected).flatten()
    if wrong.numel():
        at = {k: (v[0] if isinstance(v, list) else int(v[0])) for k, v in L.coordinates_of(geom, wrong[:1]).items()}
        raise AssertionError(f"{what} [{geom.short()}]: {wrong.numel()} bytes differ, first at {at}: "
                             f"expected {int(expected[wrong[0]]):#04x}, got {int(actual[wrong[0]]):#04x}")


@pytest.mark.parametrize("label", ["fp8_ds_mla-bf16", "fp8_ds_mla-fp16-fnuz"])
def test_ds_mla_tile_edge_values_follow_the_scale_policy(label):
    fmt = FORMATS[label]
    geom = L.LatentGeometry(num_blocks=1, block_size=1, fmt=fmt)
    top = 224.0 if fmt.arch == "gfx942" else 448.0
    kv_c = torch.cat([torch.zeros(128), torch.full((128,), top), torch.full((128,), -top), torch.linspace(-1.5 * top, 0, 128)])
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    L.concat_and_cache_ds_mla(kv_c[None].to(fmt.model_dtype), torch.ones(1, 64, dtype=fmt.model_dtype), region, geom, torch.tensor([0]))
    codes, scales, _ = L.ds_mla_fields(region)
    assert scales[0].tolist() == [2.0 ** -13, 1.0, 1.0, 2.0]  # floor 1e-4 rounds up to 2^-13; 1.5·max/divisor up to 2
    assert codes[0, :128].unique().tolist() == [0]
    assert codes[0, 128:256].unique().tolist() == [encode(top, fmt.e4m3.name)]
    assert codes[0, 256:384].unique().tolist() == [encode(-top, fmt.e4m3.name)]


@pytest.mark.parametrize("scale_format, expected", [("float32", f32(f32(1e-4) / 448)), ("ue8m0", 2.0 ** -22)])
def test_indexer_floor_applies_to_amax_before_the_divisor(scale_format, expected):
    geom = L.LatentGeometry(num_blocks=1, block_size=2, fmt=L.LatentFormat(kind="indexer", scale_format=scale_format))
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    L.indexer_k_quant_and_cache(torch.zeros(1, 128, dtype=torch.bfloat16), region, geom, torch.tensor([1]))
    scale_bytes = region[2 * 128 + 4:2 * 128 + 8]  # row 1's scale, after both rows' values
    assert scale_bytes.view(torch.float32).item() == expected


@given(cases())
def test_gather_returns_what_was_written(case):
    geom, slots, layer = case
    fmt = geom.fmt
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    kv_c, k_pe = inputs(fmt, slots.numel())
    write(fmt, geom, region, kv_c, k_pe, slots, layer)
    block_table = torch.arange(geom.num_blocks, dtype=torch.int32).flip(0)[None]
    seq_lens = torch.tensor([geom.num_blocks * geom.block_size])
    position = lambda slot: (geom.num_blocks - 1 - slot // geom.block_size) * geom.block_size + slot % geom.block_size
    kept = [(t, position(s)) for t, s in enumerate(slots.tolist()) if s >= 0]
    if fmt.kind == "indexer":
        values, scale_bytes = L.gather_indexer(region, geom, block_table, seq_lens, layer)
        for t, p in kept:
            assert bytes(values[p].tolist()) + bytes(scale_bytes[p].tolist()) == oracle_token_bytes(fmt, kv_c[t], k_pe[t])
        return
    latent = L.gather_latent(region, geom, block_table, seq_lens, scale=torch.tensor(0.25), layer=layer)
    for t, p in kept:
        stored = torch.tensor(list(oracle_token_bytes(fmt, kv_c[t], k_pe[t], 0.25)), dtype=torch.uint8)
        assert torch.equal(latent[p].view(torch.uint8), oracle_dequantized(fmt, stored).view(torch.uint8))


def oracle_dequantized(fmt, stored):
    """DSMLA-UPCONVERT / LATENT-GATHER of one token's stored bytes, value by value."""
    if fmt.cache_dtype == "auto":
        return stored.view(fmt.model_dtype)
    if fmt.kind == "mla":
        name = fmt.e4m3.name if fmt.cache_dtype != "fp8_e5m2" else "float8_e5m2"
        return torch.tensor([f32(oracle.fp8_decode(c, name) * 0.25) for c in stored.tolist()]).to(fmt.model_dtype)
    scales = struct.unpack("<4f", bytes(stored[512:528].tolist()))
    nope = [f32(oracle.fp8_decode(c, fmt.e4m3.name) * scales[i // 128]) for i, c in enumerate(stored[:512].tolist())]
    return torch.cat([torch.tensor(nope).to(fmt.model_dtype), stored[528:].view(fmt.model_dtype)])


@pytest.mark.parametrize("label", ["mla-576-bf16", "mla-32+8-fp8", "fp8_ds_mla-bf16"])
def test_mla_decode_equals_sdpa_on_the_dense_gathered_latent(label):
    fmt = FORMATS[label]
    geom = L.LatentGeometry(num_blocks=6, block_size=4, fmt=fmt)
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    kv_c, k_pe = inputs(fmt, 24)
    write(fmt, geom, region, kv_c, k_pe, torch.randperm(24, generator=torch.Generator().manual_seed(2)))
    block_table, seq_lens = torch.tensor([[5, 0, 3], [1, 2, 4]]), torch.tensor([9, 12])
    query = torch.randn(2, 3, fmt.width(), generator=torch.Generator().manual_seed(3)).to(fmt.model_dtype)
    out = L.mla_decode(query, region, geom, block_table, seq_lens, scale=torch.tensor(0.25), softmax_scale=0.1)
    latent = L.gather_latent(region, geom, block_table, seq_lens, scale=torch.tensor(0.25)).float()
    for s, (start, n) in enumerate([(0, 9), (9, 12)]):
        k = latent[start:start + n][None]
        sdpa = torch.nn.functional.scaled_dot_product_attention(query[s].float()[:, None], k, k[..., :fmt.kv_lora_rank], scale=0.1)
        torch.testing.assert_close(out[s].float(), sdpa[:, 0].to(fmt.model_dtype).float(), rtol=0.02, atol=0.02)


@pytest.mark.parametrize("label", ["mla-576-bf16", "fp8_ds_mla-bf16", "indexer-128-float32"])
def test_copy_and_swap_move_whole_blocks_with_their_indexer_pages(label):
    geom = L.LatentGeometry(num_blocks=4, block_size=2, fmt=FORMATS[label], num_layers=2)
    region = torch.randint(0, 256, (geom.nbytes(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    before = region.clone().view(2, 4, geom.block_bytes())
    L.copy_latent_blocks(region, geom, torch.tensor([[0, 3], [3, 1]]))  # sources read before writes
    after = region.view(2, 4, geom.block_bytes())
    assert torch.equal(after[:, 3], before[:, 0]) and torch.equal(after[:, 1], before[:, 3])
    assert torch.equal(after[:, [0, 2]], before[:, [0, 2]])
    host = torch.zeros_like(region)
    L.swap_latent_blocks(region, geom, host, geom, [1, 2], [0, 3])
    assert torch.equal(host.view(2, 4, -1)[:, [0, 3]], after[:, [1, 2]]) and not host.view(2, 4, -1)[:, [1, 2]].any()
    assert L.block_byte_ranges(geom, [2]) == [(2 * geom.block_bytes(), geom.block_bytes()), (6 * geom.block_bytes(), geom.block_bytes())]


@pytest.mark.parametrize("producer_tp, consumer_tp, expected", [(4, 2, [0, 2]), (2, 4, [0, 0, 1, 1]), (2, 2, [0, 1]), (8, 3, [0, 2, 5])])
def test_each_consumer_rank_pulls_every_block_from_one_producer_rank(producer_tp, consumer_tp, expected):
    for rank in range(consumer_tp):
        assert L.replicated_block_sources(producer_tp, consumer_tp, rank, [7, 0, 3]) == {7: expected[rank], 0: expected[rank], 3: expected[rank]}


def test_grouped_writer_equals_one_write_per_layer():
    fmt = FORMATS["mla-32+8-fp8"]
    geoms = [L.LatentGeometry(num_blocks=2, block_size=4, fmt=fmt)] * 3
    kv_c, k_pe = inputs(fmt, 15)
    kv_cs, k_pes = kv_c.reshape(3, 5, -1), k_pe.reshape(3, 5, -1)
    slots = torch.tensor([[0, 1, 2, 3, -1], [7, 6, 5, -1, 4], [3, 3 + 4, -1, -1, -1]])
    scales = torch.tensor([0.1, 0.2, 0.3])
    grouped, single = [[torch.zeros(geoms[0].nbytes(), dtype=torch.uint8) for _ in range(3)] for _ in range(2)]
    L.concat_and_cache_mla_grouped(kv_cs, k_pes, grouped, geoms, slots, scales=scales)
    for layer in range(3):
        L.concat_and_cache_mla(kv_cs[layer], k_pes[layer], single[layer], geoms[layer], slots[layer], scale=scales[layer])
        assert torch.equal(grouped[layer], single[layer])


def test_record_descriptor_tells_records_apart():
    descriptors = [L.record_descriptor(f) for f in FORMATS.values()]
    assert all(a != b for i, a in enumerate(descriptors) for b in descriptors[i + 1:])


GEOM = L.LatentGeometry(num_blocks=2, block_size=4, fmt=FORMATS["mla-32+8-fp8"])


@pytest.mark.parametrize("call, argument", [
    (lambda r: L.concat_and_cache_mla(torch.zeros(2, 31, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), r, GEOM, torch.tensor([0, 1]), scale=1.0), "kv_c"),
    (lambda r: L.concat_and_cache_mla(torch.zeros(2, 32), torch.zeros(2, 8), r, GEOM, torch.tensor([0, 1]), scale=1.0), "kv_c"),
    (lambda r: L.concat_and_cache_mla(torch.zeros(2, 32, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), r, GEOM, torch.tensor([0, 8]), scale=1.0), "slot_mapping"),
    (lambda r: L.concat_and_cache_mla(torch.zeros(2, 32, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), r[1:], GEOM, torch.tensor([0, 1]), scale=1.0), "region"),
    (lambda r: L.concat_and_cache_mla(torch.zeros(2, 32, dtype=torch.bfloat16), torch.zeros(2, 8, dtype=torch.bfloat16), r, GEOM, torch.tensor([0, 1]), scale=-1.0), "scale"),
    (lambda r: L.concat_and_cache_ds_mla(torch.zeros(1, 512), torch.zeros(1, 64), r, GEOM, torch.tensor([0])), "geom.fmt.kind"),
    (lambda r: L.gather_latent(r, GEOM, torch.tensor([[0]]), torch.tensor([5])), "seq_lens"),
    (lambda r: L.gather_latent(r, GEOM, torch.tensor([[2]]), torch.tensor([3])), "block_table"),
    (lambda r: L.LatentFormat(kind="fp8_ds_mla", kv_lora_rank=256), "fp8_ds_mla needs kv_lora_rank"),
    (lambda r: L.LatentFormat(kind="indexer", scale_format="mx", kv_lora_rank=256), "mx"),
    (lambda r: L.replicated_block_sources(2, 4, 4, [0]), "consumer_rank"),
])
def test_bad_input_is_a_value_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call(torch.zeros(GEOM.nbytes(), dtype=torch.uint8))
