"""``kvconform report …`` (also ``python -m reports …``): render and merge result files.

    kvconform report html RUN.json -o report.html
    kvconform report merge RUN1.json RUN2.json … -o merged.html [--json merged.json]
    kvconform report matrix RUN.json …          (terminal matrix)

Merging puts runs from different machines side by side (columns backend@platform-arch) and
refuses files of another results schema.
"""

from __future__ import annotations

import argparse
import json
import sys

from .html import render_runs
from .matrix import SchemaError, check_schema
from .results import SCHEMA, write_atomically
from .terminal import render


def load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            document = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise SchemaError(f"{path}: not a readable kvconform results file ({exc})") from exc
    check_schema(document, path)
    return document


def merged_document(documents: list[dict]) -> dict:
    """One results document holding every run's records (environments kept per run)."""
    return {
        "schema": SCHEMA, "merged_from": [d["environment"] for d in documents],
        "environment": documents[0]["environment"], "stale_expectations": [],
        "tests": [record for d in documents for record in d["tests"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kvconform", description="kvconform reports")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="render or merge result files").add_subparsers(dest="action", required=True)
    html = report.add_parser("html", help="render one results file as HTML")
    html.add_argument("run")
    html.add_argument("-o", "--output", required=True)
    merge = report.add_parser("merge", help="merge runs from several machines into one report")
    merge.add_argument("runs", nargs="+")
    merge.add_argument("-o", "--output", required=True, help="HTML report to write")
    merge.add_argument("--json", help="also write the merged results document")
    matrix = report.add_parser("matrix", help="print the terminal matrix")
    matrix.add_argument("runs", nargs="+")
    args = parser.parse_args(argv)
    try:
        documents = [load(path) for path in ([args.run] if args.action == "html" else args.runs)]
    except SchemaError as exc:
        print(f"kvconform: {exc}", file=sys.stderr)
        return 2
    if args.action == "matrix":
        print(render(documents, color=sys.stdout.isatty()))
        return 0
    write_atomically(args.output, render_runs(documents))
    if args.action == "merge" and args.json:
        write_atomically(args.json, json.dumps(merged_document(documents), indent=1))
    print(f"kvconform: wrote {args.output}")
    return 0
