"""Do vLLM 0.33.0's CUDA and Triton flash writers leave the same bytes in the same caches?

    python -m tests.real_kernels_gpu.writer_agreement     # on a GPU, vLLM importable, its cache ops loaded

For every model dtype (bf16, fp16) × ``kv_cache_dtype`` (auto, fp8, fp8_e4m3, fp8_e5m2) × cache
order (NHD, HND) × rows (random, and for fp8 the suite's edge values: ±0, NaN, ±max, beyond max,
ties) × scales (powers of two; near-ties off by 2^-20): the compiled
``torch.ops._C_cache_ops.reshape_and_cache_flash`` (csrc/cache_kernels.cu) and the Triton
``triton_reshape_and_cache_flash`` (vllm/v1/attention/ops/triton_reshape_and_cache_flash.py) write
the same K/V rows into two zeroed copies of one uint8 cache, as vLLM allocates fp8 caches. Prints
one line per case: identical, or how many bytes differ and where each writer stands against
kvconform's reference encoder (``reference.fp8.quantize``: ``cast(x / scale)`` saturated, in the
format ``kv_cache_dtype`` names). Then ``swap_blocks`` (GPU → pinned host → GPU) against torch
indexing. Exits 0; the lines are the result.
"""

from __future__ import annotations

import itertools

import torch

from kvconform import reference as R
from kvconform.backends_under_test import vllm_cuda_ops
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.conformance.harness.case import fp8_edge_rows, token_rows

B, N, H, D = 8, 16, 2, 128
SLOTS = [3, 17, 18, 40, 77, 95, 100, 127]
NEAR = 2.0**-20


def empty_cache(order: str, dtype: torch.dtype) -> torch.Tensor:
    """A ``[B, N, H, D]`` view; HND keeps heads outside slots, as FLASHINFER's HND caches."""
    if order == "NHD":
        return torch.zeros(B, N, H, D, dtype=dtype, device="cuda")
    return torch.zeros(B, H, N, D, dtype=dtype, device="cuda").transpose(1, 2)


def rows(model_dtype, kv_cache_dtype, kind):
    spec = CacheSpec(layout=R.blocks_first("NHD"), geometry=R.Geometry(num_blocks=B, block_size=N, num_kv_heads=H, head_size=D,
                     dtype=R.fp8.cache_dtype_for(kv_cache_dtype, model_dtype, "cuda", "sm90")), kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype)
    if kind == "edge":
        return fp8_edge_rows(spec, len(SLOTS), 7, 0.5, 4.0)
    return token_rows(spec, len(SLOTS), 7)


