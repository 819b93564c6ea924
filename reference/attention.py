"""Paged decode attention read through a block table (SPEC READ-DECODE).

Sequence ``s`` has ``seq_lens[s]`` cached tokens; token ``t`` lives in block
``block_table[s, t // N]`` at row ``t % N``. Query head ``q`` attends with KV head
``q // (Hq // H)`` (GQA). Scores are ``scale · q·k`` in fp32; fp8 caches are dequantised
with the per-tensor or per-head k/v scales.
"""

from __future__ import annotations

import torch

from .geometry import Geometry
from .layouts import Layout
from .ops import decode, storage_bits


def gather_sequence_kv(storage, layout: Layout, g: Geometry, block_table, seq_lens, *, k_scale=None, v_scale=None, layer=0):
    """fp32 K and V of every sequence, ``[S, T_max, H, D]``, plus the ``[S, T_max]`` valid mask."""
    N, H, D = g.block_size, g.num_kv_heads, g.head_size
    block_table = torch.as_tensor(block_table, dtype=torch.int64).cpu()
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64).cpu()
    positions = torch.arange(int(seq_lens.max()))
    valid = positions[None, :] < seq_lens[:, None]
    blocks = torch.where(valid, block_table[:, positions // N], 0)
    bits = storage_bits(storage, g)
    out = []
    for kv, scale in ((0, k_scale), (1, v_scale)):
        offs = layout.offsets(
            g, layer=layer, block=blocks[..., None, None], kv=kv,
            slot=(positions % N)[None, :, None, None], head=torch.arange(H)[:, None], dim=torch.arange(D),
        )
        raw = bits[offs.to(bits.device)].view(g.dtype)
        # Positions past a sequence read block 0's bytes; zero them so NaN garbage cannot leak.
        out.append(decode(raw, g, scale, head_dim=2).masked_fill(~valid[..., None, None].to(bits.device), 0.0))
    return out[0], out[1], valid.to(bits.device)


def paged_decode_attention(
    query: torch.Tensor, storage, layout: Layout, g: Geometry, block_table, seq_lens, *,
    scale: float | None = None, k_scale=None, v_scale=None, layer: int = 0,
) -> torch.Tensor:
    """One decode step: ``query [S, Hq, D]`` against each sequence's cached K/V → ``[S, Hq, D]``."""
    S, Hq, D = query.shape
    if Hq % g.num_kv_heads:
        raise ValueError(f"query heads {Hq} must be a multiple of num_kv_heads {g.num_kv_heads}")
    k, v, valid = gather_sequence_kv(storage, layout, g, block_table, seq_lens, k_scale=k_scale, v_scale=v_scale, layer=layer)
    group = Hq // g.num_kv_heads
    k = k.repeat_interleave(group, dim=2)
    v = v.repeat_interleave(group, dim=2)
    scale = D ** -0.5 if scale is None else scale
    scores = torch.einsum("shd,sthd->sht", query.float(), k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    out = torch.einsum("sht,sthd->shd", torch.softmax(scores, dim=-1), v)
    return out.to(query.dtype)
