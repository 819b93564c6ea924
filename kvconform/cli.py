"""The ``kvconform`` command.

    kvconform run --backend a,b,c [--kvc-timeout S] [-j N] [-- PYTEST ARGS]   (one process per backend)
    kvconform report html|merge|matrix …                                      (results JSON → reports)
    kvconform compat PRODUCER.json CONSUMER.json                              (KV-connector handshake check)
"""

from __future__ import annotations

import argparse

from kvconform import compat
from kvconform.reports import cli as report_cli


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvconform", description="kvconform: KV-cache layout conformance")
    sub = parser.add_subparsers(dest="command", required=True)
    report_cli.add_actions(sub.add_parser("report", help="render or merge result files").add_subparsers(dest="action", required=True))
    compat.add_arguments(sub.add_parser("compat", help="may a producer's KV blocks land exactly in a consumer? (layout descriptors)"))
    run = sub.add_parser("run", help="run each backend in its own process (fault isolation) and merge")
    run.add_argument("--backend", required=True, help="comma-separated backends")
    run.add_argument("--out", default="kvconform-results", help="directory for per-backend and merged results")
    run.add_argument("--kvc-timeout", type=float, default=600.0, help="seconds per test before it is ended as timeout")
    run.add_argument("-j", "--jobs", type=int, default=1, help="backends run at once")
    run.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after '--': extra pytest arguments")
    args = parser.parse_args(argv)
    if args.command == "report":
        return report_cli.run(args)
    if args.command == "compat":
        return compat.run(args)
    from kvconform.conformance.isolation import run as run_isolated

    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    return run_isolated([b for b in args.backend.split(",") if b], extra, args.out, args.kvc_timeout, args.jobs)
