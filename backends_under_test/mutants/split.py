"""Seeded faults of ``split``: K and V views that are copies, or sit at the wrong offset.
"""

from __future__ import annotations

from kvconform import reference as R

from . import mutant
from .base import Mutant


@mutant("split_copies")
class SplitCopies(Mutant):
    """``unbind(1)`` followed by ``.contiguous()``: K/V are copies, writes through them vanish (F.6)."""

    catches = ("split",)
    kills = ("test_split_views_share_the_cache_storage",)

    def split(self, cache, spec):
        return tuple(view.contiguous() for view in super().split(cache, spec))


@mutant("split_on_block_dim")
class SplitOnBlockDim(Mutant):
    """``unbind(0)`` on a blocks-first cache: "K" and "V" are blocks 0 and 1 (F.18)."""

    catches = ("split",)
    kills = ("test_split_views_have_the_layout_strides",)

    def split(self, cache, spec):
        return cache[0], cache[1]


@mutant("split_v_offset_for_two_byte_elements")
class SplitVOffsetForTwoByteElements(Mutant):
    """Puts V ``N·H·D·2`` bytes after K (``sizeof(half)`` hard-coded): right for bf16/fp16,
    wrong for fp8 and fp32 caches (SPLIT-ZERO-COPY, SPLIT-E1-BLOCK-STRIDE)."""

    catches = ("split",)
    kills = ("test_writes_through_split_views_reach_the_cache",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def split(self, cache, spec):
        g = spec.geometry
        k, _ = super().split(cache, spec)
        plane_bytes = g.block_size * g.num_kv_heads * g.head_size * 2
        return k, cache.as_strided(k.shape, k.stride(), k.storage_offset() + plane_bytes // g.element_size)
