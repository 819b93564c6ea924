"""Read a backend's *actual* cache tensor back into logical coordinates.

The declared layout says where elements should be; these helpers say where the tensor the
backend handed out puts them — from its real shape and strides — so the standard's
structural properties are checked on what kernels will actually address.
"""

from __future__ import annotations

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec


def expected_logical_shape(standard: str, spec: CacheSpec) -> tuple[int, ...]:
    """E1: ``(B, 2, N, H, D)``; E3: ``(L, B, H, N, C)`` with C = 2·D, or H·D for 2-slot specs."""
    g = spec.geometry
    if standard == "e1":
        return (g.num_blocks, 2, g.block_size, g.num_kv_heads, g.head_size)
    if spec.layout.slot_coord == "kv":
        return (g.num_layers, g.num_blocks, 2, g.block_size, g.num_kv_heads * g.head_size)
    return (g.num_layers, g.num_blocks, g.num_kv_heads, g.block_size, 2 * g.head_size)


def observed_offset_map(standard: str, spec: CacheSpec, cache: torch.Tensor) -> torch.Tensor:
    """``(L, B, 2, N, H, D)`` element offsets (from ``cache.data_ptr()``) the tensor's strides give."""
    g = spec.geometry
    if tuple(cache.shape) != expected_logical_shape(standard, spec):
        raise AssertionError(f"shape: cache.shape {tuple(cache.shape)} is not the {standard} logical shape {expected_logical_shape(standard, spec)}")
    c = R.logical_grid(g)
    s = cache.stride()
    if standard == "e1":
        offsets = c["block"] * s[0] + c["kv"] * s[1] + c["slot"] * s[2] + c["head"] * s[3] + c["dim"] * s[4]
    elif spec.layout.slot_coord == "kv":  # [L, B, 2 slots, N, H·D]
        offsets = c["layer"] * s[0] + c["block"] * s[1] + c["kv"] * s[2] + c["slot"] * s[3] + (c["head"] * g.head_size + c["dim"]) * s[4]
    else:  # [L, B, H, N, K‖V]
        offsets = c["layer"] * s[0] + c["block"] * s[1] + c["head"] * s[2] + c["slot"] * s[3] + (c["kv"] * g.head_size + c["dim"]) * s[4]
    return offsets.expand(R.logical_shape(g))
