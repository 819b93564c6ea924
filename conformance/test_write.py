"""Check 3 — ``reshape_and_cache`` writes every element where the reference offset map says,
and nothing else changes: not other slots, blocks or the other plane, not padding, not the
guard bytes before and after the cache (LAYOUT_SPEC §B.1–§B.4)."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .assertions import assert_bytes_equal
from .harness import FP8_KV_CACHE_DTYPES, fp8_edge_rows, token_rows
from . import ops
from .ops import run_write, synchronize
from .strategies import specs, write_cases

pytestmark = [pytest.mark.write, pytest.mark.kvc_op("write")]


def write_and_compare(case, spec, key, value, slots, k_scale, v_scale, note=""):
    ops.write_and_compare(case, "write", spec, key, value, slots, k_scale, v_scale, note)


@given(data=st.data())
def test_written_elements_land_at_reference_offsets_and_nothing_else_changes(case, data):
    w = data.draw(write_cases(case))
    key, value = token_rows(w.spec, len(w.slot_mapping) + w.extra_rows, w.seed)
    write_and_compare(case, w.spec, key, value, w.slot_mapping, w.k_scale, w.v_scale)


def test_padding_slots_leave_cache_untouched(case):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 4, case.seed)
    slots = torch.full((4,), -1, dtype=torch.int64)
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "all slots are -1")


def test_key_rows_beyond_slot_mapping_are_ignored(case):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 9, case.seed)
    slots = torch.tensor([2 * spec.geometry.block_size + 1, 5 * spec.geometry.block_size - 1, -1])
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "9 key rows, 3 slots")


@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous-rows", "qkv-rows"])
def test_key_value_rows_are_read_through_their_row_stride(case, contiguous):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 6, case.seed, contiguous=contiguous)
    slots = torch.arange(6) * 3 + 2 * spec.geometry.block_size
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1))


@pytest.mark.kvc_needs("single_kv_head")
def test_single_kv_head_with_degenerate_head_stride_is_written(case):
    spec = case.spec(case.geometry(num_kv_heads=1))
    key, value = token_rows(spec, 5, case.seed, contiguous=True)
    D = spec.geometry.head_size
    key, value = (t.as_strided(t.shape, (D, 1, 1)) for t in (key, value))  # size-1 head dim, stride 1 (F.4)
    slots = torch.tensor([3, 2 * spec.geometry.block_size, 4 * spec.geometry.block_size + 2, -1, 7])
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "H=1, head stride 1")


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_int32_and_int64_slot_mappings_write_the_same_bytes(case, slot_dtype):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 5, case.seed)
    slots = (torch.arange(5) * 5 + spec.geometry.block_size * 2).to(slot_dtype)
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), f"slot_mapping {slot_dtype}")


@pytest.mark.kvc_needs("fp8")
@given(data=st.data())
def test_fp8_codes_equal_the_reference_encoder_for_edge_values(case, data):
    spec = data.draw(specs(case, FP8_KV_CACHE_DTYPES))
    k_scale, v_scale = torch.tensor([0.5]), torch.tensor([4.0])  # powers of two: ties survive x / scale
    key, value = fp8_edge_rows(spec, 8, case.seed, float(k_scale), float(v_scale))
    slots = torch.arange(8) * 2 + spec.geometry.block_size * 2
    write_and_compare(case, spec, key, value, slots, k_scale, v_scale, "fp8 −0, ±max, beyond max, ties")


@pytest.mark.kvc_needs("memory_2_31")
def test_last_block_of_a_cache_past_2_31_elements_is_written(case):
    caps = case.backend.capabilities
    kv_dtype = next((d for d in FP8_KV_CACHE_DTYPES if d in caps.kv_cache_dtypes), "auto")  # 1-byte elements: half the memory
    probe = case.geometry(kv_cache_dtype=kv_dtype, num_blocks=1, head_size=max(caps.head_sizes), num_kv_heads=max(caps.num_kv_heads))
    per_block = 2 * probe.block_size * probe.num_kv_heads * probe.head_size
    g = dataclasses.replace(probe, num_blocks=(1 << 31) // per_block + 2)  # offsets of the last block exceed int32
    spec = case.spec(g, kv_dtype, caps.dtypes[0])
    last = g.num_blocks - 1
    slots = torch.tensor([last * g.block_size + g.block_size - 1, last * g.block_size, g.block_size + 3, -1])
    key, value = token_rows(spec, 4, case.seed)
    arena = case.allocate(spec)
    expected = run_write(case, arena, key, value, slots, torch.tensor([0.5]), torch.tensor([0.5]), on_device=True)
    synchronize(case)
    assert_bytes_equal("write", case, expected, arena, f"{g.num_blocks} blocks, last block at element {last * per_block} > 2^31")
