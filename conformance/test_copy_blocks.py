"""Check 6 — ``copy_blocks`` copies whole blocks (both planes, every slot, head, dim and layer)
for each ``[src, dst]`` pair and leaves every other byte alone (SPEC §7 COPY-WHOLE-BLOCK;
pitfall F.10)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from .harness.assertions import assert_bytes_equal
from .harness.big_caches import assert_arenas_equal, expected_arena, probe_arena, probe_geometry
from .harness.exercised import note_blocks
from .harness.case import token_rows
from .harness.ops import synchronize
from .harness.strategies import specs

pytestmark = [pytest.mark.copy, pytest.mark.kvc_op("copy")]


def copy_and_compare(case, spec, mapping, note=""):
    arena = case.allocate(spec)
    before, expected = arena.snapshot(), arena.snapshot()
    R.copy_blocks(expected.region, spec.layout, spec.geometry, mapping)
    note_blocks(case, spec, mapping)
    case.backend.copy_blocks(arena.cache, mapping.to(case.device), spec)
    assert_bytes_equal("copy", case, expected, arena, f"block_mapping {mapping.tolist()}{note}", initial=before)


@pytest.mark.kvc_clause("COPY-WHOLE-BLOCK")
def test_copy_blocks_copies_both_planes_of_every_slot(case, cache_dtype):
    spec = case.spec_for(cache_dtype, num_blocks=8)
    copy_and_compare(case, spec, torch.tensor([[2, 5], [7, 3], [4, 6]]), f", {cache_dtype.label}")


@pytest.mark.kvc_clause("COPY-WHOLE-BLOCK", "OP-INPUTS-UNCHANGED")
@given(data=st.data())
def test_copy_blocks_moves_only_the_mapped_blocks(case, data):
    spec = data.draw(specs(case, num_blocks=(4, 8)))
    ids = data.draw(st.permutations(range(2, spec.geometry.num_blocks)), label="block ids")
    pairs = data.draw(st.integers(1, len(ids) // 2), label="pairs")
    mapping = torch.tensor([[ids[i], ids[pairs + i]] for i in range(pairs)])
    copy_and_compare(case, spec, mapping)


@pytest.mark.kvc_clause("BLOCK-ALL-LAYERS", "COPY-WHOLE-BLOCK", "LAYOUT-E3-LAYERS")
@pytest.mark.kvc_needs("multi_layer")
def test_copy_blocks_copies_every_layer_of_a_block(case):
    spec = case.spec(case.geometry(num_blocks=6, num_layers=3))
    copy_and_compare(case, spec, torch.tensor([[2, 5], [4, 3]]), ", 3 layers")


@pytest.mark.kvc_clause("ADDR-64BIT", "ADDR-BLOCK-ID", "COPY-WHOLE-BLOCK")
@pytest.mark.kvc_needs("memory_2_31")
def test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements(case):
    g, kv_cache_dtype = probe_geometry(case)
    spec = case.spec(g, kv_cache_dtype)
    last = g.num_blocks - 1
    arena = probe_arena(case, spec)
    expected = expected_arena(arena)
    key, value = token_rows(spec, 3, case.seed)
    slots = torch.tensor([last * g.block_size, last * g.block_size + g.block_size - 1, 2 * g.block_size + 1])
    for side in (arena, expected):  # the copied blocks hold data (the rest of a lazy arena is zeros)
        R.reshape_and_cache(key, value, side.region, spec.layout, g, slots, k_scale=torch.ones(1), v_scale=torch.ones(1))
    mapping = torch.tensor([[last, last - 1], [2, last - 2], [last, 3]])
    R.copy_blocks(expected.region, spec.layout, g, mapping)
    note_blocks(case, spec, mapping)
    case.backend.copy_blocks(arena.cache, mapping.to(case.device), spec)
    synchronize(case)
    assert_arenas_equal("copy", case, expected, arena, f"block_mapping {mapping.tolist()} of {g.num_blocks} blocks")
