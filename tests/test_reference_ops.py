"""Reference ops equal a brute-force loop over the spec formulas."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from . import oracle
from .strategies import geometries, slot_mappings

LAYOUTS = R.named_layouts()


def random_storage(layout, g, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (layout.nbytes(g),), dtype=torch.uint8, generator=gen)


def model_inputs(g, rows, seed=0, model_dtype=torch.bfloat16):
    """Key/value as non-contiguous rows of a qkv tensor, like vLLM's tests."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, 3, g.num_kv_heads, g.head_size, generator=gen) * 300
    dtype = model_dtype if g.dtype in R.fp8.FP8_DTYPES else g.dtype
    _, key, value = qkv.to(dtype).unbind(1)
    return key, value


def loop_write(key, value, storage, key_name, g, slots, k_scale, v_scale, layer=0):
    """One element at a time, addresses from the oracle."""
    bits = storage.view(R.bits_dtype(g.dtype))
    for t, s in enumerate(slots.tolist()):
        if s < 0:
            continue
        b, n = divmod(s, g.block_size)
        for kv, (src, scale) in enumerate(((key, k_scale), (value, v_scale))):
            for h in range(g.num_kv_heads):
                row = src[t, h]
                if g.dtype in R.fp8.FP8_DTYPES:
                    sc = scale if not torch.is_tensor(scale) or scale.numel() == 1 else scale[h]
                    codes = [oracle.fp8_encode(float(torch.tensor(float(v), dtype=torch.float32) / torch.tensor(float(sc), dtype=torch.float32)), str(g.dtype)[6:]) for v in row.float()]
                    row_bits = torch.tensor(codes, dtype=torch.uint8)
                else:
                    row_bits = row.contiguous().view(bits.dtype)
                for d in range(g.head_size):
                    bits[oracle.offset(key_name, g, layer, b, kv, n, h, d)] = row_bits[d]


@st.composite
def write_cases(draw, key):
    layout = LAYOUTS[key]
    g = draw(geometries(layout, max_blocks=4), label="geometry")
    slots = draw(slot_mappings(g, max_tokens=6), label="slot_mapping")
    extra_rows = draw(st.integers(0, 2), label="extra rows")
    per_head = draw(st.booleans(), label="per-head scales")
    if per_head:
        k_scale = torch.tensor(draw(st.lists(st.sampled_from([0.5, 1.0, 1.5, 3.0]), min_size=g.num_kv_heads, max_size=g.num_kv_heads)))
    else:
        k_scale = torch.tensor([1.5])
    return layout, g, slots, extra_rows, k_scale, torch.tensor([0.75])


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=st.data())
def test_reshape_and_cache_equals_the_loop_writer(key, data):
    layout, g, slots, extra_rows, k_scale, v_scale = data.draw(write_cases(key))
    layer = data.draw(st.integers(0, g.num_layers - 1), label="layer")
    key_rows, value_rows = model_inputs(g, len(slots) + extra_rows)
    got, want = random_storage(layout, g), random_storage(layout, g)
    R.reshape_and_cache(key_rows, value_rows, got, layout, g, slots, k_scale=k_scale, v_scale=v_scale, layer=layer)
    loop_write(key_rows, value_rows, want, key, g, slots, k_scale, v_scale, layer)
    assert torch.equal(got, want)


