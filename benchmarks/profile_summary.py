"""Read a ``py-spy record --subprocesses --idle --format raw`` profile of a suite run (bench_suite.py
``--py-spy FILE``) and say where each process's time went.

Usage: python benchmarks/profile_summary.py FILE [--rate 50] [--top 12]

Every sample is put in one category by the frames on its stack (first rule that matches, in
the order of ``CATEGORIES``): imports, collection, inside a test, handling reports, waiting for
the next message, the session's end… Per process (the controller, each xdist worker) it prints
seconds per category, then the functions most often on top of the stack outside tests.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter, defaultdict

RECEIVER = "execnet receiver thread (idle I/O; not counted)"


def _any(*names: str):
    """Some frame is one of these functions (``name`` or a method ``Class.name``)."""
    def holds(frames: list[str]) -> bool:
        return any(f.split(" (")[0].rsplit(".", 1)[-1] in names or f.split(" (")[0] in names for f in frames)
    return holds


# (category, test on the stack's frames): the first that holds names the sample.
CATEGORIES = (
    (RECEIVER, _any("BaseGateway._thread_receiver")),
    ("imports", _any("_find_and_load")),
    ("inside a test (setup, call, teardown)", _any("pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown", "pytest_pyfunc_call")),
    ("collection", _any("perform_collect", "pytest_collection", "genitems", "pytest_generate_tests", "pytest_collection_modifyitems")),
    ("worker: sending reports to the controller", _any("sendevent")),
    ("worker: waiting for the next test", _any("TestQueue.get")),
    ("controller: handling a worker's report (verdict, record, terminal)", _any("worker_testreport", "worker_logstart",
                                                                                  "worker_collectionfinish", "worker_runtest_protocol_complete")),
    ("controller: waiting for the workers' events", _any("loop_once")),
    ("session end (results, HTML, terminal report; stopping workers)", _any("pytest_sessionfinish", "pytest_unconfigure", "pytest_terminal_summary",
                                                                            "Config._ensure_unconfigure", "safe_terminate", "Group.terminate")),
    ("configure (options, backends, device)", _any("pytest_configure", "_preparse", "pytest_sessionstart", "pytest_cmdline_parse")),
)


def process_of(frame: str) -> str:
    """The name of a sampled process: its root frame ``process PID:"COMMAND"``."""
    match = re.match(r'process (\d+):"(.*)"', frame)
    if not match:
        return frame
    pid, command = match.groups()
    kind = "worker" if "exec(eval(sys.stdin.readline()))" in command else "controller" if "pytest" in command else command[:40]
    return f"{kind} {pid}"


def categorize(frames: list[str]) -> str:
    return next((name for name, holds in CATEGORIES if holds(frames)), "other")


def read(path: str) -> dict[str, list[tuple[list[str], int]]]:
    stacks = defaultdict(list)
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            frames, _, count = line.rpartition(" ")
            parts = frames.split(";")
            # a child's stack hangs below its parent's process frame: the last one is the sampled process
            last = max((i for i, frame in enumerate(parts) if frame.startswith("process ")), default=None)
            if last is None:  # profiled without --subprocesses: one process
                stacks["process"].append((parts, int(count)))
            else:
                stacks[process_of(parts[last])].append((parts[last + 1 :], int(count)))
    return stacks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("file")
    parser.add_argument("--rate", type=float, default=50.0, help="samples per second the profile was taken at")
    parser.add_argument("--top", type=int, default=12)
    args = parser.parse_args()
    stacks = read(args.file)
    for process in sorted(stacks, key=lambda p: (not p.startswith("controller"), p)):
        categories, tops = Counter(), Counter()
        for frames, count in stacks[process]:
            category = categorize(frames)
            categories[category] += count
            if category not in ("inside a test (setup, call, teardown)", RECEIVER) and frames:
                tops[frames[-1]] += count
        total = sum(count for name, count in categories.items() if name != RECEIVER) or 1
        print(f"\n{process}: {total / args.rate:.1f} s sampled (every thread but the receiver's)")
        for name, count in categories.most_common():
            print(f"   {count / args.rate:7.1f} s  {100 * count / total:3.0f}%  {name}")
        print("   on top of the stack outside tests:")
        for frame, count in tops.most_common(args.top):
            print(f"   {count / args.rate:7.1f} s  {frame[:150]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