def written(cache: torch.Tensor) -> torch.Tensor:
    slots = torch.tensor(SLOTS, device="cuda")
    return cache[slots // N, slots % N]  # [T, H, D]


def outside_rows_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The two caches' bytes outside the written rows are equal (nothing else was touched differently)."""
    slots = torch.tensor(SLOTS, device="cuda")
    a, b = a.clone(), b.clone()
    for cache in (a, b):
        cache[slots // N, slots % N] = 0
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def expected(x: torch.Tensor, scale: float, kv_cache_dtype: str) -> torch.Tensor:
    """What ``kv_cache_dtype`` means on this GPU (``fp8_e5m2``: e5m2 codes, SPEC FP8-FORMAT)."""
    if kv_cache_dtype == "auto":
        return x
    return R.fp8.quantize(x.cpu(), scale, R.fp8.cache_dtype_for(kv_cache_dtype, x.dtype, "cuda", "sm90")).view(torch.uint8).cuda()


def describe(cuda, triton, reference, x, kv_cache_dtype) -> str:
    differ = (cuda.view(torch.uint8) != triton.view(torch.uint8)).reshape(-1, cuda.element_size()).any(-1)
    if not differ.any():
        wrong = int(((cuda.view(torch.uint8) != reference.view(torch.uint8)).reshape(-1, cuda.element_size()).any(-1) & ~nan_codes(cuda, reference, kv_cache_dtype)).sum())
        return f"identical ({'= reference' if not wrong else f'both differ from the reference on {wrong}'})"
    idx = differ.nonzero().flatten()
    flat = lambda t: t.reshape(-1) if t.element_size() == 1 else t.view(torch.int16 if t.element_size() == 2 else torch.int32).reshape(-1)  # noqa: E731
    c, t, r = flat(cuda), flat(triton), flat(reference)
    cuda_ok = int(((c[idx] == r[idx]) | nan_codes(cuda, reference, kv_cache_dtype)[idx]).sum())
    triton_ok = int(((t[idx] == r[idx]) | nan_codes(triton, reference, kv_cache_dtype)[idx]).sum())
    first = ", ".join(f"x={float(x.reshape(-1)[i]):.6g}: cuda {int(c[i]) & 0xFF:02x} triton {int(t[i]) & 0xFF:02x} ref {int(r[i]) & 0xFF:02x}" for i in idx[:3].tolist())
    return f"{len(idx)} elements differ (CUDA = reference on {cuda_ok}, Triton = reference on {triton_ok}); {first}"


def nan_codes(written: torch.Tensor, reference: torch.Tensor, kv_cache_dtype: str) -> torch.Tensor:
    """Per element: both are NaN codes of the format (which NaN code is unspecified, SPEC FP8-NAN)."""
    if kv_cache_dtype == "auto":
        return torch.isnan(written.float().reshape(-1)) & torch.isnan(reference.float().reshape(-1))
    fmt = R.fp8.cache_dtype_for(kv_cache_dtype, torch.bfloat16, "cuda", "sm90")
    return (torch.isnan(written.view(fmt).float()) & torch.isnan(reference.view(fmt).float())).reshape(-1)


def writer_cases():
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import triton_reshape_and_cache_flash

    for model_dtype, kv_cache_dtype, order in itertools.product((torch.bfloat16, torch.float16), ("auto", "fp8", "fp8_e4m3", "fp8_e5m2"), ("NHD", "HND")):
        kinds = ("random",) if kv_cache_dtype == "auto" else ("random", "edge")
        for kind, (k_scale, v_scale) in itertools.product(kinds, ((0.5, 4.0), (0.5 * (1 - NEAR), 4.0 * (1 + NEAR)))):
            key, value = (t.cuda() for t in rows(model_dtype, kv_cache_dtype, kind))
            storage = model_dtype if kv_cache_dtype == "auto" else torch.uint8
            ks, vs = torch.tensor([k_scale], device="cuda"), torch.tensor([v_scale], device="cuda")
            caches = {}
            for writer in ("cuda", "triton"):
                kc, vc = empty_cache(order, storage), empty_cache(order, storage)
                slots = torch.tensor(SLOTS, device="cuda")
                if writer == "cuda":
                    torch.ops._C_cache_ops.reshape_and_cache_flash(key, value, kc, vc, slots, kv_cache_dtype, ks, vs)
                else:
                    triton_reshape_and_cache_flash(key, value, kc, vc, slots, kv_cache_dtype, ks, vs)
                torch.cuda.synchronize()
                caches[writer] = (kc, vc)
            for side, x, scale in (("K", key, k_scale), ("V", value, v_scale)):
                i = 0 if side == "K" else 1
                cuda, triton = written(caches["cuda"][i]), written(caches["triton"][i])
                outside = outside_rows_equal(caches["cuda"][i], caches["triton"][i])
                name = f"{str(model_dtype)[6:]:>8} {kv_cache_dtype:>8} {order} {kind:>6} scales {k_scale:.9g}/{v_scale:.9g} {side}"
                print(f"{name}: {describe(cuda, triton, expected(x, scale, kv_cache_dtype), x, kv_cache_dtype)}{'' if outside else ' (and bytes outside the written rows differ)'}", flush=True)


def swap_blocks_case() -> str:
    """``swap_blocks`` out to pinned host blocks and back, whole blocks, against torch indexing."""
    gen = torch.Generator().manual_seed(3)
    device = torch.randint(0, 255, (B, 2 * N * H * D), dtype=torch.uint8, generator=gen).cuda()
    host = torch.zeros(B, 2 * N * H * D, dtype=torch.uint8).pin_memory()
    mapping = torch.tensor([[1, 5], [6, 0], [3, 3]], dtype=torch.int64)
    torch.ops._C_cache_ops.swap_blocks(device, host, device[0].numel(), mapping)
    torch.cuda.synchronize()
    expected_host = torch.zeros_like(host)
    expected_host[mapping[:, 1]] = device.cpu()[mapping[:, 0]]
    back = torch.zeros_like(device)
    torch.ops._C_cache_ops.swap_blocks(host, back, device[0].numel(), mapping[:, [1, 0]].contiguous())
    torch.cuda.synchronize()
    expected_back = torch.zeros_like(device)
    expected_back[mapping[:, 0]] = device[mapping[:, 0]]
    ok = torch.equal(host, expected_host) and torch.equal(back, expected_back)
    return f"swap_blocks GPU -> pinned host -> GPU, 3 blocks of {device[0].numel()} bytes: {'identical to torch indexing' if ok else 'DIFFERS from torch indexing'}"


def main() -> None:
    from tests.vllm_gpu import stand_ins

    stand_ins.install()  # the carry bundle's vLLM: its compiled extension is absent (tests/vllm_gpu/stand_ins.py)
    print(f"cache ops: {vllm_cuda_ops.load()}", flush=True)
    writer_cases()
    print(swap_blocks_case(), flush=True)


if __name__ == "__main__":
    main()
