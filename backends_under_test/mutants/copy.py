"""Seeded faults of ``copy_blocks``: planes, strides, block ids and layers left behind.
"""

from __future__ import annotations

from kvconform import reference as R

from ..reference_backend import flat_storage
from . import mutant
from .base import Mutant, e3_layouts, strided_sides


@mutant("copy_blocks_one_plane")
class CopyBlocksOnePlane(Mutant):
    """``copy_blocks`` that copies the K plane of each block and forgets V."""

    catches = ("copy",)
    kills = ("test_copy_blocks_copies_both_planes_of_every_slot",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def copy_blocks(self, cache, block_mapping, spec):
        src, dst = block_mapping[:, 0], block_mapping[:, 1]
        cache[dst, 0] = cache[src, 0]


@mutant("copy_blocks_dense_plane_stride")
class CopyBlocksDensePlaneStride(Mutant):
    """Legacy ``copy_blocks`` on ``unbind(1)`` views: block ``b`` at ``b·N·H·D`` of each plane (F.10)."""

    catches = ("copy",)
    kills = ("test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def copy_blocks(self, cache, block_mapping, spec):
        g = spec.geometry
        for view in strided_sides(cache, spec, block_stride=g.block_size * g.num_kv_heads * g.head_size):
            rows = view[block_mapping[:, 0]].clone()
            view[block_mapping[:, 1]] = rows


@mutant("copy_blocks_16_bit_ids")
class CopyBlocks16BitIds(Mutant):
    """Narrows the block mapping to 16-bit ids: block ``b`` past 2^16 is block ``b mod 2^16`` (ADDR-BLOCK-ID)."""

    catches = ("copy",)
    kills = ("test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements",)

    def copy_blocks(self, cache, block_mapping, spec):
        super().copy_blocks(cache, block_mapping & 0xFFFF, spec)


@mutant("block_copies_first_layer_only")
class BlockCopiesFirstLayerOnly(Mutant):
    """Swaps and copies one page per block id — layer 0's — on a multi-layer allocation, as if
    every layer had its own tensor (BLOCK-ALL-LAYERS)."""

    catches = ("swap", "copy")
    kills = ("test_swap_out_moves_every_layer_of_a_block", "test_copy_blocks_copies_every_layer_of_a_block")

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def _first_layer(self, src, dst, src_ids, dst_ids, spec):
        g = spec.geometry
        src_bits, dst_bits = (R.storage_bits(flat_storage(t, spec), g) for t in (src, dst))
        values = src_bits[R.offset_map(spec.layout, g, src_ids.cpu())[0].to(src_bits.device)]
        dst_bits[R.offset_map(spec.layout, g, dst_ids.cpu())[0].to(dst_bits.device)] = values.to(dst_bits.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._first_layer(cache, host_cache, src_ids, dst_ids, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._first_layer(host_cache, cache, src_ids, dst_ids, spec)

    def copy_blocks(self, cache, block_mapping, spec):
        self._first_layer(cache, cache, block_mapping[:, 0], block_mapping[:, 1], spec)
