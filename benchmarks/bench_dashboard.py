"""How long ``kvconform dashboard`` takes on a large field: RUNS synthetic runs of the whole suite
(BACKENDS backends of TESTS tests each per run), their versions spread over vLLM releases and
platforms; whole checks not applicable on some backends, ~1 % of tests failing from some release on
and a few in one run only, each with a diagnosis, a mismatch table and a byte map (a detail page
each). Prints the command's wall and CPU time (the CPU time is what a shared machine does not
blur), that of reading and of modelling alone, and the site's size.

    .venv/bin/python benchmarks/bench_dashboard.py                      # 100 runs × 10 backends × 400 tests = 400 000 records
    .venv/bin/python benchmarks/bench_dashboard.py --runs 20 --keep DIR # smaller, and keep the site to look at

Not a timed test: numbers go to docs/DASHBOARD.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvconform.reports import dashboard, dashboard_model
from kvconform.reports.dashboard_inputs import load_runs
from kvconform.reports.results import document_text

from tests.dashboard_runs import document, record

RELEASES = ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0")
PLATFORMS = ("cpu", "cuda-sm90", "rocm-gfx942")
FAMILIES = ("shape", "split", "write", "shuffle", "swap", "copy", "read", "gating", "equivalence", "connector")
BYTE_MAP = {"layer": 0, "block": 5, "layout": "NHD E1[B,2,N,H,D]", "geometry": "L1-B6-N16-H3-D64-bfloat16", "row_elements": 64,
            "cells": [{"offset": 128 * i, "row": [i % 2, i // 6, i % 3], "ok": i % 5 != 0, "actual": None, "actual_block": None} for i in range(96)]}


def backend_names(count: int) -> list[str]:
    return [f"vllm:BACKEND_{i}" if i % 2 else f"triton_kernel_{i}" for i in range(count)]


def suite(backend: str, tests: int, platform: str) -> list[dict]:
    """One backend's tests: 12 checks of each family (as the suite has ~120), over layouts, cache dtypes and sizes."""
    out = []
    for i in range(tests):
        family = FAMILIES[i % len(FAMILIES)]
        params = f"{['NHD', 'HND', 'SHUFFLE'][i % 3]}-{('auto', 'fp8', 'fp8_e5m2')[i // 3 % 3]}-h{i // 9 % 6}-b{i // 54}"
        out.append(record(backend, f"test_{family}_check_{i // len(FAMILIES) % 12}", params, "passed", family=family, run_platform=platform,
                          clauses=(f"{family.upper()}-{i % 7}",)))
    return out


def make_run(rng: random.Random, number: int, backends: list[str], tests: int) -> dict:
    """Whole checks not applicable on a backend (its declaration), ~1 % of tests failing from a
    release on (a regression that stays), and a few failing in one run only (fixed in the next)."""
    platform = PLATFORMS[number % len(PLATFORMS)]
    release = number // len(PLATFORMS) % len(RELEASES)
    records = []
    for backend in backends:
        for i, r in enumerate(suite(backend, tests, platform)):
            fate = zlib.crc32(f"{backend}:{i}".encode())
            if zlib.crc32(f"{backend}:{r['check']}".encode()) % 6 == 0:
                outcome = "not-applicable"
            elif (fate % 100 == 0 and release >= fate // 100 % len(RELEASES)) or rng.random() < 0.002:
                outcome = "failed"
            else:
                outcome = "passed"
            if outcome != "passed":
                r = record(r["backend"], r["check"], r["nodeid"].split("-", 1)[1][:-1], outcome, family=r["family"], run_platform=platform,
                           clauses=tuple(r["clauses"]))
                if r["failure"]:
                    r["failure"]["byte_map"] = BYTE_MAP
            records.append(r)
    versions = {b: {"vllm": RELEASES[release]} for b in backends if b.startswith("vllm:")}
    return document(records, created=1_790_000_000 + number * 3600, suite_version=f"0.2.{number // 50}", libraries=versions,
                    run_platform=platform)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--backends", type=int, default=10)
    parser.add_argument("--tests", type=int, default=400, help="tests per backend per run")
    parser.add_argument("--keep", help="write the site here and keep it")
    args = parser.parse_args()
    rng = random.Random(0)
    work = Path(tempfile.mkdtemp(prefix="kvc-bench-dashboard-"))
    try:
        start = time.perf_counter()
        paths = []
        for number in range(args.runs):
            path = work / "runs" / f"run-{number:03}.json"
            path.parent.mkdir(exist_ok=True)
            path.write_text(document_text(make_run(rng, number, backend_names(args.backends), args.tests)))
            paths.append(str(path))
        made = time.perf_counter() - start
        size = sum(os.path.getsize(p) for p in paths)
        clocks = (time.perf_counter, time.process_time)
        t0 = [c() for c in clocks]
        runs = load_runs(paths)
        t1 = [c() for c in clocks]
        d = dashboard_model.build(runs)
        t2 = [c() for c in clocks]
        out = args.keep or str(work / "site")
        dashboard.build(paths, out)  # the whole command: reads, models and writes
        t3 = [c() for c in clocks]
        files = [os.path.join(top, f) for top, _, names in os.walk(out) for f in names]

        def took(a, b):
            return {"wall_s": round(b[0] - a[0], 2), "cpu_s": round(b[1] - a[1], 2)}

        print(json.dumps({
            "runs": args.runs, "backends_per_run": args.backends, "records": sum(len(r.document["tests"]) for r in runs),
            "input_mb": round(size / 2**20, 1), "synthesised_s": round(made, 1),
            "read_and_check": took(t0, t1), "model": took(t1, t2), "whole_command": took(t2, t3),
            "entries": len(d.entries), "series": len(d.series), "detail_pages": sum(1 for f in files if f"{os.sep}detail{os.sep}" in f),
            "site_files": len(files), "site_mb": round(sum(os.path.getsize(f) for f in files) / 2**20, 1), "cpus": os.cpu_count(),
        }, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
