"""Check 6 — ``copy_blocks`` copies whole blocks (both planes, every slot, head and dim) for
each ``[src, dst]`` pair and leaves every other byte alone (LAYOUT_SPEC §B.7; pitfall F.10)."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from .assertions import assert_bytes_equal
from .strategies import specs

pytestmark = [pytest.mark.copy, pytest.mark.kvc_op("copy")]


def copy_and_compare(case, spec, mapping):
    arena = case.allocate(spec)
    expected = arena.snapshot()
    R.copy_blocks(expected.region, spec.layout, spec.geometry, mapping)
    case.backend.copy_blocks(arena.cache, mapping.to(case.device), spec)
    assert_bytes_equal("copy", case, expected, arena, f"block_mapping {mapping.tolist()}")


def test_copy_blocks_copies_both_planes_of_every_slot(case):
    spec = case.spec(case.geometry(num_blocks=8))
    copy_and_compare(case, spec, torch.tensor([[2, 5], [7, 3], [4, 6]]))


@given(data=st.data())
def test_copy_blocks_moves_only_the_mapped_blocks(case, data):
    spec = data.draw(specs(case, num_blocks=(4, 8)))
    ids = data.draw(st.permutations(range(2, spec.geometry.num_blocks)), label="block ids")
    pairs = data.draw(st.integers(1, len(ids) // 2), label="pairs")
    mapping = torch.tensor([[ids[i], ids[pairs + i]] for i in range(pairs)])
    copy_and_compare(case, spec, mapping)
