"""Speed of the verdict: the conformance suite's wall time per profile, and where it goes.

Usage: python benchmarks/bench_suite.py [--profiles quick,full] [-n 2] [--backend a,b] [--keep DIR] [-- PYTEST ARGS]

For each profile it runs the suite as a user does (one ``pytest --pyargs kvconform.conformance``
process, ``-n`` xdist workers, every built-in backend by default) and prints the wall time,
the checks with a verdict and checks/s. Then where the time went, from the run's own results:
the start-up (a ``--collect-only`` run: imports, backend loading, collection), the summed test
time per family and per backend, and the slowest checks. Not a timed test: targets are in
docs/PERFORMANCE.md ("Suite speed").
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvconform.conformance.plugin.collection import suite_command  # noqa: E402


def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(suite_command(*args), capture_output=True, text=True)
    return time.perf_counter() - start, proc


def report(profile: str, wall: float, document: dict, startup: float, workers: int) -> None:
    tests = document["tests"]
    ran = [t for t in tests if t["outcome"] not in ("not-applicable", "skipped")]
    outcomes = Counter(t["outcome"] for t in tests)
    print(f"\n== profile {profile}: {wall:.1f} s wall with -n {workers} · {len(tests)} checks with a verdict "
          f"({len(ran)} ran, {outcomes['not-applicable']} not applicable) · {len(tests) / wall:.1f} checks/s · "
          f"start-up {startup:.1f} s · complete {document['completion']['complete']}")
    print("   outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    for axis in ("family", "backend"):
        spent = Counter()
        for t in tests:
            spent[t[axis]] += t.get("duration_s") or 0.0
        total = sum(spent.values()) or 1.0
        print(f"   test time by {axis} (summed over workers, {total:.1f} s): " +
              ", ".join(f"{name} {seconds:.1f} s ({100 * seconds / total:.0f}%)" for name, seconds in spent.most_common()))
    failing = [t for t in tests if t["outcome"] not in ("passed", "not-applicable", "skipped")]
    for t in failing[:10]:
        print(f"   NOT PASSED {t['outcome']}: {t['nodeid']}: {(t.get('message') or '')[:200]}")
    if len(failing) > 10:
        print(f"   … {len(failing) - 10} more not passed")
    print("   slowest checks:")
    for t in sorted(tests, key=lambda t: -(t.get("duration_s") or 0))[:8]:
        print(f"     {t['duration_s']:7.2f} s  {t['nodeid']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="quick,full")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--backend", default=None, help="comma-separated backends (default: every built-in that loads here)")
    parser.add_argument("--keep", default=None, help="directory to keep each profile's results JSON and HTML in")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments")
    args = parser.parse_args()
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    backend = ["--kvc-backend", args.backend] if args.backend else []
    with tempfile.TemporaryDirectory(prefix="kvconform-bench-") as work:
        startup, _ = timed(["--collect-only", "-q", "--kvc-json", f"{work}/collect.json", *backend, *extra])
        print(f"start-up (imports, backends, collection; one process): {startup:.1f} s")
        for profile in args.profiles.split(","):
            out = Path(args.keep or work) / f"{profile}.json"
            out.parent.mkdir(parents=True, exist_ok=True)
            workers = ["-n", str(args.workers)] if args.workers > 0 else []
            wall, proc = timed(["-q", "--kvc-profile", profile, "--kvc-json", str(out), *workers, *backend, *extra])
            if not out.exists():
                print(f"profile {profile}: no results (exit {proc.returncode})\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
                return 1
            report(profile, wall, json.loads(out.read_text()), startup, args.workers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
