"""The end-of-run terminal report (rich), readable in an 80-column CI log with any number of
backends: one row per backend (``backend@platform``), one short cell per check family, then
one line per check that did not pass, naming the check and the backends it did not pass on.

Every backend, check and message string is data: it is put into rich ``Text`` objects, never
parsed as markup, so ``evil[/]`` prints as itself; and every string of the documents is made
:func:`printable` first, so an ESC sequence in a results file never reaches the terminal.
"""

from __future__ import annotations

import io
import re
import shutil

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from . import interop, results
from .coverage import DECLARATION
from .coverage import build as build_coverage
from .matrix import Cell, Matrix, build
from .mutation import kill_rates
from .results import FAILING

STYLE = {
    "passed": "green", "failed": "bold red", "error": "bold red", "crashed": "bold magenta",
    "timeout": "bold magenta", "unexpected-pass": "bold yellow", "expected-failure": "yellow",
    "not-applicable": "dim", "skipped": "dim",
}
WORD = {"failed": "FAIL", "error": "ERROR", "crashed": "CRASH", "timeout": "TIMEOUT", "unexpected-pass": "XPASS",
        "expected-failure": "xfail", "skipped": "skip"}
# Matrix cells: a count and a letter after it ("12F"), so ten families fit beside a 26-character
# name in 80 columns and no cell reads as a layout standard ("E1").
LETTER = {"failed": "F", "error": "E", "crashed": "C", "timeout": "T", "unexpected-pass": "X", "expected-failure": "x", "skipped": "s"}
NOT_PASSED = ("crashed", "timeout", "error", "failed", "unexpected-pass", "expected-failure", "skipped")
# The symbols, not example counts (#38: "3C crashed" read as a count of this run's).
LEGEND = ("ok all passed · n/a not applicable · otherwise the worst outcome, counted, then its symbol: "
          + " · ".join(f"{LETTER[o]} {results.WORDS[o]}" for o in NOT_PASSED) + " · blank: not run")
