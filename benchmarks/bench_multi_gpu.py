"""Several GPUs (issue #41), in one run: the device-to-device copy limit, each TP change's transfer
between devices as a share of it, and the quick profile's wall time on one GPU and on two.

Usage: python benchmarks/bench_multi_gpu.py --out results.json            (an nvidia-h200-x2: cuda:0, cuda:1)
       python benchmarks/bench_multi_gpu.py --cpu --out smoke.json        (gloo between two CPU processes: a smoke)
Options: --size-mib S (the copy, default 1024; CPU 64), --num-blocks B (the resharding jobs' cache, default 2050),
         --workers 8,16 (xdist workers of each suite run), --no-suite (skip the suite runs), --backend NAME.

1. **Copy limit**: a ``S`` MiB uint8 tensor copied ``cuda:0 → cuda:1`` (``Tensor.copy_``, best of 5),
   and the same bytes ``dist.send`` → ``dist.recv`` between two processes over NCCL (gloo with --cpu).
2. **TP changes** 1→2, 2→1, 2→4, 4→2 between the devices (conformance/harness/device_transfer.py, the
   code of the check CONN-RESHARD-DEVICES), a 3-layer 4-head model of B blocks, every consumer rank
   compared bit for bit: bytes/s per change and its ratio to the NCCL send/recv limit.
3. **Suite**: ``pytest --pyargs kvconform.conformance --kvc-profile quick -n W --kvc-devices D`` for
   D = ``cuda:0`` and ``cuda:0,cuda:1`` at each W; done when the best two-GPU wall ≤ 0.6 × the best one-GPU wall.

Writes every number as JSON to --out and prints a table. Not a timed test (tests/test_multi_device.py
runs the --cpu smoke at a tiny size).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from kvconform.conformance.harness.device_transfer import free_port, run_on_devices  # noqa: E402
from kvconform.conformance.plugin.collection import suite_command  # noqa: E402
from kvconform.transfer import device_jobs  # noqa: E402

REPEATS = 5


def copy_limit(nbytes: int, devices: list[str]) -> float:
    """Best bytes/s of ``dst.copy_(src)`` from devices[0] to devices[1]."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=devices[0])
    dst = torch.empty(nbytes, dtype=torch.uint8, device=devices[1])
    best = float("inf")
    for _ in range(REPEATS + 1):  # the first is a warm-up (peer access set up)
        _sync(devices)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(devices)
        best = min(best, time.perf_counter() - start)
    return nbytes / best


def _sync(devices) -> None:
    for d in dict.fromkeys(devices):
        if d.startswith("cuda"):
            torch.cuda.synchronize(d)


