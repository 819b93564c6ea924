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

``nvfp4`` (``reshape_and_cache_nvfp4_kernel``, csrc/nvfp4_kv_cache_kernels.cu, with
``cvt_warp_fp16_to_fp4`` of csrc/quantization/fp4/nvfp4_utils.cuh), per group of 16 values of one
(token, head, side), every step in float32, ``k_scale`` the checkpoint's per-tensor scale::

    g     = 1 / k_scale                       (IEEE division: that file is built without fast math)
    sf    = e4m3fn_satfinite(g · (amax16 · rcp(6)))          (round to nearest even, at most 448)
    out   = rcp(float(sf) · rcp(g)) if sf != 0 else 0
    code  = e2m1_satfinite(x · out)           (round to nearest even, at most 6, sign kept)

``rcp`` is ``rcp.approx.ftz.f32``; the reference takes it as the correctly rounded reciprocal
(PTX: at most 1 ulp off), so only values within an ulp of an e2m1 or e4m3 rounding boundary can
differ on hardware. Decode (vLLM's ``dequant_nvfp4_kv_cache``): ``e2m1(code) · (float(sf) · k_scale)``.
"""

from __future__ import annotations

import torch

from . import fp8
from .quant_layouts import NVFP4, NVFP4_GROUP, SCALE_BYTES, QuantGeometry, field_offsets

SCALE_FLOOR = 1e-6
INT8_MAX, INT8_MIN = 127.0, -128.0
FNUZ_QMAX = 224.0  # vLLM get_fp8_min_max on fnuz platforms (finfo says 240)
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # magnitude code 0..7; bit 3 the sign
# Midpoints between neighbouring e2m1 magnitudes; a tie goes to the even code: down at 0.25, 1.25,
# 2.5, 5 (round_to_nearest_e2m1, csrc/nvfp4_kv_cache_kernels.cu:50-72, "matches cvt.rn.satfinite").
E2M1_TIES_DOWN = torch.tensor([0.25, 1.25, 2.5, 5.0])
E2M1_TIES_UP = torch.tensor([0.75, 1.75, 3.5])
E4M3_MAX = 448.0
ONE = torch.tensor(1.0, dtype=torch.float32)


def e2m1_codes(y: torch.Tensor) -> torch.Tensor:
    """float32 → e2m1 codes (uint8, 0..15): nearest, ties to even, |y| > 5 saturating to 6, sign
    bit 3 kept (a negative value that rounds to zero is 0x8)."""
    ay = y.abs()[..., None]
    magnitude = (ay > E2M1_TIES_DOWN).sum(-1) + (ay >= E2M1_TIES_UP).sum(-1)
    return (magnitude + 8 * torch.signbit(y)).to(torch.uint8)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (0..15) → float32."""
    codes = codes.long()
    return torch.where(codes >= 8, -1.0, 1.0) * E2M1_VALUES[codes & 7]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """e2m1 codes ``[..., D]`` → bytes ``[..., D/2]``: the even element in the low nibble
    (``cvt.rn.satfinite.e2m1x2.f32 b, odd, even``: nvfp4_utils.cuh:130-137)."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def nvfp4_encode(x: torch.Tensor, k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [..., D]`` → (packed e2m1 ``[..., D/2]``, e4m3 block-scale bytes ``[..., D/16]``)."""
    xf = x.float().unflatten(-1, (-1, NVFP4_GROUP))
    g = ONE / torch.tensor(k_scale, dtype=torch.float32)
    sf = g * (xf.abs().amax(dim=-1) * (ONE / 6.0))
    sf_codes = sf.clamp(max=E4M3_MAX).to(torch.float8_e4m3fn)  # satfinite, then nearest even
    sf_values = sf_codes.float()
    out = torch.where(sf_values != 0, ONE / (sf_values * (ONE / g)), 0.0)
    codes = e2m1_codes(xf * out[..., None]).flatten(-2)
    return pack_nibbles(codes), sf_codes.view(torch.uint8)


def nvfp4_decode(packed: torch.Tensor, sf_bytes: torch.Tensor, k_scale: float) -> torch.Tensor:
    """Packed e2m1 ``[..., D/2]`` and e4m3 scale bytes ``[..., D/16]`` → float32 ``[..., D]``."""
    values = e2m1_values(unpack_nibbles(packed)).unflatten(-1, (-1, NVFP4_GROUP))
    scales = sf_bytes.view(torch.float8_e4m3fn).float() * torch.tensor(k_scale, dtype=torch.float32)
    return (values * scales[..., None]).flatten(-2)


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
    # Divisors as tensors on x's device: CUDA torch divides by a CPU scalar as a product with its
    # reciprocal (not IEEE division; 1 ulp off in some scales), which vLLM's kernel does not.
    scale = torch.clamp_min(amax / torch.tensor(qmax, dtype=torch.float32, device=xf.device), SCALE_FLOOR)
    y = xf * (torch.tensor(1.0, dtype=torch.float32, device=xf.device) / scale)[..., None]
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
    if g.mode == NVFP4:
        return  # FlashInfer builds its nvfp4 views without writing (NVFP4-WRITE-ONLY)
    where = field_offsets(g, torch.arange(g.num_blocks)[:, None, None], torch.arange(g.block_size)[:, None], torch.arange(g.num_kv_heads), layer)
    one = scale_bytes(torch.ones(1))[0]
    for side in ("k_scale", "v_scale"):
        region[where[side]] = one


def encoded_fields(x: torch.Tensor, g: QuantGeometry, *, platform: str = "cpu", arch: str = "", k_scale: float = 1.0):
    """Rows ``[..., D]`` → (data bytes ``[..., data_bytes]``, scale bytes ``[..., scale_count]``)
    of ``g.mode``; ``k_scale`` is the side's checkpoint scale (nvfp4 only)."""
    if g.mode == NVFP4:
        return nvfp4_encode(x, k_scale)
    codes, scales = encode(x, g.mode, platform, arch)
    return codes, scale_bytes(scales)


def decoded_fields(data: torch.Tensor, scale_raw: torch.Tensor, g: QuantGeometry, *, platform: str = "cpu", arch: str = "",
                   k_scale: float = 1.0) -> torch.Tensor:
    """The inverse of :func:`encoded_fields`: float32 ``[..., D]``."""
    if g.mode == NVFP4:
        return nvfp4_decode(data, scale_raw, k_scale)
    return decode(data, scales_from_bytes(scale_raw), g.mode, platform, arch)


def write(key, value, region: torch.Tensor, g: QuantGeometry, slot_mapping, *, platform: str = "cpu", arch: str = "", layer: int = 0,
          k_scale: float = 1.0, v_scale: float = 1.0) -> None:
    """``triton_reshape_and_cache_flash_per_token_head_quant`` / ``reshape_and_cache_nvfp4``: token
    ``t`` of ``key``/``value`` ``[T, H, D]`` into slot ``slot_mapping[t]`` of ``region`` (uint8,
    ``g.nbytes()``); slot -1 is padding; rows past ``len(slot_mapping)`` are not read. Writes the
    codes and the scales of each (head, slot, side) and nothing else."""
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
    for side, x, checkpoint_scale in (("k", key, k_scale), ("v", value, v_scale)):
        data, scales = encoded_fields(x.cpu()[rows], g, platform=platform, arch=arch, k_scale=checkpoint_scale)
        region[where[f"{side}_data"].flatten()] = data.flatten()
        region[where[f"{side}_scale"].flatten()] = scales.flatten()


def gather(region: torch.Tensor, g: QuantGeometry, block_table, seq_lens, *, layer: int = 0) -> dict[str, torch.Tensor]:
    """The bytes of each field of every cached token, ``[S, T_max, H, n]`` uint8 (n as
    :func:`~.quant_layouts.field_offsets` says), and ``valid`` ``[S, T_max]``."""
    block_table = torch.as_tensor(block_table, dtype=torch.int64).cpu()
    seq_lens = torch.as_tensor(seq_lens, dtype=torch.int64).cpu()
    positions = torch.arange(int(seq_lens.max()))
    valid = positions[None, :] < seq_lens[:, None]
    blocks = torch.where(valid, block_table[:, positions // g.block_size], 0)
    where = field_offsets(g, blocks[..., None], (positions % g.block_size)[None, :, None], torch.arange(g.num_kv_heads), layer)
    region = region.cpu()
    out = {name: region[offs] for name, offs in where.items()}
    out["valid"] = valid
    return out


def dequantised_kv(region, g: QuantGeometry, block_table, seq_lens, *, platform: str = "cpu", arch: str = "", layer: int = 0,
                   k_scale: float = 1.0, v_scale: float = 1.0):
    """float32 K, V ``[S, T_max, H, D]`` as the decode must see them, and the valid mask;
    positions past a sequence are zero (their garbage must not leak as NaN)."""
    f = gather(region, g, block_table, seq_lens, layer=layer)
    mask = ~f["valid"][..., None, None]
    k, v = (decoded_fields(f[f"{side}_data"], f[f"{side}_scale"], g, platform=platform, arch=arch, k_scale=checkpoint_scale).masked_fill(mask, 0.0)
            for side, checkpoint_scale in (("k", k_scale), ("v", v_scale)))
    return k, v, f["valid"]


def paged_decode(query, region, g: QuantGeometry, block_table, seq_lens, *, scale: float, platform: str = "cpu", arch: str = "", layer: int = 0,
                 k_scale: float = 1.0, v_scale: float = 1.0):
    """One decode step over the quantised cache: SDPA of ``query [S, Hq, D]`` on the
    dequantised K/V (GQA: query head q reads KV head ``q // (Hq / H)``), float32, model dtype out."""
    k, v, valid = dequantised_kv(region, g, block_table, seq_lens, platform=platform, arch=arch, layer=layer, k_scale=k_scale, v_scale=v_scale)
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


def reblock(src_region: torch.Tensor, src_g: QuantGeometry, dst_region: torch.Tensor, dst_g: QuantGeometry, src_table, dst_table,
            num_tokens: int) -> None:
    """Token ``t < num_tokens`` of ``src_table[t // N_src]`` slot ``t % N_src`` into
    ``dst_table[t // N_dst]`` slot ``t % N_dst``, every field (codes and scales) and layer, byte by
    byte of :func:`field_offsets` — so nvfp4's V scales land swizzled for their new slot."""
    t = torch.arange(num_tokens)
    heads = torch.arange(src_g.num_kv_heads)
    for layer in range(src_g.num_layers):
        src, dst = (field_offsets(g, torch.as_tensor(table)[t // g.block_size][:, None], (t % g.block_size)[:, None], heads, layer)
                    for g, table in ((src_g, src_table), (dst_g, dst_table)))
        for name in src:
            dst_region[dst[name].flatten()] = src_region[src[name].flatten()].to(dst_region.device)


def swap_blocks(src_region: torch.Tensor, src_g: QuantGeometry, dst_region: torch.Tensor, dst_g: QuantGeometry, src_ids, dst_ids) -> None:
    """``dst[dst_ids[i]] = src[src_ids[i]]``: whole pages, codes and scales, every layer."""
    if (src_g.page_bytes, src_g.num_layers) != (dst_g.page_bytes, dst_g.num_layers):
        raise ValueError(f"swap: pages differ ({src_g.short()} vs {dst_g.short()})")
    dst_region[_pages(dst_g, dst_ids)] = src_region.cpu()[_pages(src_g, src_ids)].to(dst_region.device)
