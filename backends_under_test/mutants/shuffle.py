"""Seeded faults of the tiled (shuffled, ``[H, D/x, N, x]``) K/V caches' writer.
"""

from __future__ import annotations

import dataclasses

from kvconform import reference as R

from ..reference_backend import flat_storage
from . import mutant
from .base import Mutant, encoded_rows, place_rows


@mutant("shuffle_v_in_k_form")
class ShuffleVInKForm(Mutant):
    """Writes V with K's ``[H, D/x, N, x]`` tile instead of ``[H, N/x, D, x]``."""

    catches = ("shuffle", "write")
    kills = ("test_v_is_written_in_the_v_tile_not_the_k_tile", "test_key_rows_beyond_slot_mapping_are_ignored")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        layout = spec.layout
        if layout.is_tiled:
            layout = dataclasses.replace(layout, v_dims=layout.v_dims[:-4] + layout.k_dims[-4:])
        R.reshape_and_cache(key, value, flat_storage(cache, spec), layout, spec.geometry, slot_mapping, k_scale=k_scale, v_scale=v_scale)


@mutant("shuffle_x_from_model_dtype")
class ShuffleXFromModelDtype(Mutant):
    """Computes ``x = 16 // element_size`` of the *model* dtype (8 for bf16) on an fp8 cache (F.7)."""

    catches = ("shuffle",)
    kills = ("test_fp8_tiles_use_x_from_the_cache_dtype",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if not (spec.layout.is_tiled and g.dtype in R.fp8.FP8_DTYPES):
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        wrong_x = dataclasses.replace(g, dtype=key.dtype)  # same sizes, x from the model dtype
        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows, lambda kv, b, n, h, d: spec.layout.offsets(wrong_x, block=b, kv=kv, slot=n, head=h, dim=d))


@mutant("shuffle_dense_block_stride")
class ShuffleDenseBlockStride(Mutant):
    """Pre-#43660 shuffle writer on ``unbind(1)`` views: side base ``b·H·D·N`` from each view's
    pointer (dense planes) instead of ``stride(0) = 2·H·D·N``."""

    catches = ("shuffle", "write")
    kills = ("test_shuffled_tiles_stay_inside_their_block_and_side", "test_last_block_of_a_cache_past_2_31_elements_is_written")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        layout, g = spec.layout, spec.geometry
        if not (layout.is_tiled and layout.k_dims[0] == "B"):
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        plane = g.num_kv_heads * g.head_size * g.block_size

        def dense_base(kv, b, n, h, d):  # the tile offset is right; only the block base is dense
            tile = layout.offsets(g, block=0, kv=kv, slot=n, head=h, dim=d) - layout.offsets(g, block=0, kv=kv)
            return kv * plane + b * plane + tile

        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows, dense_base)