SHORT_FAMILY = {"equivalence": "equiv", "connector": "conn"}
MIN_NAME = 20
# What a terminal would act on: C0 controls but tab and newline, DEL, C1 controls, and the
# bidirectional overrides that reorder what a reader sees ("Trojan source").
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` with every control character written as an escape (ESC as ``\\x1b``): what a
    results or expectations field may carry, shown as itself, never acted on by the terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", text)


def _printable_data(value):
    """A copy of a document in which every string (keys too) is :func:`printable`; unchanged parts are shared."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable_data(k): _printable_data(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable_data(v) for v in value]
    return value


def cell_text(cell: Cell | None) -> tuple[str, str]:
    """(text, style) for one matrix cell in words (HTML): worst outcome, counts where it matters."""
    if cell is None:
        return "", ""
    counts, worst = cell.counts, cell.worst
    total = sum(counts.values())
    if worst == "passed":
        return f"pass {counts['passed']}", STYLE[worst]
    if worst == "not-applicable":
        return "n/a", STYLE[worst]
    return f"{WORD[worst]} {counts[worst]}/{total}", STYLE[worst]


def _short_cell(cells: list[Cell]) -> Text:
    """One family of one backend: the worst outcome over its checks."""
    if not cells:
        return Text("")
    counts = sum((c.counts for c in cells), start=type(cells[0].counts)())
    worst = next((o for o in NOT_PASSED if counts[o]), "passed" if counts["passed"] else "not-applicable")
    if worst == "passed":
        return Text("ok", style=STYLE[worst])
    if worst == "not-applicable":
        return Text("n/a", style=STYLE[worst])
    return Text(f"{counts[worst]}{LETTER[worst]}", style=STYLE[worst])


def wrap_name(name: str, width: int) -> str:
    """Break a long name at a space or after ``_ : @ . -`` so it reads whole over several lines (never cut)."""
    if len(name) <= width:
        return name
    lines, line = [], ""
    for piece in re.findall(r"[^_:@.\- ]*[_:@.\- ]?", name):
        while len(piece) > width:  # no separator for too long: fold
            if line:
                lines.append(line)
                line = ""
            lines.append(piece[:width])
            piece = piece[width:]
        if len(line) + len(piece.rstrip()) > width:
            lines.append(line)
            line = ""
        line += piece
    return "\n".join(part.rstrip() for part in (lines + [line] if line else lines))


def _common_platform(columns: list[str]) -> str:
    """``@cpu`` when every column ran on one platform: said once in the header, not per row."""
    platforms = {c.split("@", 1)[1].split(" ", 1)[0] if "@" in c else "" for c in columns}
    return "@" + platforms.pop() if len(platforms) == 1 and "" not in platforms else ""


def _family_width(family: str) -> int:
    return max(len(SHORT_FAMILY.get(family, family)), 3)


def _family_chunks(families: list[str], room: int) -> list[list[str]]:
    """Families per table so that each table fits ``room`` columns (one table when it fits)."""
    chunks: list[list[str]] = []
    line: list[str] = []
    used = 0
    for family in families:
        need = _family_width(family) + 1  # + the divider
        if line and used + need > room:
            chunks.append(line)
            line, used = [], 0
        line.append(family)
        used += need
    return chunks + [line] if line else chunks


def _summary_tables(matrix: Matrix, width: int) -> list[Table]:
    suffix = _common_platform(matrix.columns)
    names = {c: c.replace(suffix, "", 1) if suffix else c for c in matrix.columns}
    families = list(dict.fromkeys(matrix.families[row] for row in matrix.rows))
    longest = max(len(n) for n in names.values())
    family_width = sum(_family_width(f) + 1 for f in families)
    name_width = max(MIN_NAME, min(longest, width - family_width))
    tables = []
    for chunk in _family_chunks(families, width - name_width):
        table = Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False)
        table.add_column(Text("backend" + suffix), width=name_width, no_wrap=True)
        for family in chunk:
            table.add_column(Text(SHORT_FAMILY.get(family, family)), justify="right", width=_family_width(family), no_wrap=True)
        for column in matrix.columns:
            row = [Text(wrap_name(names[column], name_width))]
            for family in chunk:
                cells = [cell for r in matrix.rows if matrix.families[r] == family and (cell := matrix.cell(r, column))]
                row.append(_short_cell(cells))
            table.add_row(*row)
        tables.append(table)
    return tables


def _not_passed(matrix: Matrix) -> list[Text]:
    """One line per check that did not pass somewhere, then its backends indented below."""
    specific = set(matrix.backend_specific_failures())
    lines = []
    for row in matrix.rows:
        bad = [(column, cell) for column in matrix.columns if (cell := matrix.cell(row, column)) and cell.worst in NOT_PASSED]
        if not bad:
            continue
        lines.append(Text.assemble((matrix.families[row], "dim"), " ", (row, "bold")))
        for column, cell in bad:
            counts = cell.counts
            total = sum(counts.values())
            parts = [f"{WORD[o]} {counts[o]}/{total}" for o in NOT_PASSED if counts[o]]
            only = ("  (the only backend failing it)", "bold") if (row, column) in specific else ""
            lines.append(Text.assemble("    ", (", ".join(parts), STYLE[cell.worst]), "  ", column, only))
    return lines


def _failure_blocks(documents: list[dict]) -> list[Text]:
    """Each new failure as a plain run prints it: its test id, then its message — the property,
    where the wrong bytes came from, the first differing elements and the repro line."""
    blocks = []
    for record in (r for d in documents for r in d["tests"] if r["outcome"] in FAILING):
        message = record.get("message") or ""
        repro = record.get("repro") or ""
        blocks.append(Text.assemble((f"{WORD[record['outcome']]} ", STYLE[record["outcome"]]), (record["nodeid"], "bold"), "\n",
                                    message, f"\n  repro: {repro}" if repro and repro not in message else ""))
    return blocks


def _totals(documents: list[dict], columns: int) -> Text:
    records = [r for d in documents for r in d["tests"]]
    bad = any(r["outcome"] in FAILING for r in records)
    return Text.assemble(("total: ", "bold"), (results.counts_text(records), "bold red" if bad else "green"),
                         f" = {len(records)} tests ({columns} backend{'s' if columns != 1 else ''}"
                         f"{f', {len(documents)} runs' if len(documents) > 1 else ''})")


def _verdict_line(verdict: tuple[str, str]) -> Text:
    word, why = verdict
    style = {results.CONFORMS: "bold green", results.DOES_NOT_CONFORM: "bold red"}.get(word, "bold yellow")  # amber: short of CONFORMS
    return Text.assemble(("kvconform verdict: ", "bold"), (word, style), f" — {why}")


def render(documents: list[dict], *, color: bool, width: int | None = None, failures: bool = False) -> str:
    """The report for one run, or several side by side; ``width`` defaults to the terminal's.
    ``failures``: each new failure's block too (``kvconform run``, whose pytest processes' own
    output is not shown; a plain run's pytest has printed them)."""
    width = width or shutil.get_terminal_size((80, 24)).columns
    documents = [_printable_data(document) for document in documents]
    matrix = build(documents)
    out = io.StringIO()
    console = Console(file=out, force_terminal=color, no_color=not color, width=width, highlight=False, emoji=False)
    document = documents[0] if len(documents) == 1 else {"completion": results.merged(documents)}
    warning = results.headline(document)
    holes = build_coverage(documents).holes
    verdict = results.verdict(documents, holes=len(holes))
    console.print(_verdict_line(verdict))
    if warning:
        console.print(Text(warning, style="bold yellow"))
    for hole in (h for h in holes if h.family == DECLARATION):  # in every run, filtered or not: the declaration is the vendor's to fix
        console.print(Text.assemble(("WARNING ", "bold yellow"), f"backend {hole.column} {hole.what}"))
    if not matrix.columns:
        console.print(Text("no kvconform test reached a verdict", style="bold yellow"))
        return out.getvalue()
    for table in _summary_tables(matrix, width):
        console.print(table)
    console.print(Text(LEGEND, style="dim"))
    console.print(_totals(documents, len(matrix.columns)))
    not_passed = _not_passed(matrix)
    if not_passed:
        console.print(Text("\nNot passed (family, check, then each backend it did not pass on):", style="bold"))
        for line in not_passed:
            console.print(line)
    blocks = _failure_blocks(documents) if failures else []
    if blocks:
        console.print(Text(f"\nNew failures ({len(blocks)}), each as its check reported it:", style="bold"))
        for block in blocks:
            console.print(block)
    mutants, families = kill_rates(documents) if results.any_mutant(documents) else ([], {})
    if mutants:
        console.print(Text("\nMutation kill rate (killed: a check of the family it targets failed; families that did not run are not counted):", style="bold"))
        rate = Table(box=box.SIMPLE_HEAD, show_edge=False)
        for name in ("family", "killed", "aimed", "rate"):
            rate.add_column(name)
        for family, (killed, aimed) in families.items():
            rate.add_row(family, str(killed), str(aimed), Text(f"{100 * killed / aimed:.0f}%", style="green" if killed == aimed else "bold red"))
        console.print(rate)
        for row in mutants:
            missed = [f for f in row["ran"] if f not in row["killed"]]
            if missed:
                console.print(Text.assemble(("  SURVIVED ", "bold red"), f"mutant:{row['mutant']} in {', '.join(missed)}"))
            if row["not_run"]:
                console.print(Text.assemble(("  not run ", "yellow"), f"mutant:{row['mutant']}: {', '.join(row['not_run'])} (not counted)"))
    interop_table = interop.build(documents) if any(r.get("interop") for d in documents for r in d["tests"]) else None
    if interop_table:
        interop.render_terminal(interop_table, console)
    console.print(_verdict_line(verdict))  # the partial-run warning once, at the top: the verdict line says PARTIAL RUN and why
    return out.getvalue()
