"""Check 1 — the cache a backend allocates has the standard's logical shape, strides rebuilt
from its declared stride order, and — on every layout a KV connector may ship (E1: all; E3:
the one vLLM resolves with a connector) — blocks outermost and no inner gaps (SPEC §2 SHAPE-*,
LAYOUT-E3-LAYERS)."""

import pytest

from kvconform import reference as R

from .harness.assertions import assert_equal, assert_offsets_equal, assert_true
from .harness.observed import expected_logical_shape, observed_offset_map

pytestmark = [pytest.mark.shape, pytest.mark.kvc_layouts("standard")]


@pytest.mark.kvc_clause("SHAPE-LOGICAL", "LAYOUT-E1", "LAYOUT-E3")
def test_cache_has_the_standard_logical_shape(case):
    spec = case.spec(case.geometry(num_layers=1))
    arena = case.allocate(spec)
    assert_equal("shape", case, expected_logical_shape(case.standard, spec), tuple(arena.cache.shape), "cache.shape")


@pytest.mark.kvc_clause("LAYOUT-E3-LAYERS", "LAYOUT-E3")
@pytest.mark.kvc_needs("standard_e3")
def test_every_layer_and_block_sits_where_the_permutation_puts_it(case):
    # Three layers: block-outermost permutations interleave layers inside each block (LAYOUT-E3-LAYERS).
    spec = case.spec(case.geometry(num_layers=3, num_blocks=4))
    arena = case.allocate(spec)
    observed = observed_offset_map(case.standard, spec, arena.cache) + (arena.cache.data_ptr() - arena.region.data_ptr()) // spec.geometry.element_size
    # The cache tensor is the container; tiles inside a slot region are the write checks' business.
    declared = R.offset_map(spec.layout.container or spec.layout, spec.geometry)
    assert_offsets_equal("shape", case, declared, observed, "[L, B, H, N, C] view of a 3-layer allocation")


@pytest.mark.kvc_clause("SHAPE-STRIDES", "LAYOUT-E1", "LAYOUT-E3")
def test_cache_strides_are_rebuilt_from_the_declared_stride_order(case, cache_dtype):
    spec = case.spec_for(cache_dtype)
    arena = case.allocate(spec)
    shape, strides = spec.layout.view_shape_strides(spec.geometry)
    # A size-1 dim's stride addresses nothing; PyTorch lets it be anything (pitfall F.4).
    significant = lambda st: tuple(x if n > 1 else None for n, x in zip(shape, st))  # noqa: E731
    assert_equal("shape", case, significant(strides), significant(arena.cache.stride()), "cache.stride() (size-1 dims ignored)")
    assert_equal("shape", case, 0, arena.cache.data_ptr() - arena.region.data_ptr(), "cache.data_ptr() - buffer start, bytes")


@pytest.mark.kvc_clause("SHAPE-SHIPPABLE")
@pytest.mark.kvc_layouts("connector")
def test_blocks_are_outermost_and_each_block_is_one_region(case):
    spec = case.spec(case.geometry())
    arena = case.allocate(spec)
    omap = observed_offset_map(case.standard, spec, arena.cache)
    assert_true("shape", case, R.is_injective(omap), f"two logical elements share memory (strides {arena.cache.stride()})")
    assert_true("shape", case, R.is_blocks_first(omap), f"dim 0 is not the block dim (strides {arena.cache.stride()})")
    assert_true("shape", case, R.is_block_compact(omap), f"a block's K and V are not one contiguous region (strides {arena.cache.stride()})")
