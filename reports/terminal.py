"""The end-of-run terminal matrix (rich): checks × backend@platform, counts and colours."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from . import interop
from .matrix import Cell, build
from .mutation import kill_rates

STYLE = {
    "passed": "green", "failed": "bold red", "error": "bold red", "crashed": "bold magenta",
    "timeout": "bold magenta", "unexpected-pass": "bold yellow", "expected-failure": "yellow",
    "not-applicable": "dim", "skipped": "dim",
}


def cell_text(cell: Cell | None) -> tuple[str, str]:
    """(text, style) for one matrix cell: worst outcome, with counts where it matters."""
    if cell is None:
        return "", ""
    counts, worst = cell.counts, cell.worst
    total = sum(counts.values())
    if worst == "passed":
        return f"pass {counts['passed']}", STYLE[worst]
    if worst in ("not-applicable", "skipped"):
        return "n/a" if counts["passed"] == 0 else f"pass {counts['passed']}", STYLE["not-applicable" if counts["passed"] == 0 else "passed"]
    label = {"failed": "FAIL", "error": "ERROR", "crashed": "CRASH", "timeout": "TIMEOUT", "unexpected-pass": "XPASS", "expected-failure": "xfail"}[worst]
    return f"{label} {counts[worst]}/{total}", STYLE[worst]


def render(documents: list[dict], *, color: bool, width: int = 160) -> str:
    matrix = build(documents)
    table = Table(title="kvconform matrix (rows: checks, columns: backend@platform)", show_lines=False)
    table.add_column("family", style="dim")
    table.add_column("check")
    for column in matrix.columns:
        table.add_column(column, justify="center")
    for row in matrix.rows:
        table.add_row(matrix.families[row], row, *(f"[{s}]{t}[/]" if s else t for t, s in (cell_text(matrix.cell(row, c)) for c in matrix.columns)))
    totals = []
    for column in matrix.columns:
        t = matrix.column_totals(column)
        bad = sum(t[o] for o in ("failed", "error", "crashed", "timeout"))
        totals.append(f"[{'bold red' if bad else 'green'}]{t['passed']} pass / {bad} fail[/]")
    table.add_row("", "[bold]total[/]", *totals)
    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=width)
    console.print(table)
    mutants, families = kill_rates(documents)
    if mutants:
        rate = Table(title="mutation kill rate (a mutant is killed when a check of the family it targets fails)")
        for name in ("family", "killed", "aimed", "rate"):
            rate.add_column(name)
        for family, (killed, aimed) in families.items():
            rate.add_row(family, str(killed), str(aimed), f"[{'green' if killed == aimed else 'bold red'}]{100 * killed / aimed:.0f}%[/]")
        console.print(rate)
        for row in mutants:
            missed = [f for f in row["aimed"] if f not in row["killed"]]
            if missed:
                console.print(f"  [bold red]SURVIVED[/] mutant:{row['mutant']} in {', '.join(missed)}")
    table = interop.build(documents)
    if table:
        interop.render_terminal(table, console)
    specific = matrix.backend_specific_failures()
    if specific:
        console.print("[bold]Backend-specific failures[/] (fails on exactly one backend — that vendor's clearest action item):")
        for row, column in specific:
            console.print(f"  [red]{column}[/]: {row}")
    return out.getvalue()
