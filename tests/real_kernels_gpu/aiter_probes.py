"""AITER's fused KV writer on the values an identity RoPE is asked to keep, and on a slot mapping
shorter than the keys: what lands in the cache, byte for byte.

    KVCONFORM_AITER=DIR python -m tests.real_kernels_gpu.aiter_probes     # GPU, or CPU under TRITON_INTERPRET=1

One head of K per probe, D = 64, neox rotation (partner of dim d: d ± 32), cos = 1, sin = 0 in the
model dtype, as the aiter: adapters call ``fused_qk_rope_reshape_and_cache``:

- K = −0 at dims whose partner is +1, and at dims whose partner is −1;
- K = 1 at dims whose partner is +inf, −inf or NaN;
- 4 key rows, 2 slots, two query heads per KV head: which slots get written when the slot
  tensor is the prefix of a buffer holding slot 5 beyond it;
- compiled only: the suite's fp8 edge rows (every side, exact and near ties) against the
  reference encoder, each differing code classified — K whose rotation partner is ±inf/NaN
  (``x + partner·0`` is NaN), K −0 stored +0, or anything else (listed).
"""

from __future__ import annotations

import torch

from kvconform import reference as R
from kvconform.backends_under_test import aiter_backend
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.conformance.harness.case import fp8_edge_rows

D = 64


