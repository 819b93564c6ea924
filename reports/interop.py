"""The producer × consumer interop table, from the connector family's ``interop`` records.

Rows are producer endpoints (a backend and one of its layouts, @ the platform it ran on),
columns consumer endpoints; a cell holds one outcome per scenario (same TP and block size,
TP 1→2 and 2→1, block size 16→32 and 32→16, fp8): *identical*, *converted* (how),
*incompatible* (why), *n/a*, or *fails*. Cells a run executed carry its result. Runs merged
from several machines meet here: a producer of one run and a consumer endpoint of another are
judged by kvconform.compat from the descriptors both runs recorded — marked "by descriptor",
since no bytes crossed between them.
"""

from __future__ import annotations

import dataclasses

from kvconform.reference import compat

OUTCOMES = ("fails", "incompatible", "converted", "identical", "n/a")
SYMBOL = {"identical": "=", "converted": "c", "incompatible": "x", "mixed": "~", "fails": "!", "n/a": "-"}
LEGEND = "= identical bytes, c converted, x incompatible, ~ compatible in some scenarios only, ! FAILS, - n/a"


@dataclasses.dataclass
class Cell:
    scenarios: dict  # scenario name → {"outcome", "detail", "executed"}

    @property
    def summary(self) -> str:
        """The first scenario that applies (same TP and block size) decides, unless a scenario
        fails, or some are incompatible where that one is not (``mixed``)."""
        outcomes = [s["outcome"] for s in self.scenarios.values() if s["outcome"] != "n/a"]
        if "fails" in outcomes:
            return "fails"
        if not outcomes:
            return "n/a"
        if outcomes[0] != "incompatible" and "incompatible" in outcomes:
            return "mixed"
        return outcomes[0]

    @property
    def symbols(self) -> str:
        """One character per scenario, in scenario order."""
        return "".join(SYMBOL[s["outcome"]] for s in self.scenarios.values())

    @property
    def executed(self) -> bool:
        return any(s.get("executed", True) for s in self.scenarios.values())


@dataclasses.dataclass
class Table:
    rows: list[str]
    columns: list[str]
    cells: dict
    scenarios: list[str]
    endpoints: dict  # key → the endpoint record (producers) or a minimal one (consumers only seen in cells)

    def cell(self, row: str, column: str) -> Cell | None:
        return self.cells.get((row, column))

    def failing(self) -> list[tuple[str, str, str, str]]:
        return [(r, c, name, s["detail"]) for (r, c), cell in self.cells.items() for name, s in cell.scenarios.items() if s["outcome"] == "fails"]


def key(label: str, platform: str, ran_on: str | None) -> str:
    """``label@platform`` where the run ran; a model of another platform says so (as matrix.column_of)."""
    if not ran_on or ran_on == platform or platform == "cpu":
        return f"{label}@{ran_on or platform}"
    return f"{label}@{ran_on} (models {platform})"


def build(documents: list[dict]) -> Table | None:
    """The table over every document's interop records (mutant producers left out), or None."""
    endpoints: dict[str, dict] = {}  # row -> its endpoint
    executed: dict[tuple[str, str], dict[str, dict]] = {}  # (row, column) -> scenario -> cell
    for document in documents:
        for record in document["tests"]:
            interop = record.get("interop")
            if not interop or interop["endpoint"].get("mutant"):
                continue
            endpoint = interop["endpoint"]
            ran_on = record.get("run_platform")
            row = key(endpoint["label"], endpoint["platform"], ran_on)
            endpoints[row] = endpoint
            for c in interop["cells"]:
                column = key(c["consumer"], c["consumer_platform"], ran_on)  # consumers ran in the same run
                executed.setdefault((row, column), {})[c["scenario"]] = {"outcome": c["outcome"], "detail": c["detail"], "executed": True}
    if not endpoints:
        return None
    rows = list(endpoints)
    columns = rows + [c for _, c in executed if c not in endpoints]
    columns = list(dict.fromkeys(columns))
    scenarios = [s["name"] for s in next(iter(endpoints.values()))["scenarios"]]
    cells = {}
    for row in rows:
        for column in columns:
            if (row, column) in executed:
                cells[row, column] = Cell(executed[row, column])
            elif column in endpoints:
                cells[row, column] = Cell(by_descriptor(endpoints[row], endpoints[column]))
    return Table(rows, columns, cells, scenarios, endpoints)


def by_descriptor(producer: dict, consumer: dict) -> dict:
    """A cell no run executed: kvconform.compat on the descriptors both runs recorded."""
    out = {}
    for s in producer["scenarios"]:
        p = producer["descriptors"].get(f"tp{s['producer_tp']}-N{s['producer_n']}-{s['kv_cache_dtype']}")
        c = consumer["descriptors"].get(f"tp{s['consumer_tp']}-N{s['consumer_n']}-{s['kv_cache_dtype']}")
        if not producer["connector"] or not consumer["connector"]:
            who = producer if not producer["connector"] else consumer
            out[s["name"]] = {"outcome": "incompatible", "detail": f"{who['backend']} does not support KV connectors", "executed": False}
        elif not isinstance(p, list) or not isinstance(c, list):
            out[s["name"]] = {"outcome": "n/a", "detail": p if isinstance(p, str) else c if isinstance(c, str) else "no descriptor recorded", "executed": False}
        else:
            verdicts = [v for row in compat.check_ranks(p, c) for v in row]
            refused = next((v for v in verdicts if not v.compatible), None)
            steps = sorted({step for v in verdicts if v.compatible and v.plan is not None and v.plan.slices for step in v.plan.steps})
            outcome = "incompatible" if refused else "converted" if steps else "identical"
            detail = refused.reason if refused else ", ".join(steps)
            out[s["name"]] = {"outcome": outcome, "detail": f"{detail} (by descriptor: not executed)".lstrip(), "executed": False}
    return out


def render_terminal(table: Table, console) -> None:
    """The table at terminal width: numbered consumer columns, one symbol per cell (its summary)."""
    from rich.table import Table as RichTable

    out = RichTable(title="interop: producers (rows) × consumers (columns, numbered like the rows)", title_justify="left",
                    box=None, padding=(0, 0), pad_edge=False)
    out.add_column("\n#", justify="right", style="dim", min_width=2, no_wrap=True)
    out.add_column("\n  producer", overflow="ellipsis", no_wrap=True, max_width=40)
    for i, _ in enumerate(table.columns, 1):  # tens above units: two characters a column
        out.add_column(f"{i // 10 or ' '}\n{i % 10}", justify="right", min_width=2, no_wrap=True)
    styles = {"identical": "green", "converted": "cyan", "incompatible": "dim", "mixed": "yellow", "fails": "bold red", "n/a": "dim"}
    for number, row in enumerate(table.rows, 1):
        symbols = []
        for column in table.columns:
            cell = table.cell(row, column)
            symbols.append(f"[{styles[cell.summary]}]{SYMBOL[cell.summary]}[/]" if cell else "")
        out.add_row(str(number), "  " + _escape(row), *symbols)
    console.print(out)
    console.print(f"  {LEGEND}; scenarios: {', '.join(table.scenarios)} (the first decides the symbol; the HTML report shows each)")
    extra = [f"{i}: {c}" for i, c in enumerate(table.columns, 1) if c not in table.rows]
    if extra:
        console.print(_escape("consumer columns beyond the producers: " + "; ".join(extra)))
    for row, column, scenario, detail in table.failing():
        console.print(f"  [bold red]FAILS[/] {_escape(row)} → {_escape(column)} ({scenario}): {_escape(detail)}")


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
