"""The bytes of one latent-cache record and how their scales are chosen (SPEC §17).

Pure functions of token rows: no addresses here (those live in :mod:`reference.latent`).
Every computation follows vLLM 0.33.0's ``csrc/cache_kernels.cu`` in float32, in the order the
kernels use, so the bytes are the kernels' bytes:

* ``fp8_ds_mla`` (DSMLA-RECORD): 512 e4m3 codes in four 128-value tiles, four float32 tile
  scales, 64 raw 16-bit RoPE values — 656 bytes.
* indexer keys (IDX-SCALE): e4m3 codes, one scale per 128 values, float32 or UE8M0 or packed MX.
"""

from __future__ import annotations

import dataclasses

import torch

from . import fp8

DS_MLA_RANK = 512
DS_MLA_ROPE = 64
DS_MLA_TILE = 128
DS_MLA_RECORD_BYTES = DS_MLA_RANK + 4 * (DS_MLA_RANK // DS_MLA_TILE) + 2 * DS_MLA_ROPE  # 656
INDEXER_GROUP = 128  # values sharing one indexer scale (vLLM's warp of 32 lanes x 4 values)
MX_GROUP = 32  # values per UE8M0 byte in the packed MX scale
VERSIONS = ("0.33.0",)
PLATFORMS = ("cpu", "cuda", "rocm")


@dataclasses.dataclass(frozen=True)
class ScalePolicy:
    """How a per-tile (ds_mla) or per-128-values (indexer) scale ``s`` is derived from ``amax``.

    ``floor_applies_to == "scale"``: ``s = max(amax / divisor, floor)`` (ds_mla);
    ``"amax"``: ``s = max(amax, floor) / divisor`` (indexer). With ``pow2``,
    ``s = exp2(ceil(log2(s)))``, evaluated in float32 as the kernels do. Every step is a float32
    operation; ``amax`` ignores NaN (CUDA ``fmaxf``).
    """

    divisor: float
    floor: float
    pow2: bool
    floor_applies_to: str = "scale"

    def __post_init__(self):
        if not self.divisor > 0 or not self.floor > 0:
            raise ValueError(f"ScalePolicy: divisor and floor must be > 0, got {self.divisor}, {self.floor}")
        if self.floor_applies_to not in ("scale", "amax"):
            raise ValueError(f"ScalePolicy.floor_applies_to must be 'scale' or 'amax', got {self.floor_applies_to!r}")

    @staticmethod
    def ds_mla(version: str = "0.33.0", platform: str = "cuda", arch: str = "") -> ScalePolicy:
        """``concat_and_cache_ds_mla_kernel`` (cache_kernels.cu:610-611): floor 1e-4 on the scale, power of two."""
        return ScalePolicy(fp8_scale_divisor(version, platform, arch), 1e-4, True, "scale")

    @staticmethod
    def indexer(scale_format: str, platform: str = "cuda", arch: str = "") -> ScalePolicy:
        """``indexer_k_quant_and_cache_kernel`` (cache_kernels.cu:681-685): floor 1e-4 on amax; UE8M0 and MX
        round up to a power of two (``use_ue8m0 = mxfp8 || ue8m0``, cache_kernels.cu:1963-1964)."""
        if scale_format not in ("float32", "ue8m0", "mx"):
            raise ValueError(f"scale_format must be one of float32, ue8m0, mx; got {scale_format!r}")
        return ScalePolicy(fp8_scale_divisor("0.33.0", platform, arch), 1e-4, scale_format != "float32", "amax")

    def scales(self, amax: torch.Tensor) -> torch.Tensor:
        """float32 scales for float32 ``amax`` values (any shape)."""
        amax = amax.float()
        # The divisor as a tensor on amax's device: CUDA torch divides by a Python scalar as a
        # product with its reciprocal, not the kernels' IEEE division (1 ulp off in some scales).
        floor, divisor = (torch.tensor(v, dtype=torch.float32, device=amax.device) for v in (self.floor, self.divisor))
        if self.floor_applies_to == "scale":
            scale = torch.maximum(amax / divisor, floor)
        else:
            scale = torch.maximum(amax, floor) / divisor
        if self.pow2:
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        return scale


def fp8_scale_divisor(version: str, platform: str, arch: str = "") -> float:
    """``kFp8ScaleDivisor``: 224 only when compiled for ``__gfx942__`` (fnuz, max 240), else 448
    (cache_kernels.cu:31-35). gfx950 and every CUDA arch divide by 448."""
    if version not in VERSIONS:
        raise ValueError(f"version {version!r} has no known scale policy; known: {', '.join(VERSIONS)}")
    if platform not in PLATFORMS:
        raise ValueError(f"platform must be one of {', '.join(PLATFORMS)}; got {platform!r}")
    return 224.0 if platform == "rocm" and "gfx942" in arch else 448.0


def group_amax(x: torch.Tensor, group: int) -> torch.Tensor:
    """``max |x|`` over consecutive groups of the last dim, NaN ignored (``fmaxf``): ``[..., n/group]``."""
    mags = x.float().abs()
    mags = torch.where(torch.isnan(mags), 0.0, mags)  # fmaxf skips NaN; an inf stays inf (nan_to_num would make it float max)
    return mags.unflatten(-1, (-1, group)).amax(dim=-1)


def encode_groups(x: torch.Tensor, scales: torch.Tensor, group: int, e4m3: fp8.Fp8Format) -> torch.Tensor:
    """uint8 e4m3 codes of ``x / scale`` per group (float32 division, saturating, as ``scaled_convert``)."""
    scaled = x.float().unflatten(-1, (-1, group)) / scales[..., None]
    return fp8.quantize(scaled.flatten(-2), 1.0, e4m3).view(torch.uint8)


def decode_groups(codes: torch.Tensor, scales: torch.Tensor, group: int, e4m3: fp8.Fp8Format) -> torch.Tensor:
    """float32 ``float(code) · scale`` per group."""
    values = fp8.decode_codes(codes, e4m3).unflatten(-1, (-1, group)) * scales[..., None]
    return values.flatten(-2)


def ds_mla_records(kv_c: torch.Tensor, k_pe: torch.Tensor, policy: ScalePolicy, e4m3: fp8.Fp8Format) -> torch.Tensor:
    """uint8 ``[T, 656]`` records of rows ``kv_c [T, 512]`` and ``k_pe [T, 64]`` (or ``[T, 0]``: zero tail).

    Bytes ``[0, 512)`` e4m3 codes of tile ``i = d // 128`` divided by scale ``i``; ``[512, 528)`` the four
    float32 scales, little-endian; ``[528, 656)`` the 64 RoPE values' 16-bit patterns unchanged.
    """
    T = kv_c.shape[0]
    scales = policy.scales(group_amax(kv_c, DS_MLA_TILE))
    nope = encode_groups(kv_c, scales, DS_MLA_TILE, e4m3)
    if k_pe.shape[1] == 0:
        rope = torch.zeros(T, 2 * DS_MLA_ROPE, dtype=torch.uint8)
    else:
        rope = k_pe.contiguous().view(torch.uint8)
    return torch.cat([nope, scales.contiguous().view(torch.uint8), rope], dim=1)


def ds_mla_fields(records: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(codes [T, 512] uint8, scales [T, 4] float32, rope bits [T, 128] uint8)`` of 656-byte records."""
    records = records.reshape(-1, DS_MLA_RECORD_BYTES).contiguous()
    scales = records[:, DS_MLA_RANK:DS_MLA_RANK + 16].contiguous().view(torch.float32)
    return records[:, :DS_MLA_RANK], scales, records[:, DS_MLA_RANK + 16:]


def upconvert_ds_mla(records: torch.Tensor, model_dtype: torch.dtype, e4m3: fp8.Fp8Format) -> torch.Tensor:
    """``[T, 576]`` in ``model_dtype``: NoPE ``round(float(code) · scale)`` to ``model_dtype``, RoPE bits as
    stored (``gather_and_upconvert_fp8_token``, cache_kernels.cu:1466-1490; vLLM's reader is bf16 only)."""
    codes, scales, rope = ds_mla_fields(records)
    nope = decode_groups(codes, scales, DS_MLA_TILE, e4m3).to(model_dtype)
    return torch.cat([nope, rope.contiguous().view(model_dtype)], dim=1)


def indexer_quantize(k: torch.Tensor, policy: ScalePolicy, scale_format: str, e4m3: fp8.Fp8Format
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes [T, D] uint8, scale bytes [T, D/32] uint8)`` of indexer keys ``k [T, D]``.

    One scale per 128 values. ``float32``/``ue8m0``: the float32 scale's 4 bytes per group; ``mx``: the
    scale's biased exponent byte ``(bits >> 23) & 0xFF`` repeated for each 32 values (cache_kernels.cu:696-700).
    """
    scales = policy.scales(group_amax(k, INDEXER_GROUP))
    codes = encode_groups(k, scales, INDEXER_GROUP, e4m3)
    if scale_format == "mx":
        exponent = ((scales.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
        scale_bytes = exponent.repeat_interleave(INDEXER_GROUP // MX_GROUP, dim=1)
    else:
        scale_bytes = scales.contiguous().view(torch.uint8)
    return codes, scale_bytes


def indexer_scales(scale_bytes: torch.Tensor, scale_format: str) -> torch.Tensor:
    """float32 scale per 128-value group from stored scale bytes ``[T, D/32]``."""
    scale_bytes = scale_bytes.contiguous()
    if scale_format == "mx":
        exponent = scale_bytes[:, :: INDEXER_GROUP // MX_GROUP].to(torch.int32)
        return (exponent << 23).view(torch.float32)
    return scale_bytes.view(torch.float32)
