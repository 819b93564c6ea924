"""Reference cache operations (SPEC §4–§8), vectorised, on any layout.

A cache here is a 1-D contiguous ``storage`` tensor (any dtype; typically a uint8 slice of a
bigger buffer) plus the :class:`~reference.layouts.Layout` and
:class:`~reference.geometry.Geometry` that say where each logical element lives. Every op
addresses elements through :meth:`Layout.offsets` and copies raw bits (integer views), so
fp8 and bf16 bit patterns — NaN codes, −0 — move unchanged.
"""

from __future__ import annotations

import torch

from . import fp8
from .geometry import Geometry, bits_dtype
from .layouts import Layout
from .offsets import offset_map


def storage_bits(storage: torch.Tensor, g: Geometry) -> torch.Tensor:
    """The storage as a 1-D integer tensor with the cache dtype's element size (a view)."""
    if storage.dim() != 1 or not storage.is_contiguous():
        raise ValueError(f"storage must be a contiguous 1-D tensor, got shape {tuple(storage.shape)}")
    return storage.view(torch.uint8).view(bits_dtype(g.dtype))


def encode(x: torch.Tensor, g: Geometry, scale, head_dim: int = -2) -> torch.Tensor:
    """Model values → cache dtype: bit copy for ``auto``, FP8-ENCODE quantisation for fp8 caches."""
    if g.dtype in fp8.FP8_DTYPES:
        return fp8.quantize(x, 1.0 if scale is None else scale, g.dtype, head_dim)
    if x.dtype != g.dtype:
        raise ValueError(f"input dtype {x.dtype} differs from cache dtype {g.dtype} (kv_cache_dtype=auto)")
    return x


def decode(q: torch.Tensor, g: Geometry, scale, head_dim: int = -2) -> torch.Tensor:
    """Cache dtype → fp32 (dequantised with ``scale`` for fp8 caches)."""
    if g.dtype in fp8.FP8_DTYPES:
        return fp8.dequantize(q, 1.0 if scale is None else scale, head_dim)
    return q.float()


def stored_values(x: torch.Tensor, g: Geometry, scale, head_dim: int = -2) -> torch.Tensor:
    """What a cache of ``g.dtype`` holds for ``x``, read back as fp32 (quantised for fp8)."""
    return decode(encode(x, g, scale, head_dim), g, scale, head_dim)