def test_padding_slots_write_nothing():
    g = R.Geometry(num_blocks=3, block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    layout = R.blocks_first()
    before = random_storage(layout, g)
    after = before.clone()
    key, value = model_inputs(g, 3)
    R.reshape_and_cache(key, value, after, layout, g, torch.tensor([-1, -1, -1]))
    assert torch.equal(before, after)


@pytest.mark.parametrize("slots, match", [([12], "slots >= num_blocks"), ([3, 3], "repeats"), ([[1]], "1-D")])
def test_bad_slot_mapping_is_rejected(slots, match):
    g = R.Geometry(num_blocks=3, block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    key, value = model_inputs(g, 2)
    with pytest.raises(ValueError, match=match):
        R.reshape_and_cache(key, value, random_storage(R.blocks_first(), g), R.blocks_first(), g, torch.tensor(slots))


@pytest.mark.parametrize("src_key, dst_key", [("E1:NHD", "E1:NHD"), ("E1:NHD", "E1:HND"), ("E0:NHD", "AITER:shuffle-blocks_first"), ("E3:BLNHC", "E3:LHBNC")])
@given(data=st.data())
def test_block_copies_move_whole_logical_blocks(src_key, dst_key, data):
    g = data.draw(geometries(LAYOUTS[dst_key], dtypes=(torch.bfloat16, torch.float8_e4m3fn)), label="geometry")
    ids = data.draw(st.permutations(range(g.num_blocks)), label="block order")
    pairs = data.draw(st.integers(1, g.num_blocks), label="pairs")
    src_ids, dst_ids = ids[:pairs], data.draw(st.permutations(range(g.num_blocks)))[:pairs]
    src_layout, dst_layout = LAYOUTS[src_key], LAYOUTS[dst_key]
    src, dst = random_storage(src_layout, g, 1), random_storage(dst_layout, g, 2)
    want = R.read_logical(dst, dst_layout, g).clone()
    want[:, dst_ids] = R.read_logical(src, src_layout, g)[:, src_ids]
    R.copy_blocks_between(src, src_layout, dst, dst_layout, g, src_ids, dst_ids)
    assert torch.equal(R.read_logical(dst, dst_layout, g).view(torch.uint8), want.view(torch.uint8))


def test_copy_blocks_reads_every_source_before_writing():
    g = R.Geometry(num_blocks=4, block_size=2, num_kv_heads=1, head_size=4, dtype=torch.float32)
    layout = R.blocks_first()
    storage = torch.arange(layout.numel(g), dtype=torch.float32)
    before = R.read_logical(storage, layout, g).clone()
    R.copy_blocks(storage, layout, g, torch.tensor([[2, 3], [3, 2]]))
    after = R.read_logical(storage, layout, g)
    assert torch.equal(after[:, 2], before[:, 3]) and torch.equal(after[:, 3], before[:, 2])


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=st.data())
def test_canonical_bytes_round_trip_between_layouts(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout), label="geometry")
    other = R.standardized("BHLNC") if g.num_layers > 1 else R.kv_first("HND")
    ids = data.draw(st.permutations(range(g.num_blocks)), label="blocks")
    src = random_storage(layout, g, 3)
    wire = R.canonical_block_bytes(src, layout, g, ids)
    dst = torch.zeros(other.nbytes(g), dtype=torch.uint8)
    R.place_canonical_block_bytes(dst, other, g, ids, wire)
    assert torch.equal(R.canonical_block_bytes(dst, other, g, ids), wire)
    assert torch.equal(R.read_logical(dst, other, g).view(torch.uint8), R.read_logical(src, layout, g).view(torch.uint8))


def test_canonical_bytes_are_k_then_v_per_layer_in_nhd_order():
    g = R.Geometry(num_blocks=2, block_size=2, num_kv_heads=2, head_size=2, dtype=torch.float32, num_layers=2)
    layout = R.standardized("LBHNC")
    storage = torch.arange(layout.numel(g), dtype=torch.float32)
    wire = R.canonical_block_bytes(storage, layout, g, [1]).view(torch.float32)
    # LBHNC, C = K‖V = 4 elements: sL = B·H·N·C = 32, sB = 16, sH = N·C = 8, sN = C = 4
    expected = [
        l * 32 + 16 + h * 8 + n * 4 + kv * 2 + d
        for l in range(2) for kv in range(2) for n in range(2) for h in range(2) for d in range(2)
    ]
    assert wire.flatten().tolist() == expected
