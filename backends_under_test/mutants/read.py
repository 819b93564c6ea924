"""Seeded faults of the decode kernel's reads: the block table, scales, offsets and layers.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from . import mutant
from .base import Mutant, e3_layouts


@mutant("decode_k_scale_for_v")
class DecodeUsesKScaleForV(Mutant):
    """Dequantises V with ``k_scale`` in the decode kernel."""

    catches = ("read",)
    kills = ("test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        return super().decode(cache, query, block_table, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=k_scale)


@mutant("decode_ignores_block_table")
class DecodeIgnoresBlockTable(Mutant):
    """Decode reads sequence s's j-th block from block ``j`` (as if the table were the identity)."""

    catches = ("read",)
    kills = ("test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        identity = torch.arange(block_table.numel(), device=block_table.device).view_as(block_table)
        return super().decode(cache, query, identity, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)


@mutant("decode_int32_offsets")
class DecodeInt32Offsets(Mutant):
    """Decode computes the element offset of block ``b`` (``b·page``) in 32-bit arithmetic: past
    2^31 it wraps and reads another block (emulated by remapping the table; exact for the
    power-of-two pages of the probe geometry; ADDR-64BIT)."""

    catches = ("read",)
    kills = ("test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        page = spec.layout.strides(spec.geometry)["B"]
        wrapped = ((block_table.long() * page) & 0x7FFFFFFF) // page
        return super().decode(cache, query, wrapped.to(block_table.dtype), seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)


@mutant("decode_reads_first_layer")
class DecodeReadsFirstLayer(Mutant):
    """Decode of layer ``l`` of a multi-layer allocation reads layer 0's pages (READ-LAYER)."""

    catches = ("read",)
    kills = ("test_decode_of_each_declared_size_class_equals_sdpa",)

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        return super().decode(cache, query, block_table, seq_lens, dataclasses.replace(spec, layer=0), scale=scale, k_scale=k_scale, v_scale=v_scale)
