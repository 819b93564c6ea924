"""Seeded faults of ``swap_out`` / ``swap_in``: block ids, byte offsets and page sizes.
"""

from __future__ import annotations

import torch

from kvconform import reference as R

from ..reference_backend import flat_storage
from . import mutant
from .base import Mutant


@mutant("swap_indexes_dim1")
class SwapIndexesDim1(Mutant):
    """``dst[:, dst_ids] = src[:, src_ids]``: the kv-first indexing applied to a blocks-first cache (#41056)."""

    catches = ("swap",)
    kills = ("test_swap_of_blocks_0_and_1_moves_blocks_not_planes",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        host_cache[:, dst_ids.to(host_cache.device)] = cache[:, src_ids.to(cache.device)].to(host_cache.device)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        cache[:, dst_ids.to(cache.device)] = host_cache[:, src_ids.to(host_cache.device)].to(cache.device)


@mutant("swap_dim0_on_kv_first")
class SwapDim0OnKvFirst(Mutant):
    """A kv-first ``(2, B, N, H, D)`` cache swapped with ``dst[ids] = src[ids]`` on dim 0: ids ≥ 2
    raise, ids 0/1 silently copy whole K or V planes (F.1)."""

    catches = ("swap",)
    kills = ("test_swap_of_blocks_0_and_1_moves_blocks_not_planes",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        host_cache[dst_ids.to(host_cache.device)] = cache[src_ids.to(cache.device)].to(host_cache.device)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        cache[dst_ids.to(cache.device)] = host_cache[src_ids.to(host_cache.device)].to(cache.device)


@mutant("swap_k_view_block_bytes")
class SwapKViewBlockBytes(Mutant):
    """``swap_blocks`` run once per split view with ``S = stride(0)·e``: the V view's copy takes
    ``[V_b, K_{b+1}]`` and overwrites the neighbour block's K (F.9)."""

    catches = ("swap",)
    kills = ("test_swap_out_places_each_block_at_its_host_slot",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def _swap(self, src, dst, src_ids, dst_ids, spec):
        g = spec.geometry
        plane = g.block_size * g.num_kv_heads * g.head_size
        span = 2 * plane  # stride(0) of the K/V views, taken as "the block"
        flat_src, flat_dst = (torch.as_strided(t, (g.num_blocks * span,), (1,), t.storage_offset()) for t in (src, dst))
        for base in (0, plane):  # K view, then V view
            for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
                length = min(span, flat_src.numel() - base - s * span, flat_dst.numel() - base - d * span)
                flat_dst[base + d * span: base + d * span + length] = flat_src[base + s * span: base + s * span + length].to(flat_dst.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._swap(cache, host_cache, src_ids.cpu(), dst_ids.cpu(), spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._swap(host_cache, cache, src_ids.cpu(), dst_ids.cpu(), spec)


@mutant("swap_only_below_two")
class SwapOnlyBelowTwo(Mutant):
    """A swap that indexes with ``ids & 1`` (written and tested with blocks 0 and 1 only)."""

    catches = ("swap",)
    kills = ("test_swap_in_restores_blocks_into_other_device_blocks",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        super().swap_out(cache, host_cache, src_ids & 1, dst_ids & 1, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        super().swap_in(host_cache, cache, src_ids & 1, dst_ids & 1, spec)


class BlocksFirstByteCopy(Mutant):
    """Block copies as raw bytes of each blocks-first page (``page`` bytes per block id)."""

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def block_offset(self, block: int, page: int) -> int:
        return block * page

    def block_bytes(self, spec) -> int:
        return spec.layout.strides(spec.geometry)["B"] * spec.geometry.element_size

    def _swap(self, src, dst, src_ids, dst_ids, spec):
        page = self.block_bytes(spec)
        true_page = spec.layout.strides(spec.geometry)["B"] * spec.geometry.element_size
        src_bytes, dst_bytes = (flat_storage(t, spec).view(torch.uint8) for t in (src, dst))
        for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
            start, to = self.block_offset(s, true_page), self.block_offset(d, true_page)
            length = min(page, src_bytes.numel() - start, dst_bytes.numel() - to)
            dst_bytes[to:to + length] = src_bytes[start:start + length].to(dst_bytes.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._swap(cache, host_cache, src_ids.cpu(), dst_ids.cpu(), spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._swap(host_cache, cache, src_ids.cpu(), dst_ids.cpu(), spec)


@mutant("swap_block_bytes_for_two_byte_elements")
class SwapBlockBytesForTwoByteElements(BlocksFirstByteCopy):
    """Swaps ``stride(0)·2`` bytes per block, the element size of bf16/fp16 hard-coded: an fp8
    cache copies two blocks (overwriting the neighbour), an fp32 cache half of one."""

    catches = ("swap",)
    kills = ("test_swap_out_places_each_block_at_its_host_slot",)

    def block_bytes(self, spec):
        return spec.layout.strides(spec.geometry)["B"] * 2


@mutant("swap_byte_offsets_int32")
class SwapByteOffsetsInt32(BlocksFirstByteCopy):
    """Computes a block's byte offset ``id·page`` in 32-bit arithmetic: past 2^31 it wraps
    (here: loses bit 31) and the swap reads and writes blocks near the start (ADDR-64BIT)."""

    catches = ("swap",)
    kills = ("test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements",)

    def block_offset(self, block, page):
        return (block * page) & 0x7FFFFFFF


@mutant("swap_16_bit_ids")
class Swap16BitIds(Mutant):
    """Swaps with block ids truncated to 16 bits (an int16 id field): block ``b`` past 2^16 is
    block ``b mod 2^16`` on both sides of the copy (ADDR-BLOCK-ID)."""

    catches = ("swap",)
    kills = ("test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        super().swap_out(cache, host_cache, src_ids & 0xFFFF, dst_ids & 0xFFFF, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        super().swap_in(host_cache, cache, src_ids & 0xFFFF, dst_ids & 0xFFFF, spec)
