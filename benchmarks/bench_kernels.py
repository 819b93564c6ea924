"""Portable Triton cache kernels against the copy roofline, measured in the same run (GPU).

Usage: python benchmarks/bench_kernels.py [--tokens 32768] [--heads 8] [--head-size 128]

1. device copy bandwidth (``torch`` device-to-device copy; bytes read + written);
2. each write kernel (32 768 tokens × 8 heads × 128 dims, bf16 and fp8): bytes read + written
   per call, GB/s, ratio to (1); every kernel is checked against the reference first;
3. swap out + in of 10 % of 65 536 blocks through pinned host memory, against a contiguous
   pinned copy of the same bytes in each direction.
Targets (issue #4): blocks-first write ≥ 0.85, shuffled write ≥ 0.80, swap ≥ 0.90.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvconform import reference as R  # noqa: E402
from kvconform.backends_under_test.contract import CacheSpec  # noqa: E402
from kvconform.backends_under_test.triton_backends import TritonAiter, TritonFlash, TritonRocmAttn, TritonUnified  # noqa: E402


def cuda_ms(fn, reps: int = 30) -> float:
    """Median milliseconds of ``fn`` over ``reps`` runs, CUDA events, after two warm-ups."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def graph_ms(fn, calls: int = 20) -> float:
    """Device time per call: ``calls`` back-to-back calls captured in a CUDA graph and replayed,
    so Python/launch overhead (tens of µs per Triton launch) is not counted as kernel time."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    return cuda_ms(graph.replay, reps=10) / calls


def report(name: str, nbytes: int, ms: float, roof_gbps: float | None = None, target: float | None = None) -> None:
    gbps = nbytes / ms / 1e6
    line = f"{name:44s} {ms:9.3f} ms  {gbps:8.1f} GB/s"
    if roof_gbps:
        ratio = gbps / roof_gbps
        verdict = "" if target is None else ("  meets" if ratio >= target else "  MISSES") + f" target {target:.2f}"
        line += f"  ratio {ratio:5.3f}{verdict}"
    print(line, flush=True)


def bench_writes(args, copy_gbps: float) -> None:
    T, H, D, N = args.tokens, args.heads, args.head_size, args.block_size
    gen = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(T, 3, H, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    key, value = qkv[:, 1], qkv[:, 2]  # row stride 3·H·D, as vLLM passes them
    orders = {"random slots": torch.randperm(T, device="cuda", generator=gen), "prefill slots": torch.arange(T, device="cuda")}
    scale = torch.tensor([0.5], device="cuda")
    cases = [
        ("triton_flash NHD bf16", TritonFlash(), R.blocks_first("NHD"), "auto", 0.85),
        ("triton_flash HND bf16", TritonFlash(), R.blocks_first("HND"), "auto", 0.85),
        ("triton_flash NHD fp8", TritonFlash(), R.blocks_first("NHD"), "fp8", 0.85),
        ("triton_unified NHD bf16", TritonUnified(), R.blocks_first("NHD"), "auto", 0.85),
        ("triton_aiter shuffle bf16", TritonAiter(), R.aiter_shuffle(), "auto", 0.80),
        ("triton_aiter shuffle fp8", TritonAiter(), R.aiter_shuffle(), "fp8", 0.80),
        ("triton_rocm_attn legacy bf16", TritonRocmAttn(), R.legacy_paged(), "auto", None),
    ]
    for (name, backend, layout, kv_dtype, target), (order, slots) in itertools.product(cases, orders.items()):
        name = f"{name}, {order}"
        g = R.Geometry(num_blocks=T // N, block_size=N, num_kv_heads=H, head_size=D, dtype=backend.cache_dtype(kv_dtype, torch.bfloat16))
        spec = CacheSpec(layout=layout, geometry=g, kv_cache_dtype=kv_dtype)
        buffer = torch.zeros(layout.nbytes(g), dtype=torch.uint8, device="cuda")
        cache = backend.allocate(buffer, spec)
        expected = buffer.clone()
        R.reshape_and_cache(key, value, expected, layout, g, slots, k_scale=scale, v_scale=scale)
        backend.write(cache, key, value, slots, spec, k_scale=scale, v_scale=scale)
        if not torch.equal(buffer, expected):
            print(f"{name}: WRONG BYTES — not timed", flush=True)
            continue
        write = lambda: backend.write(cache, key, value, slots, spec, k_scale=scale, v_scale=scale)  # noqa: E731
        moved = T * H * D * 2 * (key.element_size() + g.element_size) + T * slots.element_size()
        report(f"write {name}", moved, graph_ms(write), copy_gbps, target)
        report("  eager (launch overhead included)", moved, cuda_ms(write), copy_gbps)


def sweep_launch_parameters(args, copy_gbps: float) -> None:
    """Tokens per program × warps for the writers, chunk × warps for the block copy (tuning aid)."""
    from kvconform.backends_under_test import triton_kernels as K

    T, H, D, N = args.tokens, args.heads, args.head_size, args.block_size
    key, value = torch.randn(2, T, H, D, device="cuda", dtype=torch.bfloat16).unbind(0)
    scale = torch.tensor([1.0], device="cuda")
    for order in ("random", "sequential"):
        slots = torch.randperm(T, device="cuda") if order == "random" else torch.arange(T, device="cuda")
        for name, backend, layout in (("flash NHD", TritonFlash(), R.blocks_first("NHD")), ("aiter shuffle", TritonAiter(), R.aiter_shuffle())):
            g = R.Geometry(num_blocks=T // N, block_size=N, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
            spec = CacheSpec(layout=layout, geometry=g)
            cache = backend.allocate(torch.zeros(layout.nbytes(g), dtype=torch.uint8, device="cuda"), spec)
            k_cache, v_cache = backend.kernel_views(cache, spec)
            for tokens, warps in ((1, 4), (2, 4), (4, 4), (4, 8), (8, 8), (16, 8)):
                ms = graph_ms(lambda: K.reshape_and_cache(key, value, k_cache, v_cache, slots, scale, scale, form=backend.form,
                                                          block_size=N, x=g.x, tokens_per_program=tokens, num_warps=warps))
                report(f"  sweep {name} {order} tokens={tokens} warps={warps}", T * H * D * 8 + T * 8, ms, copy_gbps)


def bench_swap(args) -> None:
    N, H, D, B = args.block_size, args.heads, args.head_size, args.swap_blocks
    count = B // 10
    g = R.Geometry(num_blocks=B, block_size=N, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    layout = R.blocks_first("NHD")
    spec = CacheSpec(layout=layout, geometry=g)
    backend = TritonFlash()
    device_cache = backend.allocate(torch.randint(0, 256, (layout.nbytes(g),), dtype=torch.uint8, device="cuda"), spec)
    host_cache = backend.allocate(torch.zeros(layout.nbytes(g), dtype=torch.uint8).pin_memory(), spec)
    gen = torch.Generator().manual_seed(1)
    device_ids, host_ids = torch.randperm(B, generator=gen)[:count], torch.randperm(B, generator=gen)[:count]
    block_bytes = layout.nbytes(g) // B
    moved = count * block_bytes

    staging_dev = torch.empty(moved, dtype=torch.uint8, device="cuda")
    staging_host = torch.empty(moved, dtype=torch.uint8).pin_memory()
    d2h = cuda_ms(lambda: staging_host.copy_(staging_dev, non_blocking=True), reps=10)
    h2d = cuda_ms(lambda: staging_dev.copy_(staging_host, non_blocking=True), reps=10)
    report(f"pinned copy D2H ({count} blocks of {block_bytes} B)", moved, d2h)
    report("pinned copy H2D", moved, h2d)

    backend.swap_out(device_cache, host_cache, device_ids.cuda(), host_ids, spec)
    if not torch.equal(host_cache[host_ids[:64]].cuda().view(torch.int16), device_cache[device_ids[:64].cuda()].view(torch.int16)):
        print("swap_out: WRONG BYTES — not timed", flush=True)
        return
    out_ms = cuda_ms(lambda: backend.swap_out(device_cache, host_cache, device_ids.cuda(), host_ids, spec), reps=10)
    in_ms = cuda_ms(lambda: backend.swap_in(host_cache, device_cache, host_ids, device_ids.cuda(), spec), reps=10)
    report("swap_out (Triton, UVA)", moved, out_ms, moved / d2h / 1e6, 0.90)
    report("swap_in (Triton, UVA)", moved, in_ms, moved / h2d / 1e6, 0.90)
    report("swap out+in", 2 * moved, out_ms + in_ms, 2 * moved / (d2h + h2d) / 1e6, 0.90)
    if not args.sweep:
        return
    from kvconform.backends_under_test import triton_kernels as K

    src_ids = device_ids.cuda()
    for chunk, warps in ((8192, 4), (16384, 4), (32768, 4), (32768, 8), (65536, 8)):
        def swap(src, dst, a, b):
            K.copy_blocks(src, dst, a, b, block_bytes=block_bytes, regions=1, region_stride_bytes=0,
                          src_block_stride_bytes=block_bytes, dst_block_stride_bytes=block_bytes, chunk_bytes=chunk, num_warps=warps)
        o = cuda_ms(lambda: swap(device_cache, host_cache, src_ids, host_ids), reps=10)
        i = cuda_ms(lambda: swap(host_cache, device_cache, host_ids, src_ids), reps=10)
        report(f"  sweep swap chunk={chunk} warps={warps} out+in", 2 * moved, o + i, 2 * moved / (d2h + h2d) / 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--swap-blocks", type=int, default=65536)
    parser.add_argument("--sweep", action="store_true", help="also sweep launch parameters")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels: needs a GPU (the CPU interpreter measures nothing about kernels)")
    import triton

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}", flush=True)
    size = 1 << 30
    src, dst = torch.empty(size, dtype=torch.uint8, device="cuda"), torch.empty(size, dtype=torch.uint8, device="cuda")
    copy_ms = cuda_ms(lambda: dst.copy_(src))
    copy_gbps = 2 * size / copy_ms / 1e6
    report("device copy roofline (1 GiB, read+write)", 2 * size, copy_ms)
    src = dst = None  # the 2 GiB go back before the write benchmarks
    bench_writes(args, copy_gbps)
    if args.sweep:
        sweep_launch_parameters(args, copy_gbps)
    bench_swap(args)


if __name__ == "__main__":
    main()
