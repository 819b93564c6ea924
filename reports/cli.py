"""``kvconform report …`` (also ``python -m kvconform.reports …``).

    kvconform report html RUN.json -o report.html
    kvconform report merge RUN1.json RUN2.json … -o merged.html [--json merged.json]
    kvconform report matrix RUN.json …          (terminal matrix)

Merging puts runs from different machines side by side (columns backend@platform-arch); it
refuses files of another results schema, and two runs that hold the same column (the same
backend on the same platform, or one file given twice): their counts would silently add up.
"""

from __future__ import annotations

import argparse
import sys

from . import results
from .html import render_runs
from .matrix import SchemaError, check_schema, column_of
from .results import SCHEMA, read_json, write_atomically
from .terminal import render


def load(path: str) -> dict:
    document = read_json(path, "kvconform results file", SchemaError)
    check_schema(document, path)
    return document


def check_distinct_columns(documents: list[dict], sources: list[str]) -> None:
    """Refuse runs that share a column: merged, their records would double that column's counts."""
    owner: dict[str, str] = {}  # column -> the source that holds it
    for document, source in zip(documents, sources):
        for column in dict.fromkeys(column_of(r) for r in document["tests"]):
            if column in owner:
                raise SchemaError(f"{owner[column]} and {source} both hold column {column}: merging would add up two runs of the "
                                  "same backend on the same platform; merge runs from different machines (or backends), or pick one")
            owner[column] = source


def merged_document(documents: list[dict]) -> dict:
    """One results document holding every run's records (environments kept per run)."""
    return {
        "schema": SCHEMA, "merged_from": [d["environment"] for d in documents],
        "environment": documents[0]["environment"], "completion": results.merged(documents), "stale_expectations": [],
        "tests": [record for d in documents for record in d["tests"]],
    }


def add_actions(report) -> None:
    """The ``html``, ``merge`` and ``matrix`` actions, on an argparse subparsers object."""
    html = report.add_parser("html", help="render one results file as HTML")
    html.add_argument("run")
    html.add_argument("-o", "--output", required=True)
    merge = report.add_parser("merge", help="merge runs from several machines into one report")
    merge.add_argument("runs", nargs="+")
    merge.add_argument("-o", "--output", required=True, help="HTML report to write")
    merge.add_argument("--json", help="also write the merged results document")
    matrix = report.add_parser("matrix", help="print the terminal matrix")
    matrix.add_argument("runs", nargs="+")


def run(args) -> int:
    sources = [args.run] if args.action == "html" else args.runs
    try:
        documents = [load(path) for path in sources]
        check_distinct_columns(documents, sources)
    except SchemaError as exc:
        print(f"kvconform: {exc}", file=sys.stderr)
        return 2
    if args.action == "matrix":
        print(render(documents, color=sys.stdout.isatty()))
        return 0
    write_atomically(args.output, render_runs(documents))
    if args.action == "merge" and args.json:
        write_atomically(args.json, results.document_text(merged_document(documents)))
    print(f"kvconform: wrote {args.output}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m kvconform.reports html|merge|matrix …`` (same as ``kvconform report …``)."""
    parser = argparse.ArgumentParser(prog="python -m kvconform.reports", description="kvconform reports")
    add_actions(parser.add_subparsers(dest="action", required=True))
    return run(parser.parse_args(argv))