def write(kernel, key, value, slots, flash=True, query_heads=2):
    """K and V of ``key``/``value`` ``[T, H, D]`` written into a flash-layout cache of 8 blocks of 16."""
    device = key.device
    H = key.shape[1]
    k_cache, v_cache = (torch.zeros(8, 16, H, D, dtype=key.dtype, device=device) for _ in range(2))
    cos, sin = torch.tensor([[1.0] * (D // 2) + [0.0] * (D // 2)], dtype=key.dtype, device=device).chunk(2, dim=-1)
    query = torch.zeros(key.shape[0], query_heads * H, D, dtype=key.dtype, device=device)
    kernel(query, key, value, k_cache, v_cache, slots, torch.zeros(key.shape[0], dtype=torch.int64, device=device), cos, sin,
           torch.ones(1, device=device), torch.ones(1, device=device), True, flash_layout=flash, apply_scale=False, output_zeros=False)
    return k_cache, v_cache


def special_values(kernel, dtype, device) -> list[str]:
    key = torch.ones(1, 1, D, dtype=dtype)
    key[0, 0, 0], key[0, 0, 32] = -0.0, 1.0      # −0 at dim 0, partner (dim 32) +1
    key[0, 0, 1], key[0, 0, 33] = -0.0, -1.0     # −0 at dim 1, partner −1
    key[0, 0, 2], key[0, 0, 34] = 1.0, float("inf")
    key[0, 0, 3], key[0, 0, 35] = 1.0, float("-inf")
    key[0, 0, 4], key[0, 0, 36] = 1.0, float("nan")
    value = key.clone()
    k_cache, v_cache = write(kernel, key.to(device), value.to(device), torch.tensor([0], device=device))
    bits = lambda t: f"{int(t.view(torch.int16)) & 0xFFFF:04x}"  # noqa: E731
    lines = []
    for dim, what in ((0, "K=-0, partner +1"), (1, "K=-0, partner -1"), (2, "K=1, partner +inf"), (3, "K=1, partner -inf"), (4, "K=1, partner NaN")):
        stored, given = k_cache[0, 0, 0, dim].cpu(), key[0, 0, dim]
        lines.append(f"{str(dtype)[6:]:>8} {what:<18}: K stored {float(stored)!r:>6} ({bits(stored)}), given {float(given)!r} ({bits(given)}); "
                     f"V stored {bits(v_cache[0, 0, 0, dim].cpu())}")
    return lines


def short_slot_mapping(kernel, dtype, device, query_heads) -> str:
    buffer = torch.full((4,), 5, dtype=torch.int64, device=device)
    buffer[:2] = torch.tensor([33, 79])
    key, value = (torch.randn(4, 2, D, dtype=dtype, device=device) for _ in range(2))
    k_cache, _ = write(kernel, key, value, buffer[:2], query_heads=query_heads)
    slots = (k_cache.reshape(8 * 16, -1) != 0).any(-1).nonzero().flatten().tolist()
    return f"{str(dtype)[6:]:>8} 4 key rows, slot_mapping [33, 79] (buffer continues with slot 5), {query_heads} query heads per KV head: slots written {slots}"


def fp8_edge_values(kernel, model_dtype, kv_cache_dtype, ties) -> str:
    """The edge-value check's rows (8 tokens, 2 heads) through AITER into an fp8 flash cache, every code classified."""
    fmt = R.fp8.fp8_format(R.fp8.cache_dtype_for(kv_cache_dtype, model_dtype, "cuda", "sm90"))
    g = R.Geometry(num_blocks=8, block_size=16, num_kv_heads=2, head_size=D, dtype=fmt.dtype)
    key, value = fp8_edge_rows(CacheSpec(layout=R.blocks_first("NHD"), geometry=g, kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype), 8, 0, 0.5, 4.0)
    near = 2.0**-20
    k_scale, v_scale = (0.5, 4.0) if ties == "exact" else (0.5 * (1 - near), 4.0 * (1 + near))
    k_cache, v_cache = (torch.zeros(8, 16, 2, D, dtype=fmt.dtype, device="cuda") for _ in range(2))
    slots = torch.arange(8, device="cuda") * 2 + 32
    cos, sin = torch.tensor([[1.0] * (D // 2) + [0.0] * (D // 2)], dtype=model_dtype, device="cuda").chunk(2, dim=-1)
    kernel(torch.zeros(8, 4, D, dtype=model_dtype, device="cuda"), key.cuda(), value.cuda(), k_cache, v_cache, slots,
           torch.zeros(8, dtype=torch.int64, device="cuda"), cos, sin, torch.tensor([k_scale], device="cuda"), torch.tensor([v_scale], device="cuda"),
           True, flash_layout=True, apply_scale=True, output_zeros=False)
    counts, others = {"K: rotation partner is +-inf or NaN": 0, "K: -0 stored as +0": 0, "V": 0, "K: other": 0}, []
    for side, x, cache, scale in (("K", key, k_cache, k_scale), ("V", value, v_cache, v_scale)):
        got = cache[slots.cpu() // 16, slots.cpu() % 16].cpu().view(torch.uint8)
        want = R.fp8.quantize(x, scale, fmt).view(torch.uint8)
        partner = torch.cat([x[..., D // 2:], x[..., : D // 2]], dim=-1)
        both_nan = torch.isnan(got.view(fmt.dtype).float()) & torch.isnan(want.view(fmt.dtype).float())  # any NaN code (SPEC FP8-NAN)
        for i in ((got != want) & ~both_nan).nonzero().tolist():
            if side == "V":
                kind = "V"
            elif not torch.isfinite(partner[tuple(i)].float()):
                kind = "K: rotation partner is +-inf or NaN"
            elif float(x[tuple(i)]) == 0 and int(got[tuple(i)]) == 0:
                kind = "K: -0 stored as +0"
            else:
                kind = "K: other"
            counts[kind] += 1
            if kind in ("V", "K: other") and len(others) < 4:
                others.append(f"{side} x={float(x[tuple(i)])!r} code {int(got[tuple(i)]):02x} reference {int(want[tuple(i)]):02x}")
    total = sum(counts.values())
    return (f"{str(model_dtype)[6:]:>8} {kv_cache_dtype:>8} {ties:>5} ties: {total} codes differ from the reference: "
            + ", ".join(f"{k} {v}" for k, v in counts.items()) + (f"; {'; '.join(others)}" if others else ""))


def main() -> None:
    kernel = aiter_backend.fused_kv_cache().fused_qk_rope_reshape_and_cache
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in (torch.bfloat16, torch.float16):
        if device == "cpu" and dtype == torch.bfloat16:
            continue  # the interpreter's bf16 arithmetic defect (backends_under_test/triton_interpreter.py)
        print("\n".join(special_values(kernel, dtype, device)), flush=True)
        for query_heads in (1, 2):
            print(short_slot_mapping(kernel, dtype, device, query_heads), flush=True)
        if device == "cuda":  # the interpreter's fp8 casts drop the rounding carry
            for kv_cache_dtype in ("fp8", "fp8_e5m2"):
                for ties in ("exact", "near"):
                    print(fp8_edge_values(kernel, dtype, kv_cache_dtype, ties), flush=True)


if __name__ == "__main__":
    main()
