"""Reference ``reshape_and_cache`` against ``index_copy_`` of the same bytes, same run.

Usage: python benchmarks/bench_reference.py [--tokens 65536] [--heads 8] [--head-size 128]

The roofline is ``index_copy_`` of the token rows into a ``(slots, 2, H, D)`` bf16 tensor:
what any scatter of these bytes must cost on this machine. The issue's target is a ratio ≤ 3.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvconform import reference as R  # noqa: E402


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    T, H, D, N = args.tokens, args.heads, args.head_size, args.block_size
    g = R.Geometry(num_blocks=T // N, block_size=N, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
    gen = torch.Generator().manual_seed(0)
    key, value = torch.randn(2, T, H, D, generator=gen).to(torch.bfloat16).unbind(0)
    slots = torch.randperm(T, generator=gen)
    nbytes = 2 * T * H * D * 2
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {T} tokens x {H} heads x {D} dims bf16 "
          f"= {nbytes / 2**20:.0f} MiB written per call")

    dense = torch.empty(T, 2, H, D, dtype=torch.bfloat16)
    rows = torch.stack([key, value], 1)
    roof_best, roof_med = best_of(lambda: dense.index_copy_(0, slots, rows), args.repeats)
    print(f"{'index_copy_ roofline':32s} {roof_best * 1e3:8.1f} ms  {nbytes / roof_best / 1e9:6.2f} GB/s")

    for layout in (R.blocks_first("NHD"), R.blocks_first("HND"), R.standardized("LBNHC"), R.aiter_shuffle()):
        storage = torch.empty(layout.nbytes(g), dtype=torch.uint8)
        best, _ = best_of(lambda: R.reshape_and_cache(key, value, storage, layout, g, slots), args.repeats)
        print(f"{'reshape_and_cache ' + layout.alias:32s} {best * 1e3:8.1f} ms  {nbytes / best / 1e9:6.2f} GB/s  "
              f"ratio {best / roof_best:5.2f}x")


if __name__ == "__main__":
    main()