def _send_recv_process(rank: int, devices: list[str], engine: str, nbytes: int, port: int, results) -> None:
    device = devices[rank]
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    else:
        torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool (it hangs)
    dist.init_process_group(engine, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120))
    buffer = torch.ones(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(REPEATS + 1):
        dist.barrier()
        _sync([device])
        start = time.perf_counter()
        dist.send(buffer, dst=1) if rank == 0 else dist.recv(buffer, src=0)
        _sync([device])
        best = min(best, time.perf_counter() - start)
    dist.barrier()
    results.put((rank, best))
    dist.destroy_process_group()


def send_recv_limit(nbytes: int, devices: list[str], engine: str) -> float:
    """Best bytes/s of one ``dist.send`` → ``dist.recv`` of ``nbytes`` between two processes (the receiver's time)."""
    ctx = mp.get_context("spawn" if engine == "nccl" else "fork")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_send_recv_process, args=(rank, devices[:2], engine, nbytes, port, results)) for rank in range(2)]
    for p in procs:
        p.start()
    got = dict(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join()
    return nbytes / got[1]


def tp_changes(devices: list[str], num_blocks: int, backend: str) -> list[dict]:
    out = []
    for report in run_on_devices(device_jobs(num_blocks, backend=backend), devices):
        out.append({"change": f"{report.job.producer_tp}->{report.job.consumer_tp}", "placement": report.placement, "bytes": report.bytes_moved,
                    "seconds": report.seconds, "bytes_per_s": report.bytes_per_second, "bit_for_bit": not report.failures,
                    "consumers": [{"rank": c.rank, "device": c.device, "heads": list(c.heads), "bytes": c.bytes_received, "seconds": c.seconds,
                                   "modes": list(c.modes)} for c in report.consumers]})
    return out


def suite_wall(devices: str, workers: int, backend: str | None) -> dict:
    """Wall seconds of one quick-profile suite run (exit status kept: a failing run is still timed)."""
    with tempfile.TemporaryDirectory() as scratch:
        args = ["--kvc-profile", "quick", "-n", str(workers), "--kvc-devices", devices, "--kvc-json", os.path.join(scratch, "results.json"), "-q"]
        args += ["--kvc-backend", backend] if backend else []
        start = time.perf_counter()
        done = subprocess.run(suite_command(*args), cwd=scratch, capture_output=True, text=True)
        wall = time.perf_counter() - start
        with open(os.path.join(scratch, "results.json")) as f:
            tests = json.load(f).get("tests", [])
    return {"devices": devices, "workers": workers, "wall_s": wall, "exit": done.returncode, "tests": len(tests),
            "summed_test_s": sum(t.get("duration_s") or 0 for t in tests)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu", action="store_true", help="gloo between two CPU processes (a smoke)")
    parser.add_argument("--size-mib", type=float, default=None)
    parser.add_argument("--num-blocks", type=int, default=None)
    parser.add_argument("--workers", default="8,16")
    parser.add_argument("--no-suite", action="store_true")
    parser.add_argument("--backend", default="reference")
    parser.add_argument("--suite-backend", default=None, help="--kvc-backend of the suite runs (default: every built-in)")
    a = parser.parse_args()
    devices = ["cpu", "cpu"] if a.cpu else ["cuda:0", "cuda:1"]
    engine = "gloo" if a.cpu else "nccl"
    nbytes = int((a.size_mib or (64 if a.cpu else 1024)) * (1 << 20))
    result: dict = {"devices": devices, "engine": engine, "bytes": nbytes, "torch": torch.__version__,
                    "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if not a.cpu else []}
    result["copy_bytes_per_s"] = copy_limit(nbytes, devices)
    result["send_recv_bytes_per_s"] = send_recv_limit(nbytes, devices, engine)
    result["tp_changes"] = tp_changes(devices, a.num_blocks or (6 if a.cpu else 2050), a.backend)
    for change in result["tp_changes"]:
        change["ratio_to_send_recv"] = change["bytes_per_s"] / result["send_recv_bytes_per_s"]
        change["ratio_to_copy"] = change["bytes_per_s"] / result["copy_bytes_per_s"]
    if not a.no_suite:
        one, two = devices[0], ",".join(devices)
        result["suite"] = [suite_wall(d, int(w), a.suite_backend) for d in (one, two) for w in a.workers.split(",")]
        best = {d: min(r["wall_s"] for r in result["suite"] if r["devices"] == d) for d in (one, two)}
        result["two_over_one"] = best[two] / best[one]
    Path(a.out).write_text(json.dumps(result, indent=1))
    print_table(result)


def print_table(r: dict) -> None:
    print(f"devices {','.join(r['devices'])} ({r['engine']}), {r['bytes'] / (1 << 20):.0f} MiB: copy {r['copy_bytes_per_s'] / 1e9:.2f} GB/s, "
          f"send/recv {r['send_recv_bytes_per_s'] / 1e9:.2f} GB/s")
    print(f"{'TP':6s} {'bytes':>12s} {'seconds':>9s} {'GB/s':>8s} {'÷ send/recv':>11s} {'÷ copy':>8s}  bit for bit  placement")
    for c in r["tp_changes"]:
        print(f"{c['change']:6s} {c['bytes']:12d} {c['seconds']:9.4f} {c['bytes_per_s'] / 1e9:8.3f} {c['ratio_to_send_recv']:11.3f} "
              f"{c['ratio_to_copy']:8.3f}  {'yes' if c['bit_for_bit'] else 'NO':11s}  {c['placement']}")
    for s in r.get("suite", []):
        print(f"suite quick --kvc-devices {s['devices']:14s} -n {s['workers']:2d}: {s['wall_s']:7.1f} s wall, {s['tests']} tests, "
              f"{s['summed_test_s']:.1f} s summed, exit {s['exit']}")
    if "two_over_one" in r:
        print(f"two devices / one device (best walls): {r['two_over_one']:.2f} (done when <= 0.6)")


if __name__ == "__main__":
    main()
