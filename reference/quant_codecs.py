"""Per-token-head encode/decode exactly as vLLM 0.33.0 computes it (SPEC §16 PTH-ENCODE-*), and
the ops over a :class:`~.quant_layouts.QuantGeometry` cache: write, gather, decode, copy, swap.

The encoder is ``_reshape_cache_per_token_head`` (vllm/v1/attention/ops/
triton_reshape_and_cache_flash.py), one (token, head, side) at a time, every step in float32::

    amax  = max_d |x_d|                       (x upcast from the model dtype, exact)
    scale = max(amax / QMAX, 1e-6)            (IEEE division; 1e-6 as float32)
    y_d   = x_d · (1 / scale)                 (a reciprocal, then a product: not x_d / scale)
    int8: code_d = trunc(clamp(y_d ± 0.5, -128, 127))   (+0.5 when y_d >= 0, else -0.5, in float32)
    fp8:  code_d = e4m3(clamp(y_d, -QMAX, QMAX))        (round to nearest even)

QMAX: int8 127; fp8 the platform's ``get_fp8_min_max``: 448 (e4m3fn: CUDA, gfx950, CPU) or
224 (e4m3fnuz on gfx942, not fnuz's 240). Decode: ``x ≈ float(code) · scale``.
"""

from __future__ import annotations

import torch

from . import fp8
from .quant_layouts import SCALE_BYTES, QuantGeometry, field_offsets

SCALE_FLOOR = 1e-6
INT8_MAX, INT8_MIN = 127.0, -128.0
FNUZ_QMAX = 224.0  # vLLM get_fp8_min_max on fnuz platforms (finfo says 240)


def code_dtype(mode: str, platform: str = "cpu", arch: str = "") -> torch.dtype:
    """The element dtype of the codes (the cache tensor's dtype for the fp8 mode)."""
    return torch.int8 if mode == "int8_per_token_head" else fp8.platform_e4m3(platform, arch).dtype


def quant_max(mode: str, platform: str = "cpu", arch: str = "") -> float:
    if mode == "int8_per_token_head":
        return INT8_MAX
    fmt = fp8.platform_e4m3(platform, arch)
    return FNUZ_QMAX if fmt.dtype == torch.float8_e4m3fnuz else fmt.max_finite


