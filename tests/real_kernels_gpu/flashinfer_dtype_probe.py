"""Does FlashInfer's ``append_paged_kv_cache`` check that the appended key's dtype is the cache's?

    PYTHONPATH=FLASHINFER_TREE:TVM_FFI_SITE:. python3 -m tests.real_kernels_gpu.flashinfer_dtype_probe   # on a GPU

csrc/page.cu:94-106 dispatches on the *cache's* dtype and casts ``append_key.data_ptr()`` to that
element type; page.cu:25-92 and page.py:141-169 check shapes, devices and contiguity, not the
key's dtype. Three tokens with exact values (1 … 3·H·D / 64) are appended into page 1 of a zeroed
NHD cache of another dtype; the probe says whether the call raised, stored the values converted,
or stored the key's bytes read as the cache's elements at the key's element strides. Not part of
the suite: kvconform's write contract gives a backend keys in the model dtype and declares the
cache dtype, and FlashInfer's adapter declares only caches of the model's dtype.
"""

from __future__ import annotations

import torch

T, N, H, D = 3, 16, 2, 64


def stored_bytes_of(key: torch.Tensor, cache_dtype: torch.dtype) -> torch.Tensor:
    """What the kernel copies when it reads ``key``'s buffer as ``cache_dtype`` elements at the
    key's element strides (row stride H·D, head stride D)."""
    size = torch.empty(0, dtype=cache_dtype).element_size()
    return key.contiguous().view(torch.uint8).view(-1, size)[: T * H * D].reshape(T, H, D * size)


def case(key_dtype: torch.dtype, cache_dtype: torch.dtype) -> str:
    import flashinfer

    key = (torch.arange(1, T * H * D + 1).view(T, H, D) / 64).to(key_dtype).cuda()
    cache = torch.zeros(2, 2, N, H, D, dtype=cache_dtype, device="cuda")
    index = lambda values: torch.tensor(values, dtype=torch.int32, device="cuda")  # noqa: E731
    label = f"{str(key_dtype)[6:]} key into a {str(cache_dtype)[6:]} cache"
    try:
        flashinfer.append_paged_kv_cache(key, key, index([0] * T), index(list(range(T))), cache, index([1]), index([0, 1]), index([T]), kv_layout="NHD")
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - what FlashInfer raises is the answer
        return f"{label}: raises {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    stored = cache[1, 0, :T]
    if torch.equal(stored.view(torch.uint8), key.to(cache_dtype).view(torch.uint8)):
        return f"{label}: accepted; stores the values converted"
    if torch.equal(stored.contiguous().view(torch.uint8).view(T, H, -1), stored_bytes_of(key, cache_dtype)):
        return f"{label}: accepted silently; stores the key's raw bytes read as {str(cache_dtype)[6:]} (row 0 head 0 [:4]: {stored[0, 0, :4].float().tolist()}, key {key[0, 0, :4].float().tolist()})"
    return f"{label}: accepted; stores neither the converted values nor the raw bytes ({stored[0, 0, :4].float().tolist()})"


def main() -> None:
    for key_dtype, cache_dtype in ((torch.bfloat16, torch.float16), (torch.float16, torch.bfloat16), (torch.bfloat16, torch.float8_e4m3fn), (torch.float32, torch.bfloat16)):
        print(case(key_dtype, cache_dtype), flush=True)


if __name__ == "__main__":
    main()
