"""The host side of a 2^31-element swap probe on a GPU machine, before and after #25.

Usage: python benchmarks/bench_probes.py [--gib 2,4]

Before: every swap probe allocated a fresh pinned host arena (``torch.zeros(..., pin_memory=True)``:
the caching host allocator pins a power-of-two block), copied it for the reference and compared
the two on the CPU. After (conformance/harness/big_caches.py): one registered pinned arena per
process, zero again by a scan on the GPU, a lazily mapped twin, a comparison of the pages either
side wrote. Prints the seconds of each step (wall clock, synchronized). Not a timed test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvconform.conformance.harness.big_caches import PAGE, PinnedArenas, lazy_zeros, nonzero_pages, touched_pages  # noqa: E402


def seconds(step) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", default="2,4")
    args = parser.parse_args()
    torch.zeros(1, device="cuda")  # the context, outside the timings
    arenas = PinnedArenas()
    for gib in (float(g) for g in args.gib.split(",")):
        n = int(gib * (1 << 30)) + 512
        held = {}
        fresh = seconds(lambda: held.update(host=torch.zeros(n, dtype=torch.uint8, pin_memory=True)))
        twin = seconds(lambda: held.update(twin=held["host"].clone()))
        held["host"][n // 2] = 1
        compare = seconds(lambda: torch.equal(held["host"], held["twin"]))
        held.clear()  # the pinned buffers go before the arena takes as much again
        first = seconds(lambda: arenas.take(n))
        buffer = arenas.buffer
        buffer[PAGE * 3] = 1
        buffer[n - 1] = 2
        again = seconds(lambda: arenas.take(n))
        scan = seconds(lambda: nonzero_pages(buffer[:n]))
        expected = lazy_zeros(n)
        expected[PAGE * 3] = 1
        pages = seconds(lambda: torch.unique(torch.cat([touched_pages(expected), nonzero_pages(buffer[:n])])))
        print(f"{gib:g} GiB host arena: before: fresh pinned zeros {fresh:.2f} s + CPU twin {twin:.2f} s + CPU compare {compare:.2f} s "
              f"= {fresh + twin + compare:.2f} s per probe · after: registered once {first:.2f} s, then per probe zero again "
              f"{again:.2f} s + pages to compare {pages:.2f} s = {again + pages:.2f} s (one scan {scan:.2f} s); "
              f"pinned: {buffer.is_pinned()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