def encode(x: torch.Tensor, mode: str, platform: str = "cpu", arch: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` → (codes uint8 ``[..., D]``, scales float32 ``[...]``), one scale per row."""
    xf = x.float()
    qmax = quant_max(mode, platform, arch)
    amax = xf.abs().amax(dim=-1)
    scale = torch.clamp_min(amax / torch.tensor(qmax, dtype=torch.float32), SCALE_FLOOR)
    y = xf * (torch.tensor(1.0, dtype=torch.float32) / scale)[..., None]
    if mode == "int8_per_token_head":
        y = torch.where(y >= 0, y + 0.5, y - 0.5).clamp(INT8_MIN, INT8_MAX)
        codes = y.trunc().to(torch.int8)
    else:
        codes = y.clamp(-qmax, qmax).to(code_dtype(mode, platform, arch))
    return codes.view(torch.uint8), scale


def decode(codes: torch.Tensor, scales: torch.Tensor, mode: str, platform: str = "cpu", arch: str = "") -> torch.Tensor:
    """uint8 codes ``[..., D]`` and float32 scales ``[...]`` → float32 values."""
    values = codes.view(code_dtype(mode, platform, arch)).float()
    return values * scales[..., None]


def scale_bytes(scales: torch.Tensor) -> torch.Tensor:
    """float32 scales ``[...]`` → their little-endian bytes ``[..., 4]``."""
    return scales.to(torch.float32).contiguous().view(torch.uint8).reshape(*scales.shape, SCALE_BYTES)


def scales_from_bytes(raw: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., 4]`` → float32 ``[...]``."""
    return raw.contiguous().view(torch.float32).reshape(raw.shape[:-1])


def initialise_scales(region: torch.Tensor, g: QuantGeometry, layer: int = 0) -> None:
    """``_ensure_scale_caches``: the first time a layer's scale views are built, every K and V
    scale of that layer (every block, slot and head) becomes 1.0; codes are left as they are."""
    where = field_offsets(g, torch.arange(g.num_blocks)[:, None, None], torch.arange(g.block_size)[:, None], torch.arange(g.num_kv_heads), layer)
    one = scale_bytes(torch.ones(1))[0]
    for side in ("k_scale", "v_scale"):
        region[where[side]] = one


def write(key, value, region: torch.Tensor, g: QuantGeometry, slot_mapping, *, platform: str = "cpu", arch: str = "", layer: int = 0) -> None:
    """``triton_reshape_and_cache_flash_per_token_head_quant``: token ``t`` of ``key``/``value``
    ``[T, H, D]`` into slot ``slot_mapping[t]`` of ``region`` (uint8, ``g.nbytes()``); slot -1 is
    padding; rows past ``len(slot_mapping)`` are not read. Writes the codes and the scale of each
    (head, slot, side) and nothing else."""
    slots = torch.as_tensor(slot_mapping, dtype=torch.int64).cpu()
    if key.shape[1:] != (g.num_kv_heads, g.head_size) or value.shape[1:] != key.shape[1:]:
        raise ValueError(f"key/value: expected [T, {g.num_kv_heads}, {g.head_size}], got {tuple(key.shape)} / {tuple(value.shape)}")
    if key.shape[0] < len(slots):
        raise ValueError(f"key: {key.shape[0]} rows for {len(slots)} slots")
    if bool(((slots < -1) | (slots >= g.num_blocks * g.block_size)).any()):
        raise ValueError(f"slot_mapping: values outside [-1, {g.num_blocks * g.block_size})")
    rows = torch.nonzero(slots >= 0).flatten()
    slots = slots[rows]
    heads = torch.arange(g.num_kv_heads)
    where = field_offsets(g, (slots // g.block_size)[:, None], (slots % g.block_size)[:, None], heads, layer)
    for side, x in (("k", key), ("v", value)):
        codes, scales = encode(x.cpu()[rows], g.mode, platform, arch)
        region[where[f"{side}_data"].flatten()] = codes.flatten()
        region[where[f"{side}_scale"].flatten()] = scale_bytes(scales).flatten()


def gather(region: torch.Tensor, g: QuantGeometry, block_table, seq_lens, *, layer: int = 0) -> dict[str, torch.Tensor]:
    """Each field of every cached token: ``k_data``/``v_data`` uint8 ``[S, T_max, H, D]``,
    ``k_scale``/``v_scale`` float32 ``[S, T_max, H]``, and ``valid`` ``[S, T_max]``."""
    block_table = torch.as_tensor(block_table, dtype=torch.int64).cpu()
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64).cpu()
    positions = torch.arange(int(seq_lens.max()))
    valid = positions[None, :] < seq_lens[:, None]
    blocks = torch.where(valid, block_table[:, positions // g.block_size], 0)
    where = field_offsets(g, blocks[..., None], (positions % g.block_size)[None, :, None], torch.arange(g.num_kv_heads), layer)
    region = region.cpu()
    out = {name: region[offs] for name, offs in where.items()}
    out["k_scale"], out["v_scale"] = scales_from_bytes(out["k_scale"]), scales_from_bytes(out["v_scale"])
    out["valid"] = valid
    return out


def dequantised_kv(region, g: QuantGeometry, block_table, seq_lens, *, platform: str = "cpu", arch: str = "", layer: int = 0):
    """float32 K, V ``[S, T_max, H, D]`` as the decode must see them, and the valid mask;
    positions past a sequence are zero (their garbage must not leak as NaN)."""
    f = gather(region, g, block_table, seq_lens, layer=layer)
    mask = ~f["valid"][..., None, None]
    k = decode(f["k_data"], f["k_scale"], g.mode, platform, arch).masked_fill(mask, 0.0)
    v = decode(f["v_data"], f["v_scale"], g.mode, platform, arch).masked_fill(mask, 0.0)
    return k, v, f["valid"]


def paged_decode(query, region, g: QuantGeometry, block_table, seq_lens, *, scale: float, platform: str = "cpu", arch: str = "", layer: int = 0):
    """One decode step over the quantised cache: SDPA of ``query [S, Hq, D]`` on the
    dequantised K/V (GQA: query head q reads KV head ``q // (Hq / H)``), float32, model dtype out."""
    k, v, valid = dequantised_kv(region, g, block_table, seq_lens, platform=platform, arch=arch, layer=layer)
    group = query.shape[1] // g.num_kv_heads
    k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    scores = torch.einsum("shd,sthd->sht", query.float().cpu(), k) * scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    return torch.einsum("sht,sthd->shd", torch.softmax(scores, dim=-1), v).to(query.dtype)


def _pages(g: QuantGeometry, blocks) -> torch.Tensor:
    """Byte offsets ``[len(blocks)·L, page]`` of whole pages, every layer."""
    blocks = torch.as_tensor(blocks, dtype=torch.int64).cpu()
    starts = (torch.arange(g.num_layers)[:, None] * g.layer_bytes() + blocks[None, :] * g.page_bytes).flatten()
    return starts[:, None] + torch.arange(g.page_bytes)


def copy_blocks(region: torch.Tensor, g: QuantGeometry, block_mapping) -> None:
    """Each ``[src, dst]`` row copies a whole page, codes and scales, every layer (in order)."""
    for src, dst in torch.as_tensor(block_mapping, dtype=torch.int64).reshape(-1, 2).tolist():
        region[_pages(g, [dst])] = region[_pages(g, [src])]


def swap_blocks(src_region: torch.Tensor, src_g: QuantGeometry, dst_region: torch.Tensor, dst_g: QuantGeometry, src_ids, dst_ids) -> None:
    """``dst[dst_ids[i]] = src[src_ids[i]]``: whole pages, codes and scales, every layer."""
    if (src_g.page_bytes, src_g.num_layers) != (dst_g.page_bytes, dst_g.num_layers):
        raise ValueError(f"swap: pages differ ({src_g.short()} vs {dst_g.short()})")
    dst_region[_pages(dst_g, dst_ids)] = src_region.cpu()[_pages(src_g, src_ids)].to(dst_region.device)
