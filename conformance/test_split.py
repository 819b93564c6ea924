"""Check 2 — splitting the cache into K and V gives zero-copy views: same storage, V one
plane after K, block stride twice the plane (E1 ``unbind(1)``), and a write through a view
lands in the cache (SPEC §3 SPLIT-*; pitfall F.6)."""

import pytest
import torch

from kvconform import reference as R

from .harness.assertions import assert_bytes_equal, assert_equal
from .harness.case import Case

pytestmark = [pytest.mark.split, pytest.mark.kvc_op("split"), pytest.mark.kvc_layouts("standard")]


def expected_side(spec, view: torch.Tensor, kv: int):
    """(shape, strides, byte offset) the spec gives for this side: the tile view the kernels
    take, or — when the backend hands out its 4-D ``(B, N, H, D)`` container — the container's."""
    shape, strides, offset = spec.layout.side_view(spec.geometry, kv)
    container = spec.layout.container
    if container is not None and tuple(view.shape) != shape:
        shape, strides, offset = container.side_view(spec.geometry, kv)
    return shape, strides, offset * spec.geometry.element_size


def split_of(case: Case, cache_dtype=None):
    spec = case.spec_for(cache_dtype) if cache_dtype else case.spec(case.geometry())
    arena = case.allocate(spec)
    return spec, arena, case.backend.split(arena.cache, spec)


@pytest.mark.kvc_clause("SPLIT-ZERO-COPY")
def test_split_views_share_the_cache_storage(case):
    spec, arena, views = split_of(case)
    for kv, view in enumerate(views):
        _, _, offset = expected_side(spec, view, kv)
        name = "KV"[kv]
        same = view.untyped_storage().data_ptr() == arena.cache.untyped_storage().data_ptr()
        assert_equal("split", case, True, same, f"{name} shares the cache's storage")
        assert_equal("split", case, offset, view.data_ptr() - arena.region.data_ptr(), f"{name}.data_ptr() - cache start, bytes")


@pytest.mark.kvc_clause("SPLIT-STRIDES", "LAYOUT-SHUFFLE", "LAYOUT-LEGACY")
def test_split_views_have_the_layout_strides(case):
    spec, _, views = split_of(case)
    for kv, view in enumerate(views):
        shape, strides, _ = expected_side(spec, view, kv)
        assert_equal("split", case, (shape, strides), (tuple(view.shape), view.stride()), f"{'KV'[kv]} (shape, strides)")


@pytest.mark.kvc_clause("SPLIT-E1-BLOCK-STRIDE", "LAYOUT-SHUFFLE-BASE")
@pytest.mark.kvc_needs("standard_e1")
def test_e1_block_stride_is_twice_the_plane(case):
    spec, _, views = split_of(case)
    g = spec.geometry
    plane = g.block_size * g.num_kv_heads * g.head_size
    for kv, view in enumerate(views):
        assert_equal("split", case, 2 * plane + spec.layout.block_pad, view.stride(0), f"{'KV'[kv]}.stride(0)")
    assert_equal("split", case, plane * g.element_size, views[1].data_ptr() - views[0].data_ptr(), "V - K data_ptr")


@pytest.mark.kvc_clause("SPLIT-WRITE-THROUGH", "SPLIT-ZERO-COPY")
def test_writes_through_split_views_reach_the_cache(case, cache_dtype):
    spec, arena, views = split_of(case, cache_dtype)
    before, expected = arena.snapshot(), arena.snapshot()
    bits = R.bits_dtype(spec.geometry.dtype)
    for kv, view in enumerate(views):
        pattern = torch.arange(view.numel()).remainder(127).add(64 * kv).view(view.shape).to(bits)
        view.view(bits).copy_(pattern.to(view.device))
        shape, strides, offset = expected_side(spec, view, kv)
        expected.strided(shape, strides, offset // spec.geometry.element_size).copy_(pattern)
    assert_bytes_equal("split", case, expected, arena, "a write through K/V must be visible in the cache", initial=before)