def _checked_slots(slot_mapping: torch.Tensor, g: Geometry) -> torch.Tensor:
    if slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"slot_mapping must be 1-D int32/int64, got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    slots = slot_mapping.to(torch.int64)
    capacity = g.num_blocks * g.block_size
    if bool((slots >= capacity).any()):
        raise ValueError(f"slot_mapping holds slots >= num_blocks*block_size = {capacity}")
    written = slots[slots >= 0]
    if torch.unique(written).numel() != written.numel():
        raise ValueError("slot_mapping repeats a slot; the written value would be undefined")
    return slots


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    storage: torch.Tensor,
    layout: Layout,
    g: Geometry,
    slot_mapping: torch.Tensor,
    *,
    k_scale=None,
    v_scale=None,
    layer: int = 0,
) -> None:
    """Write token rows of ``key``/``value`` (``[T', H, D]``, any strides) into the cache.

    Token ``t < len(slot_mapping)`` with slot ``s ≥ 0`` goes to block ``b = s // N``, row
    ``n = s % N``; ``s < 0`` is padding and writes nothing; rows past ``len(slot_mapping)``
    are ignored (WRITE-PAD-1, WRITE-TOKENS). fp8 caches store ``quantize(x / scale)`` with per-tensor or ``[H]``
    scales (FP8-ENCODE, FP8-SCALE).
    """
    H, D, N = g.num_kv_heads, g.head_size, g.block_size
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 3 or tuple(tensor.shape[1:]) != (H, D):
            raise ValueError(f"{name} must be [tokens, {H}, {D}], got {tuple(tensor.shape)}")
    slots = _checked_slots(slot_mapping.cpu(), g)
    T = slots.numel()
    if key.shape[0] < T or value.shape[0] < T:
        raise ValueError(f"key/value have fewer rows than len(slot_mapping) = {T}")
    tokens = torch.nonzero(slots >= 0).flatten()
    if tokens.numel() == 0:
        return
    s = slots[tokens]
    bits = storage_bits(storage, g)
    kv = torch.arange(2)
    rows = layout.offsets(g, layer=layer, block=(s // N)[:, None], kv=kv, slot=(s % N)[:, None])
    inner = layout.offsets(g, kv=kv[:, None, None], head=torch.arange(H)[:, None], dim=torch.arange(D))
    inner = inner - layout.offsets(g, kv=kv[:, None, None])
    all_rows = tokens.numel() == T
    for side, (src, scale) in enumerate(((key, k_scale), (value, v_scale))):
        src = src[:T] if all_rows else src[tokens.to(src.device)]
        data = encode(src, g, scale, head_dim=1).view(bits.dtype).to(bits.device)
        _scatter(bits, rows[:, side], inner[side], data)


def _run_length(rows: torch.Tensor, inner: torch.Tensor) -> int:
    """Longest run ``r`` (a divisor of H·D) of consecutive (head, dim) elements stored contiguously
    and r-aligned: H·D for packed NHD rows, D for HND, x for the AITER K tile, 1 for its V tile."""
    width = inner.shape[-1]
    lane_of = torch.arange(width)
    for r in (r for r in range(width, 0, -1) if width % r == 0):
        lane = lane_of % r
        if torch.equal(inner, inner[..., lane_of - lane] + lane) and bool((inner % r == lane).all()) and bool((rows % r == 0).all()):
            return r
    return 1


def _scatter(bits: torch.Tensor, rows: torch.Tensor, inner: torch.Tensor, data: torch.Tensor) -> None:
    """``bits[rows[t] + inner[h, d]] = data[t, h, d]``, moving the longest contiguous runs at once."""
    T = data.shape[0]
    inner = inner.reshape(-1)
    data = data.reshape(T, -1)
    r = _run_length(rows, inner)
    if r == 1:
        bits.index_put_(((rows[:, None] + inner[None]).to(bits.device),), data)
        return
    whole = bits.numel() - bits.numel() % r
    run_index = (rows[:, None] + inner[None, ::r]) // r  # (T, H·D / r)
    bits[:whole].view(-1, r).index_put_((run_index.to(bits.device),), data.reshape(T, -1, r))


def read_logical(storage: torch.Tensor, layout: Layout, g: Geometry, blocks=None) -> torch.Tensor:
    """The cache as logical ``(L, B, 2, N, H, D)`` in the cache dtype (a gathered copy)."""
    bits = storage_bits(storage, g)
    return bits[offset_map(layout, g, blocks).to(bits.device)].view(g.dtype)


def copy_blocks_between(
    src: torch.Tensor, src_layout: Layout, dst: torch.Tensor, dst_layout: Layout, g: Geometry, src_ids, dst_ids
) -> None:
    """Copy whole logical blocks (every layer, K and V, all slots) ``src_ids[i] → dst_ids[i]``.

    Source and destination may differ in layout and device; all sources are read before
    any destination is written.
    """
    src_ids = torch.as_tensor(src_ids, dtype=torch.int64).flatten().cpu()
    dst_ids = torch.as_tensor(dst_ids, dtype=torch.int64).flatten().cpu()
    if src_ids.numel() != dst_ids.numel():
        raise ValueError(f"{src_ids.numel()} source blocks but {dst_ids.numel()} destination blocks")
    for name, ids in (("source", src_ids), ("destination", dst_ids)):
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= g.num_blocks):
            raise ValueError(f"{name} block ids must lie in [0, {g.num_blocks}), got {ids.tolist()}")
    if torch.unique(dst_ids).numel() != dst_ids.numel():
        raise ValueError(f"destination block ids repeat: {dst_ids.tolist()}")
    src_bits, dst_bits = storage_bits(src, g), storage_bits(dst, g)
    values = src_bits[offset_map(src_layout, g, src_ids).to(src_bits.device)]
    dst_bits[offset_map(dst_layout, g, dst_ids).to(dst_bits.device)] = values.to(dst_bits.device)


def swap_out_blocks_to_host(device_storage, host_storage, layout: Layout, g: Geometry, src_ids, dst_ids, *, host_layout=None):
    """Platform ``swap_out_blocks_to_host``: ``host[dst_ids] = device[src_ids]`` along blocks (SWAP-DIM0)."""
    copy_blocks_between(device_storage, layout, host_storage, host_layout or layout, g, src_ids, dst_ids)


def insert_blocks_to_device(host_storage, device_storage, layout: Layout, g: Geometry, src_ids, dst_ids, *, host_layout=None):
    """Platform ``insert_blocks_to_device``: ``device[dst_ids] = host[src_ids]`` along blocks (SWAP-DIM0)."""
    copy_blocks_between(host_storage, host_layout or layout, device_storage, layout, g, src_ids, dst_ids)


def copy_blocks(storage: torch.Tensor, layout: Layout, g: Geometry, block_mapping: torch.Tensor) -> None:
    """``copy_blocks``: for each ``[src, dst]`` row, copy the whole block in place (COPY-WHOLE-BLOCK)."""
    mapping = torch.as_tensor(block_mapping, dtype=torch.int64).cpu()
    if mapping.dim() != 2 or mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [pairs, 2], got {tuple(mapping.shape)}")
    copy_blocks_between(storage, layout, storage, layout, g, mapping[:, 0], mapping[:, 1])
