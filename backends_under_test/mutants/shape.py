"""Seeded faults of the cache's shape and strides: the tensor handed out says one layout, its memory another.
"""

from __future__ import annotations

from kvconform import reference as R

from ..reference_backend import view_over
from . import mutant
from .base import Mutant, write_rows


@mutant("kv_first_reported_as_blocks_first")
class KvFirstReportedAsBlocksFirst(Mutant):
    """Allocates kv-first planes ``(2, B, N, H, D)`` and hands out ``transpose(0, 1)``: the
    shape says blocks-first, the strides (and every stride-driven kernel) say kv-first."""

    catches = ("shape", "write", "split")
    kills = ("test_blocks_are_outermost_and_each_block_is_one_region", "test_last_block_of_a_cache_past_2_31_elements_is_written", "test_split_views_have_the_layout_strides")

    def allocate(self, buffer, spec):
        g = spec.geometry
        planes = buffer.view(g.dtype).view(2, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size)
        return planes.transpose(0, 1)

    def split(self, cache, spec):
        return cache.unbind(1)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        write_rows(cache.unbind(1), key, value, slot_mapping, spec, k_scale, v_scale)


@mutant("kv_first_shape_declared_blocks_first")
class KvFirstShapeDeclaredBlocksFirst(Mutant):
    """Declares the blocks-first standard but hands out its kv-first ``(2, B, N, H, D)`` tensor."""

    catches = ("shape",)
    kills = ("test_cache_has_the_standard_logical_shape",)

    def allocate(self, buffer, spec):
        g = spec.geometry
        return buffer.view(g.dtype).view(2, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size)


@mutant("e3_cross_layer_packed_layer_outermost")
class CrossLayerPackedLayerOutermost(Mutant):
    """Block-outermost E3 (BLHNC) allocated with layer-outermost strides (``layer_stride = B·page``,
    the LBHNC planner branch): a one-layer cache is right; layer 1 sits where block 1 belongs."""

    catches = ("shape",)
    kills = ("test_every_layer_and_block_sits_where_the_permutation_puts_it",)
    suite_args = ("--standard", "e3", "-k", "permutation_puts")

    def __init__(self):
        super().__init__(layouts=(R.standardized("BLHNC"),), standards=frozenset({"e3"}))

    def allocate(self, buffer, spec):
        return view_over(buffer, spec, R.standardized("LBHNC").view_shape_strides(spec.geometry))
