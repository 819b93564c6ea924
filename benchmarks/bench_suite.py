"""Speed of the verdict: the conformance suite's wall time per profile, and where it goes.

Usage: python benchmarks/bench_suite.py [--profiles quick,full] [-n 2] [--backend a,b] [--keep DIR]
                                        [--label TEXT] [--py-spy FILE] [--startup] [-- PYTEST ARGS]

For each profile it runs the suite as a user does (one ``pytest --pyargs kvconform.conformance``
process, ``-n`` xdist workers, every built-in backend by default) with the timeline plugin
(benchmarks/timeline.py) and prints, from the run's own results and timeline:

- the wall time, the checks with a verdict, checks/s;
- the sum of the tests' recorded durations, and the parallel efficiency: that sum over
  (wall × workers) — 1.0 would be every worker inside a test all the time;
- per worker: its start-up (from the run's start to its first test: process spawn, imports,
  configure, collection), the time inside tests, between tests and after its last test;
- the time outside any test (wall × workers − the time inside tests), split into those parts,
  and the controller's time after the last test (writing the reports);
- the summed test time per family and per backend, and the slowest checks.

``--py-spy FILE`` runs the suite under ``py-spy record --subprocesses --idle`` (collapsed stacks
in FILE; benchmarks/profile_summary.py reads them). ``--startup`` adds a ``--collect-only`` run
(start-up of one process). Not a timed test: targets are in docs/PERFORMANCE.md ("Suite speed").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks import timeline  # noqa: E402
from kvconform.conformance.plugin.collection import suite_command  # noqa: E402


def timed(args: list[str], trace: str | None = None, py_spy: str | None = None) -> tuple[float, float, float, subprocess.CompletedProcess]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = suite_command(*args)
    if trace:
        env[timeline.ENV] = trace
        command += ["-p", "benchmarks.timeline"]
    if py_spy:
        spy = shutil.which("py-spy") or "py-spy"
        command = [spy, "record", "--subprocesses", "--idle", "--rate", "50", "--format", "raw", "--output", py_spy, "--", *command]
    start = time.time()
    proc = subprocess.run(command, capture_output=True, text=True, env=env)
    end = time.time()
    return end - start, start, end, proc


def report(label: str, wall: float, document: dict, workers: int, spent: dict | None, startup: float | None) -> dict:
    tests = document["tests"]
    ran = [t for t in tests if t["outcome"] not in ("not-applicable", "skipped")]
    outcomes = Counter(t["outcome"] for t in tests)
    total = sum(t.get("duration_s") or 0.0 for t in tests)
    width = max(workers, 1)
    efficiency = total / (wall * width)
    print(f"\n== {label}: {wall:.1f} s wall with {workers or 'no'} workers · {len(tests)} checks with a verdict "
          f"({len(ran)} ran, {outcomes['not-applicable']} not applicable) · {len(tests) / wall:.1f} checks/s · "
          f"complete {document['completion']['complete']}")
    print("   outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print(f"   test durations summed: {total:.1f} s = {total / width:.1f} s per worker · parallel efficiency "
          f"{efficiency:.2f} (sum ÷ (wall × {width}))" + (f" · one process's start-up (--collect-only) {startup:.1f} s" if startup else ""))
    summary = {"label": label, "wall_s": round(wall, 2), "workers": workers, "tests": len(tests), "ran": len(ran),
               "not_applicable": outcomes["not-applicable"], "sum_durations_s": round(total, 2), "parallel_efficiency": round(efficiency, 3)}
    if spent:
        rows = spent["workers"]
        inside = sum(w["inside_tests_s"] for w in rows.values())
        outside = wall * width - inside
        parts = {part: sum(w[part] for w in rows.values()) for part in ("startup_s", "between_tests_s", "tail_s")}
        print(f"   time outside any test: {outside:.1f} s of {wall * width:.1f} worker-seconds "
              f"(start-up {parts['startup_s']:.1f} s, between tests {parts['between_tests_s']:.1f} s, after the last test "
              f"{parts['tail_s']:.1f} s); controller after the last test {spent['controller_after_last_test_s']:.1f} s, "
              f"after the session {spent['after_session_s']:.1f} s")
        print("   worker  start-up = spawn + imports&configure + collection + wait   tests  inside  between  tail (s)")
        for name, w in sorted(rows.items(), key=lambda kv: int(kv[0][2:]) if kv[0][2:].isdigit() else 0):
            print(f"   {name:>6}  {w['startup_s']:6.1f} = {w['spawned_after_s']:4.1f} + {w['imports_configure_s']:4.1f} + {w['collection_s']:4.1f} + "
                  f"{w['first_test_wait_s']:4.1f}          {w['tests']:5d}  {w['inside_tests_s']:6.1f}  {w['between_tests_s']:7.1f}  {w['tail_s']:5.1f}")
        summary.update(outside_tests_s=round(outside, 2), **{f"outside_{k}": round(v, 2) for k, v in parts.items()},
                       controller_after_last_test_s=round(spent["controller_after_last_test_s"], 2),
                       worker_startup_s=[round(w["startup_s"], 2) for w in rows.values()])
    for axis in ("family", "backend"):
        per = Counter()
        for t in tests:
            per[t[axis]] += t.get("duration_s") or 0.0
        print(f"   test time by {axis}: " + ", ".join(f"{name} {seconds:.1f} s ({100 * seconds / (total or 1):.0f}%)" for name, seconds in per.most_common()))
    failing = [t for t in tests if t["outcome"] not in ("passed", "not-applicable", "skipped")]
    for t in failing[:10]:
        print(f"   NOT PASSED {t['outcome']}: {t['nodeid']}: {(t.get('message') or '')[:200]}")
    if len(failing) > 10:
        print(f"   … {len(failing) - 10} more not passed")
    print("   slowest checks:")
    for t in sorted(tests, key=lambda t: -(t.get("duration_s") or 0))[:8]:
        print(f"     {t['duration_s']:7.2f} s  {t['nodeid']}")
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="quick,full")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--backend", default=None, help="comma-separated backends (default: every built-in that loads here)")
    parser.add_argument("--keep", default=None, help="directory to keep each profile's results JSON, HTML and timeline in")
    parser.add_argument("--label", default="", help="words naming this run in the output (e.g. '1 × H200')")
    parser.add_argument("--py-spy", default=None, metavar="FILE", help="profile the run (controller and workers) with py-spy into FILE")
    parser.add_argument("--startup", action="store_true", help="also time a --collect-only run (one process's start-up)")
    parser.add_argument("--summary", default=None, metavar="FILE", help="append each run's numbers as one JSON line to FILE")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments")
    args = parser.parse_args()
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    backend = ["--kvc-backend", args.backend] if args.backend else []
    with tempfile.TemporaryDirectory(prefix="kvconform-bench-") as work:
        startup = None
        if args.startup:
            startup, *_ = timed(["--collect-only", "-q", "--kvc-json", f"{work}/collect.json", *backend, *extra])
            print(f"start-up (imports, backends, collection; one process): {startup:.1f} s")
        for profile in args.profiles.split(","):
            keep = Path(args.keep or work)
            out = keep / f"{profile}.json"
            trace = keep / f"{profile}-timeline"
            shutil.rmtree(trace, ignore_errors=True)
            trace.mkdir(parents=True)
            workers = ["-n", str(args.workers)] if args.workers > 0 else []
            wall, started, ended, proc = timed(["-q", "--kvc-profile", profile, "--kvc-json", str(out), *workers, *backend, *extra],
                                               trace=str(trace), py_spy=args.py_spy)
            if not out.exists():
                print(f"profile {profile}: no results (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
                return 1
            spent = timeline.summary(trace, started, ended) if any(trace.glob("*.jsonl")) else None
            label = " · ".join(filter(None, [args.label, f"profile {profile}", " ".join(extra)]))
            numbers = report(label, wall, json.loads(out.read_text()), args.workers, spent, startup)
            if args.summary:
                with open(args.summary, "a") as f:
                    f.write(json.dumps(numbers) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
