"""Check 3 — ``reshape_and_cache`` writes every element where the reference offset map says,
and nothing else changes: not other slots, blocks, layers or the other plane, not padding, not
the guard bytes before and after the cache (SPEC §4 WRITE-*, §5 FP8-*, §9 ADDR-*)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from .harness import ops
from .harness.big_caches import assert_arenas_equal, expected_arena, probe_arena, probe_geometry
from .harness.case import fixed_scales, fp8_edge_rows, token_rows
from .harness.ops import backend_write, reference_write, synchronize
from .harness.strategies import write_cases

pytestmark = [pytest.mark.write, pytest.mark.kvc_op("write")]
LAYOUTS = ("LAYOUT-OFFSET", "LAYOUT-E1", "LAYOUT-E0", "LAYOUT-LEGACY", "LAYOUT-SHUFFLE", "LAYOUT-SHUFFLE-X", "LAYOUT-SHUFFLE-BASE", "LAYOUT-E3")
NEAR = 2.0**-20  # near-ties: a scale off a power of two by this much moves exact ties of x to tie·(1 ± 2^-20)


def write_and_compare(case, spec, key, value, slots, k_scale, v_scale, note=""):
    ops.write_and_compare(case, "write", spec, key, value, slots, k_scale, v_scale, note)


@pytest.mark.kvc_clause("WRITE-SLOT", "WRITE-ONLY-TARGET", "WRITE-PAD-1", "WRITE-TOKENS", "WRITE-SLOT-DTYPE", "FP8-ENCODE", "FP8-SCALE", "OP-INPUTS-UNCHANGED", *LAYOUTS)
@given(data=st.data())
def test_written_elements_land_at_reference_offsets_and_nothing_else_changes(case, data):
    w = data.draw(write_cases(case))
    key, value = token_rows(w.spec, len(w.slot_mapping) + w.extra_rows, w.seed)
    write_and_compare(case, w.spec, key, value, w.slot_mapping, w.k_scale, w.v_scale)


@pytest.mark.kvc_clause("WRITE-SLOT", "WRITE-ONLY-TARGET", "FP8-FORMAT", "FP8-ENCODE", *LAYOUTS)
def test_each_declared_cache_dtype_is_written_at_reference_offsets(case, cache_dtype):
    spec = case.spec_for(cache_dtype, num_blocks=5)
    N = spec.geometry.block_size
    slots = torch.tensor([2 * N, 3 * N - 1, 4 * N + 1, -1, 5 * N - 2])
    key, value = token_rows(spec, len(slots), case.seed)
    write_and_compare(case, spec, key, value, slots, *fixed_scales(), cache_dtype.label)


@pytest.mark.kvc_clause("WRITE-SLOT", "WRITE-ONLY-TARGET", "WRITE-LAYER", *LAYOUTS)
def test_each_declared_size_class_is_written_at_reference_offsets(case, size_class):
    g = case.geometry(num_blocks=5, **size_class.kwargs())
    spec = case.spec(g, layer=g.num_layers - 1)  # the last layer of a multi-layer cache
    N = g.block_size
    slots = torch.tensor([2 * N, 3 * N - 1, 3 * N + N // 2, -1, 5 * N - 1])
    key, value = token_rows(spec, len(slots), case.seed)
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), f"{size_class.name}: {g.short()}, layer {spec.layer}")


@pytest.mark.kvc_clause("WRITE-PAD-1", "WRITE-ONLY-TARGET")
@pytest.mark.kvc_needs("padding_slots")
def test_padding_slots_leave_cache_untouched(case):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 4, case.seed)
    slots = torch.full((4,), -1, dtype=torch.int64)
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "all slots are -1")


@pytest.mark.kvc_clause("WRITE-TOKENS")
def test_key_rows_beyond_slot_mapping_are_ignored(case):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 9, case.seed)
    slots = torch.tensor([2 * spec.geometry.block_size + 1, 5 * spec.geometry.block_size - 1, -1])
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "9 key rows, 3 slots")


@pytest.mark.kvc_clause("WRITE-SOURCE-STRIDE")
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous-rows", "qkv-rows"])
def test_key_value_rows_are_read_through_their_row_stride(case, contiguous):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 6, case.seed, contiguous=contiguous)
    slots = torch.arange(6) * 3 + 2 * spec.geometry.block_size
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1))


@pytest.mark.kvc_clause("WRITE-SINGLE-HEAD")
@pytest.mark.kvc_needs("single_kv_head")
def test_single_kv_head_with_degenerate_head_stride_is_written(case):
    spec = case.spec(case.geometry(num_kv_heads=1))
    key, value = token_rows(spec, 5, case.seed, contiguous=True)
    D = spec.geometry.head_size
    key, value = (t.as_strided(t.shape, (D, 1, 1)) for t in (key, value))  # size-1 head dim, stride 1 (F.4)
    slots = torch.tensor([3, 2 * spec.geometry.block_size, 4 * spec.geometry.block_size + 2, -1, 7])
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), "H=1, head stride 1")


@pytest.mark.kvc_clause("WRITE-SLOT-DTYPE")
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
def test_int32_and_int64_slot_mappings_write_the_same_bytes(case, slot_dtype):
    spec = case.spec(case.geometry())
    key, value = token_rows(spec, 5, case.seed)
    slots = (torch.arange(5) * 5 + spec.geometry.block_size * 2).to(slot_dtype)
    write_and_compare(case, spec, key, value, slots, torch.ones(1), torch.ones(1), f"slot_mapping {slot_dtype}")


@pytest.mark.kvc_clause("FP8-ENCODE", "FP8-SATURATE", "FP8-NEG-ZERO", "FP8-NAN", "FP8-SCALE", "FP8-FORMAT")
@pytest.mark.parametrize("ties", ["exact-ties", "near-ties"])
def test_fp8_codes_equal_the_reference_encoder_for_edge_values(case, fp8_cache_dtype, ties):
    spec = case.spec_for(fp8_cache_dtype)
    # Powers of two keep x / scale exact, so exact ties stay ties; scales off by 2^-20 turn them into near-ties.
    k_scale, v_scale = (0.5, 4.0) if ties == "exact-ties" else (0.5 * (1 - NEAR), 4.0 * (1 + NEAR))
    key, value = fp8_edge_rows(spec, 8, case.seed, 0.5, 4.0)
    slots = torch.arange(8) * 2 + spec.geometry.block_size * 2
    write_and_compare(case, spec, key, value, slots, torch.tensor([k_scale]), torch.tensor([v_scale]),
                      f"fp8 ±0, −0 rounding, NaN, ±max, beyond max, {ties}")


@pytest.mark.kvc_clause("ADDR-64BIT", "ADDR-BLOCK-ID", "WRITE-ONLY-TARGET")
@pytest.mark.kvc_needs("memory_2_31")
def test_last_block_of_a_cache_past_2_31_elements_is_written(case):
    g, kv_cache_dtype = probe_geometry(case)
    spec = case.spec(g, kv_cache_dtype)
    last, N = g.num_blocks - 1, g.block_size
    slots = ops.declared_slots(case, torch.tensor([last * N + N - 1, last * N, N + 3, -1]))
    key, value = token_rows(spec, 4, case.seed)
    arena = probe_arena(case, spec)
    expected = expected_arena(arena)
    reference_write(case, expected, key, value, slots, *fixed_scales())
    backend_write(case, arena, key, value, slots, *fixed_scales())
    synchronize(case)
    first_element = int(spec.layout.offsets(g, block=last))
    assert_arenas_equal("write", case, expected, arena, f"{g.num_blocks} blocks, last block at element {first_element} > 2^31")
