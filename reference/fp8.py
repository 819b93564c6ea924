"""FP8 KV-cache formats and the write/read quantisation of SPEC §5 (FP8-*).

Write: ``q = cast(x / scale)`` computed in fp32, rounded to nearest-even, saturated to the
format's largest finite value (CUDA ``__NV_SATFINITE``). Read: ``x ≈ float(q) · scale``.
``scale`` is per tensor (one element) or per KV head (``[H]``).

Platforms: NVIDIA and AMD gfx950 store ``float8_e4m3fn`` (OCP, max 448, −0 = 0x80, NaN =
0x7F/0xFF); AMD gfx942 stores ``float8_e4m3fnuz`` (max 240, no −0, NaN = 0x80) and vLLM
doubles the checkpoint scales there, which makes in-range codes bit-identical (SPEC EQUIV-CROSS-MACHINE).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Fp8Format:
    name: str
    dtype: torch.dtype
    max_finite: float


FORMATS = {
    f.name: f
    for f in (
        Fp8Format("float8_e4m3fn", torch.float8_e4m3fn, 448.0),
        Fp8Format("float8_e4m3fnuz", torch.float8_e4m3fnuz, 240.0),
        Fp8Format("float8_e5m2", torch.float8_e5m2, 57344.0),
    )
}
FP8_DTYPES = frozenset(f.dtype for f in FORMATS.values())
KV_CACHE_DTYPES = ("fp8", "fp8_e4m3", "fp8_e5m2")  # vLLM kv_cache_dtype strings stored as fp8


def fp8_format(dtype_or_name) -> Fp8Format:
    """The format of a torch fp8 dtype or its name; ValueError for anything else."""
    key = str(dtype_or_name).removeprefix("torch.")
    if key not in FORMATS:
        raise ValueError(f"unknown fp8 format {dtype_or_name!r}; expected one of {sorted(FORMATS)}")
    return FORMATS[key]


def platform_e4m3(platform: str, arch: str = "") -> Fp8Format:
    """The e4m3 variant a platform stores for ``kv_cache_dtype="fp8"``: fnuz only on gfx94x."""
    if platform == "rocm" and "gfx94" in arch:
        return FORMATS["float8_e4m3fnuz"]
    return FORMATS["float8_e4m3fn"]


def cache_dtype_for(kv_cache_dtype: str, model_dtype: torch.dtype, platform: str = "cpu", arch: str = "") -> torch.dtype:
    """Storage dtype for a vLLM ``kv_cache_dtype`` string (``auto`` keeps the model dtype)."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype in ("fp8", "fp8_e4m3"):
        return platform_e4m3(platform, arch).dtype
    if kv_cache_dtype == "fp8_e5m2":
        return torch.float8_e5m2
    if kv_cache_dtype in FORMATS:
        return FORMATS[kv_cache_dtype].dtype
    raise ValueError(
        f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected auto, fp8, fp8_e4m3, fp8_e5m2 "
        f"or one of {sorted(FORMATS)}"
    )


def _scale_like(scale, x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Broadcast a per-tensor or per-head ``[H]`` scale against ``x`` (heads on ``head_dim``)."""
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if scale.numel() == 1:
        return scale.reshape(())
    shape = [1] * x.dim()
    shape[head_dim] = scale.numel()
    if x.shape[head_dim] != scale.numel():
        raise ValueError(f"per-head scale has {scale.numel()} entries for {x.shape[head_dim]} heads")
    return scale.reshape(shape)


def quantize(x: torch.Tensor, scale, fmt, head_dim: int = -2) -> torch.Tensor:
    """``cast(x / scale)`` with saturation to ±max finite; NaN stays NaN."""
    fmt = fp8_format(fmt) if not isinstance(fmt, Fp8Format) else fmt
    scaled = x.float() / _scale_like(scale, x, head_dim)
    return scaled.clamp(-fmt.max_finite, fmt.max_finite).to(fmt.dtype)


def dequantize(q: torch.Tensor, scale, head_dim: int = -2) -> torch.Tensor:
    """``float(q) · scale`` in fp32."""
    return q.float() * _scale_like(scale, q, head_dim)


def decode_codes(codes: torch.Tensor, fmt) -> torch.Tensor:
    """fp32 value of raw uint8 codes read as ``fmt``."""
    fmt = fp8_format(fmt) if not isinstance(fmt, Fp8Format) else fmt
    return codes.to(torch.uint8).view(fmt.dtype).float()


def convert_codes(codes: torch.Tensor, src, dst, value_ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode ``src`` codes as ``dst`` codes of ``value · value_ratio``.

    ``value_ratio = src_scale / dst_scale`` keeps the dequantised value. Returns the new
    uint8 codes and a mask of elements converted exactly (equal value, −0 counts as 0,
    NaN maps to NaN); saturated elements are inexact.
    """
    src_fmt, dst_fmt = fp8_format(src), fp8_format(dst)
    values = decode_codes(codes, src_fmt) * value_ratio
    out = quantize(values, 1.0, dst_fmt).view(torch.uint8)
    back = decode_codes(out, dst_fmt)
    exact = (back == values) | (torch.isnan(back) & torch.isnan(values))
    return out, exact


def fn_to_fnuz(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fn codes (scale s) → e4m3fnuz codes (scale 2s): bits kept, −0 → 0x00, NaN → 0x80."""
    return convert_codes(codes, "float8_e4m3fn", "float8_e4m3fnuz", 0.5)


def fnuz_to_fn(codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """e4m3fnuz codes (scale 2s) → e4m3fn codes (scale s); ±240·2 saturates to ±448."""
    return convert_codes(codes, "float8_e4m3fnuz", "float8_e4m3fn", 2.0)
