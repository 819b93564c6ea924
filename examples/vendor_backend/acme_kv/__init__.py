"""ACME's paged KV cache (a stand-in for a vendor's kernels): blocks-first ``(B, 2, N, H, D)``."""

import torch


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, *, k_scale=None, v_scale=None):
    """Write token ``t`` of ``key``/``value`` ``[T, H, D]`` into slot ``slot_mapping[t]``;
    ``-1`` is padding. fp8 caches store ``x / scale`` (known bug acme-kv#7: no saturation)."""
    slots = slot_mapping.long()
    keep = slots >= 0
    block_size = key_cache.shape[1]
    blocks, rows = slots[keep] // block_size, slots[keep] % block_size
    for cache, x, scale in ((key_cache, key, k_scale), (value_cache, value, v_scale)):
        x = x[: len(slots)][keep]
        if cache.dtype != x.dtype:  # fp8: quantise
            x = (x.float() / scale).to(cache.dtype)
        cache.view(torch.uint8)[blocks, rows] = x.contiguous().view(torch.uint8)


def copy_blocks(src_cache, dst_cache, src_ids, dst_ids):
    """``dst[dst_ids] = src[src_ids]``, whole blocks along dim 0 (both planes)."""
    dst_cache.view(torch.uint8)[dst_ids.to(dst_cache.device)] = src_cache.view(torch.uint8)[src_ids.to(src_cache.device)].to(dst_cache.device)
