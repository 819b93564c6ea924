"""The pass/fail matrix: rows = checks, columns = backend@platform, built from result documents.

One builder serves the terminal table, the HTML report and ``merge``; runs from different
machines become different columns.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter, defaultdict

from kvconform.reference.errors import InputError

from .results import FAILING, SCHEMA

# Worst first: a cell shows the worst outcome among its tests.
SEVERITY = ("crashed", "timeout", "error", "failed", "unexpected-pass", "expected-failure", "skipped", "not-applicable", "passed")


class SchemaError(InputError):
    pass


def check_schema(document: dict, source: str) -> None:
    """Refuse documents of another schema (major version) with a clear message."""
    schema = document.get("schema")
    if schema != SCHEMA:
        raise SchemaError(f"{source}: results schema {schema!r} is not {SCHEMA!r}; re-run the suite with this kvconform version")


def column_of(record: dict) -> str:
    """``backend@platform``: where the run ran. A backend that declares another platform than
    the one it ran on is a model of that platform (reference_gfx942 on a CPU), and says so —
    it must never share a column with a run on the real machine."""
    arch = record.get("arch")
    declared = f"{record.get('platform') or '?'}{'-' + arch if arch else ''}"
    ran = record.get("run_platform")
    if not ran or ran == declared or declared == "cpu":  # a portable (cpu-declared) backend runs wherever it is put
        return f"{record['backend']}@{ran or declared}"
    return f"{record['backend']}@{ran} (models {declared})"


@dataclasses.dataclass
class Cell:
    row: str
    column: str
    records: list = dataclasses.field(default_factory=list)

    @property
    def counts(self) -> Counter:
        return Counter(r["outcome"] for r in self.records)

    @property
    def worst(self) -> str:
        counts = self.counts
        return next((o for o in SEVERITY if counts[o]), "not-applicable")

    @property
    def anchor(self) -> str:
        """The HTML id of this cell's details: readable, and unique per (row, column) — the
        readable part folds characters (``a.b`` and ``a-b`` read alike), the hash does not."""
        safe = "".join(c if c.isascii() and c.isalnum() else "-" for c in f"{self.row}--{self.column}")
        digest = hashlib.sha256(f"{self.row}\0{self.column}".encode("utf-8", "surrogatepass")).hexdigest()[:12]
        return f"cell-{safe}-{digest}"


@dataclasses.dataclass
class Matrix:
    rows: list[str]
    columns: list[str]
    cells: dict[tuple[str, str], Cell]
    families: dict[str, str]

    def cell(self, row: str, column: str) -> Cell | None:
        return self.cells.get((row, column))

    def column_totals(self, column: str) -> Counter:
        total = Counter()
        for row in self.rows:
            cell = self.cell(row, column)
            if cell:
                total.update(cell.counts)
        return total

    def backend_specific_failures(self) -> list[tuple[str, str]]:
        """(check, column) where exactly one column fails among ≥ 2 that ran the check."""
        out = []
        for row in self.rows:
            ran = [c for c in self.columns if (cell := self.cell(row, c)) and cell.worst not in ("not-applicable", "skipped")]
            failing = [c for c in ran if self.cell(row, c).worst in FAILING]
            if len(ran) >= 2 and len(failing) == 1:
                out.append((row, failing[0]))
        return out


def build(documents: list[dict]) -> Matrix:
    cells: dict[tuple[str, str], Cell] = {}
    families: dict[str, str] = {}
    columns: dict[str, None] = {}
    rows_by_family = defaultdict(dict)
    for document in documents:
        for record in document["tests"]:
            row, column = record["check"], column_of(record)
            families[row] = record.get("family") or "other"
            rows_by_family[families[row]][row] = None
            columns[column] = None
            cells.setdefault((row, column), Cell(row, column)).records.append(record)
    rows = [row for family in sorted(rows_by_family) for row in rows_by_family[family]]
    return Matrix(rows=rows, columns=list(columns), cells=cells, families=families)
