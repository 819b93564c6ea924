"""AITER's fused KV writer on the values an identity RoPE is asked to keep, and on a slot mapping
shorter than the keys: what lands in the cache, byte for byte.

    KVCONFORM_AITER=DIR python -m tests.real_kernels_gpu.aiter_probes     # GPU, or CPU under TRITON_INTERPRET=1

One head of K per probe, D = 64, neox rotation (partner of dim d: d ± 32), cos = 1, sin = 0 in the
model dtype, as the aiter: adapters call ``fused_qk_rope_reshape_and_cache``:

- K = −0 at dims whose partner is +1, and at dims whose partner is −1;
- K = 1 at dims whose partner is +inf, −inf or NaN;
- 4 key rows, 2 slots, two query heads per KV head: which slots get written when the slot
  tensor is the prefix of a buffer holding slot 5 beyond it.
"""

from __future__ import annotations

import torch

from kvconform.backends_under_test import aiter_backend

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


def main() -> None:
    kernel = aiter_backend.fused_kv_cache().fused_qk_rope_reshape_and_cache
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for dtype in (torch.bfloat16, torch.float16):
        if device == "cpu" and dtype == torch.bfloat16:
            continue  # the interpreter's bf16 arithmetic defect (backends_under_test/triton_interpreter.py)
        print("\n".join(special_values(kernel, dtype, device)), flush=True)
        for query_heads in (1, 2):
            print(short_slot_mapping(kernel, dtype, device, query_heads), flush=True)


if __name__ == "__main__":
    main()
