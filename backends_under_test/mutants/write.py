"""Seeded faults of the K/V writer (``reshape_and_cache``): slots, strides, block indexing and bytes
past the cache, written the way a kernel gets them wrong.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from ..reference_backend import flat_storage
from . import mutant
from .base import Mutant, e3_layouts, encoded_rows, place_rows, strided_sides, write_rows


@mutant("write_padding_slots")
class WritesPaddingSlots(Mutant):
    """Python-style negative indexing: slot -1 writes the cache's last slot instead of nothing."""

    catches = ("write",)
    kills = ("test_padding_slots_leave_cache_untouched",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        padding = (slot_mapping < 0).nonzero().flatten()
        if padding.numel():  # cache.view(-1, ...)[-1] = row: the last padded token wins
            last_slot = torch.full_like(slot_mapping, -1)
            last_slot[padding[-1]] = spec.geometry.num_blocks * spec.geometry.block_size - 1
            super().write(cache, key, value, last_slot, spec, k_scale=k_scale, v_scale=v_scale)


@mutant("write_dense_block_stride")
class DenseBlockStride(Mutant):
    """Addresses block ``b`` of the K/V views at ``b·N·H·D`` (the dense plane) instead of
    ``stride(0) = 2·N·H·D``: the pre-#43660 assumption on an ``unbind(1)`` view."""

    catches = ("write",)
    kills = ("test_last_block_of_a_cache_past_2_31_elements_is_written",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        views = strided_sides(cache, spec, block_stride=g.block_size * g.num_kv_heads * g.head_size)
        write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale)


@mutant("write_head_stride_ignored")
class HeadStrideIgnored(Mutant):
    """Takes the head stride as ``D`` (NHD) whatever the cache says: HND caches are scrambled."""

    catches = ("write",)
    kills = ("test_key_value_rows_are_read_through_their_row_stride",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        views = strided_sides(cache, spec, head_stride=spec.geometry.head_size)
        write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale)


@mutant("write_block_size_from_wrong_dim")
class BlockSizeFromWrongDim(Mutant):
    """Reads ``block_size`` from ``key_cache.shape[2]`` (H) instead of ``shape[1]`` (N)."""

    catches = ("write",)
    kills = ("test_last_block_of_a_cache_past_2_31_elements_is_written",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        wrong_n = spec.geometry.num_kv_heads  # shape[2] of (B, N, H, D), taken as N
        write_rows(strided_sides(cache, spec), key, value, slot_mapping, spec, k_scale, v_scale, block_size=wrong_n)


@mutant("write_tokens_from_key_rows")
class TokensFromKeyRows(Mutant):
    """Launches one program per *key row*: rows past ``len(slot_mapping)`` read slot_mapping out
    of bounds (here: wrapping) and overwrite real tokens."""

    catches = ("write",)
    kills = ("test_key_rows_beyond_slot_mapping_are_ignored",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        T, rows = len(slot_mapping), key.shape[0]
        # One wrap at a time (later rows land last): past 2T rows a single write would repeat slots.
        for first in range(T, rows, T) if T else ():
            stray = torch.full((rows,), -1, dtype=slot_mapping.dtype)
            wrapped = torch.arange(first, min(first + T, rows))
            stray[wrapped] = slot_mapping.cpu()[wrapped % T]
            super().write(cache, key, value, stray.to(slot_mapping.device), spec, k_scale=k_scale, v_scale=v_scale)


@mutant("write_k_scale_for_v")
class KScaleForVOnWrite(Mutant):
    """Quantises V with ``k_scale``."""

    catches = ("write",)
    kills = ("test_fp8_codes_equal_the_reference_encoder_for_edge_values",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=k_scale)


@mutant("write_one_bit_flipped")
class OneByteFlipped(Mutant):
    """A write that is right except for one flipped bit in one written element."""

    catches = ("write", "equivalence")
    kills = ("test_last_block_of_a_cache_past_2_31_elements_is_written", "test_canonical_bytes_equal_the_committed_reference_digests")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        first = slot_mapping[slot_mapping >= 0][:1].long().cpu()
        if first.numel():
            g = spec.geometry
            offset = int(spec.layout.offsets(g, block=first // g.block_size, kv=1, slot=first % g.block_size, head=0, dim=0))
            R.storage_bits(flat_storage(cache, spec), g)[offset] ^= 1


@mutant("write_int32_offset_wraparound")
class Int32OffsetWraparound(Mutant):
    """Element offsets computed in 32-bit arithmetic: past 2^31 they wrap (here: lose bit 31)
    and the last blocks of a large cache are written over its first ones (F.2)."""

    catches = ("write",)
    kills = ("test_last_block_of_a_cache_past_2_31_elements_is_written",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows,
                   lambda kv, b, n, h, d: spec.layout.offsets(g, block=b, kv=kv, slot=n, head=h, dim=d) & 0x7FFFFFFF)


@mutant("write_scribbles_past_the_end")
class ScribblesPastTheEnd(Mutant):
    """A correct write that also stores one element past the end of the cache."""

    catches = ("write",)
    kills = ("test_key_rows_beyond_slot_mapping_are_ignored",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        g = spec.geometry
        end = spec.layout.numel(g) * g.element_size
        past_the_end(cache, end, g.element_size).zero_()


class _RawMemory:
    """``__array_interface__`` / ``__cuda_array_interface__`` over a raw address range."""

    def __init__(self, address: int, nbytes: int, cuda: bool):
        interface = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        setattr(self, "__cuda_array_interface__" if cuda else "__array_interface__", interface)


def past_the_end(cache: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` at byte ``offset`` from the cache's start, as a kernel's pointer reaches them: past
    the cache's storage when ``offset`` is its size (torch views stop at the storage; memory does not)."""
    import numpy as np

    start = cache.data_ptr() + offset
    if cache.is_cuda:
        return torch.as_tensor(_RawMemory(start, nbytes, cuda=True), device=cache.device)
    return torch.from_numpy(np.asarray(_RawMemory(start, nbytes, cuda=False)))


@mutant("write_block_index_by_shift")
class BlockIndexByShift(Mutant):
    """Splits the slot with ``s >> log2(N)`` and ``s & (N - 1)``, right only when the block size
    is a power of two (WRITE-SLOT with N = 48)."""

    catches = ("write",)
    kills = ("test_each_declared_size_class_is_written_at_reference_offsets",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        shift = g.block_size.bit_length() - 1
        wrong = lambda kv, b, n, h, d: spec.layout.offsets(  # noqa: E731
            g, block=(b * g.block_size + n) >> shift, kv=kv, slot=(b * g.block_size + n) & ((1 << shift) - 1), head=h, dim=d)
        place_rows(cache, spec, slot_mapping, encoded_rows(key, value, spec, k_scale, v_scale), wrong)


@mutant("write_head_stride_power_of_two")
class HeadStridePowerOfTwo(Mutant):
    """Reads head ``h`` of a source row at ``h·BLOCK_D`` with ``BLOCK_D`` the next power of two
    of D (the Triton ``arange`` width) instead of the row's head stride: right only for
    power-of-two head sizes (WRITE-SOURCE-STRIDE with D = 80)."""

    catches = ("write",)
    kills = ("test_each_declared_size_class_is_written_at_reference_offsets",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        width = 1 << (g.head_size - 1).bit_length()
        at = (torch.arange(g.num_kv_heads)[:, None] * width + torch.arange(g.head_size)).flatten()

        def misread(x):  # elements past the row's H·D read as zeros
            flat = torch.cat([x.reshape(x.shape[0], -1), torch.zeros(x.shape[0], g.num_kv_heads * width, dtype=x.dtype, device=x.device)], 1)
            return flat[:, at.to(x.device)].view(x.shape)

        super().write(cache, misread(key), misread(value), slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)


@mutant("write_ignores_layer")
class WriteIgnoresLayer(Mutant):
    """A per-layer writer handed layer ``l`` of a multi-layer allocation writes layer 0 (WRITE-LAYER)."""

    catches = ("write",)
    kills = ("test_each_declared_size_class_is_written_at_reference_offsets",)

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, dataclasses.replace(spec, layer=0), k_scale=k_scale, v_scale=v_scale)
