"""Canonical block bytes: one wire order for a block of any layout.

Per block: for each layer, K then V, each ``[N][H][D]`` in the cache dtype. Two caches
hold the same KV for a block iff their canonical bytes are equal, whatever their layouts.
"""

from __future__ import annotations

import torch

from .geometry import Geometry
from .layouts import Layout
from .offsets import offset_map
from .ops import storage_bits


def canonical_block_bytes(storage: torch.Tensor, layout: Layout, g: Geometry, block_ids) -> torch.Tensor:
    """``uint8 [len(block_ids), L·2·N·H·D·e]``: the blocks in canonical order."""
    bits = storage_bits(storage, g)
    offsets = offset_map(layout, g, block_ids).transpose(0, 1)  # (P, L, 2, N, H, D)
    values = bits[offsets.to(bits.device)].contiguous()
    return values.view(torch.uint8).reshape(offsets.shape[0], -1)


def place_canonical_block_bytes(storage: torch.Tensor, layout: Layout, g: Geometry, block_ids, data: torch.Tensor) -> None:
    """Inverse of :func:`canonical_block_bytes`: write canonical bytes into ``block_ids``."""
    bits = storage_bits(storage, g)
    offsets = offset_map(layout, g, block_ids).transpose(0, 1)
    expected = (offsets.shape[0], offsets[0].numel() * g.element_size)
    if tuple(data.shape) != expected or data.dtype != torch.uint8:
        raise ValueError(f"canonical data must be uint8 {expected}, got {data.dtype} {tuple(data.shape)}")
    values = data.contiguous().view(bits.dtype).reshape(offsets.shape)
    bits[offsets.to(bits.device)] = values.to(bits.device)
