"""What a run exercised, and the holes: declared capabilities no case reached.

Every check names the spec clauses it verifies (``kvc_clause``, docs/SPEC.md) and every test
records what it exercised: one entry per cache it built — its kv_cache_dtype and storage
dtype, layout and size classes — completed by the ops with the address classes and fp8 value
classes they touched (``clauses`` and ``exercised`` in docs/RESULTS_SCHEMA.md). This module
turns result documents into the coverage table — per backend, (family × cache dtype × layout)
rows with the number of cases and their size- and value-class counts — and compares it with
what each backend declares (``environment.backends[name].declared``): a declared capability
that no case reached is a *hole*. docs/COVERAGE.md is the table for the built-in backends
(``kvconform coverage``); the HTML report shows it for any run.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict

from .matrix import column_of
from .results import NOT_RUN

# Size classes: properties of a cache's geometry, and of the addresses an op touched.
GEOMETRY_CLASSES = ("h=1", "h=2", "h!=2^k", "d!=2^k", "n!=2^k")
LAYER_CLASSES = ("l>=3",)
ADDRESS_CLASSES = ("block>=2^16", "element>=2^31", "byte>=2^31")
SIZE_CLASSES = GEOMETRY_CLASSES + LAYER_CLASSES + ADDRESS_CLASSES
# fp8 value classes of the scaled value x / scale an encoder rounds (docs/SPEC.md §5).
VALUE_CLASSES = ("-0", "nan", "max", ">max", "tie", "near-tie")
NEAR_TIE = 2.0**-18  # |y - tie| <= tie·2^-18 (and y != tie): the tie·(1 ± 2^-20) probes, with room for fp32 rounding


@dataclasses.dataclass(frozen=True)
class Need:
    """What a backend that runs a family must have exercised."""

    cache_dtypes: bool = False  # every declared cache dtype, on every layout the family ran on
    sizes: tuple[str, ...] = ()  # these size classes, where the backend declares them
    values: bool = False  # every fp8 value class, for every declared fp8 cache dtype


# family -> Need. gating has no cache; equivalence's cells are its golden cases (applicability).
NEEDS = {
    "shape": Need(cache_dtypes=True, sizes=LAYER_CLASSES),
    "split": Need(cache_dtypes=True),
    "write": Need(cache_dtypes=True, sizes=SIZE_CLASSES, values=True),
    "shuffle": Need(cache_dtypes=True),
    "swap": Need(cache_dtypes=True, sizes=LAYER_CLASSES + ADDRESS_CLASSES),
    "copy": Need(cache_dtypes=True, sizes=LAYER_CLASSES + ADDRESS_CLASSES),
    "read": Need(cache_dtypes=True, sizes=SIZE_CLASSES),
}


def is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def geometry_classes(*, num_layers: int, block_size: int, num_kv_heads: int, head_size: int) -> list[str]:
    """The size classes a cache of this geometry is in."""
    found = {
        "h=1": num_kv_heads == 1, "h=2": num_kv_heads == 2, "h!=2^k": not is_power_of_two(num_kv_heads),
        "d!=2^k": not is_power_of_two(head_size), "n!=2^k": not is_power_of_two(block_size), "l>=3": num_layers >= 3,
    }
    return [name for name, hit in found.items() if hit]


def address_classes(*, max_block: int, max_element: int, element_size: int) -> list[str]:
    """The size classes of the largest block id and element offset an op touched."""
    found = {"block>=2^16": max_block >= 1 << 16, "element>=2^31": max_element >= 1 << 31,
             "byte>=2^31": (max_element + 1) * element_size - 1 >= 1 << 31}
    return [name for name, hit in found.items() if hit]


def cache_dtype_label(kv_cache_dtype: str, storage: str) -> str:
    """``auto/bfloat16``, ``fp8/float8_e4m3fn``: the kv_cache_dtype string and what it stores."""
    return f"{kv_cache_dtype}/{storage.removeprefix('torch.')}"


def is_fp8_label(label: str) -> bool:
    return "/float8_" in label


@dataclasses.dataclass
class Row:
    """One (backend column, family, cache dtype, layout) cell group: cases and class counts."""

    cases: int = 0
    sizes: Counter = dataclasses.field(default_factory=Counter)
    values: Counter = dataclasses.field(default_factory=Counter)


@dataclasses.dataclass
class Coverage:
    rows: dict  # (column, family, cache dtype, layout) -> Row
    declared: dict  # column -> the backend's declared facts (``declared`` of its environment entry)
    families_run: dict  # column -> families with at least one test that ran
    clauses: dict  # clause id -> {check id: number of test cases that ran}
    holes: list  # Hole

    def columns(self) -> list[str]:
        return sorted(self.declared)

    def rows_of(self, column: str) -> list[tuple[tuple, Row]]:
        return sorted(((k, r) for k, r in self.rows.items() if k[0] == column), key=lambda kr: kr[0])


@dataclasses.dataclass(frozen=True)
class Hole:
    column: str
    family: str
    what: str

    def __str__(self) -> str:
        return f"{self.column} {self.family}: {self.what}"


def check_of(record: dict) -> str:
    """``conformance/test_write.py::test_name`` (the test id without its parameters)."""
    return record["nodeid"].split("[", 1)[0]


def build(documents: list[dict], columns=None) -> Coverage:
    """The coverage of these runs; ``columns`` (backend@platform) limits the holes looked for."""
    rows: dict = defaultdict(Row)
    declared: dict[str, dict] = {}  # column -> what its backend declared
    families_run: defaultdict[str, set[str]] = defaultdict(set)
    clauses: dict = defaultdict(Counter)
    for document in documents:
        backends = document["environment"].get("backends", {})
        for record in document["tests"]:
            column = column_of(record)
            facts = backends.get(record["backend"], {}).get("declared")
            if facts is not None:
                declared.setdefault(column, facts)
            ran = record["outcome"] not in NOT_RUN
            for clause in record.get("clauses") or ():
                clauses[clause][check_of(record)] += ran
            if not ran:
                continue
            families_run[column].add(record["family"])
            for entry in record.get("exercised") or ():
                row = rows[(column, record["family"], cache_dtype_label(entry["kv_cache_dtype"], entry["dtype"]), entry["layout"])]
                row.cases += 1
                row.sizes.update(entry["sizes"])
                row.values.update(entry["values"])
    wanted = [c for c in declared if columns is None or c in columns]
    coverage = Coverage(rows=dict(rows), declared={c: declared[c] for c in wanted}, families_run=dict(families_run),
                        clauses={c: dict(sorted(v.items())) for c, v in sorted(clauses.items())}, holes=[])
    coverage.holes = [hole for column in wanted for hole in holes_of(coverage, column)]
    return coverage


# kv_cache_dtype strings that name one format (reference/fp8.py cache_dtype_for): a backend that
# takes one takes the other, and cases are keyed to one of them (the golden fp8 digests to "fp8").
ALIASES = (("fp8", "fp8_e4m3"),)
DECLARATION = "declaration"  # the family of a hole in the declaration itself


def declaration_problems(facts: dict) -> list[str]:
    """Where a backend's declaration is at odds with itself — an alias declared alone, a cache
    dtype none of its layouts holds, an fp8 kv_cache_dtype and no op that writes a cache: each
    leaves cases the backend claims silently not applicable (#38: ``fp8_e4m3`` without ``fp8``
    made the e4m3 golden case not applicable and the run certifiable)."""
    kv = facts.get("kv_cache_dtypes") or []
    found = [f"declares kv_cache_dtype {one} without its alias {other} (both store the same fp8 format; "
             f"the cases keyed to {other} do not run): declare both"
             for pair in ALIASES for one, other in (pair, pair[::-1]) if one in kv and other not in kv]
    by_layout = facts.get("layout_cache_dtypes")
    if facts.get("layouts") and by_layout is not None:  # documents before #38 do not say what each layout holds
        held = {label for labels in by_layout.values() for label in labels}
        found += [f"declares cache dtype {label}, which none of its layouts holds: no case can use it"
                  for label in facts.get("cache_dtypes") or [] if label not in held]
    fp8 = [k for k in kv if k != "auto"]
    if fp8 and facts.get("ops") is not None and "write" not in facts["ops"]:
        found.append(f"declares kv_cache_dtype {', '.join(fp8)} but not op write: no check can put a value in such a cache")
    return found


def holes_of(coverage: Coverage, column: str) -> list[Hole]:
    """Each problem of ``column``'s declaration, then each declared capability that no case of a
    family it runs reached."""
    facts = coverage.declared[column]
    found = [Hole(column, DECLARATION, what) for what in declaration_problems(facts)]
    for family in sorted(coverage.families_run.get(column, ())):
        need = NEEDS.get(family)
        if need is None:
            continue
        mine = [(key, row) for key, row in coverage.rows.items() if key[0] == column and key[1] == family]
        if need.cache_dtypes:
            layouts = sorted({key[3] for key, _ in mine})
            present = {(key[2], key[3]) for key, row in mine if row.cases}
            held = facts.get("layout_cache_dtypes", {})  # what each layout can hold of the declared dtypes
            found += [Hole(column, family, f"no case of {label} on {layout}")
                      for layout in layouts for label in held.get(layout, facts["cache_dtypes"]) if (label, layout) not in present]
        sizes: Counter[str] = Counter()
        for _, row in mine:
            sizes.update(row.sizes)
        found += [Hole(column, family, f"no case in size class {name}") for name in need.sizes if name in facts["size_classes"] and not sizes[name]]
        if need.values:
            for label in (lab for lab in facts["cache_dtypes"] if is_fp8_label(lab)):
                values: Counter[str] = Counter()
                for key, row in mine:
                    if key[2] == label:
                        values.update(row.values)
                found += [Hole(column, family, f"no {label} value in class {name}") for name in VALUE_CLASSES if not values[name]]
    return found


# ----------------------------------------------------------------------------- rendering
def _count(n: int) -> str:
    return str(n) if n else "·"


def render_markdown(coverage: Coverage, *, how: str) -> str:
    """docs/COVERAGE.md: clause → checks, the holes, and per backend the exercised cells."""
    lines = [
        "# Coverage",
        "",
        f"Generated by `kvconform coverage` — do not edit. {how}",
        "",
        "Each row counts the cases (one per cache a test built: one Hypothesis example, one fixed",
        "case) of one check family on one cache dtype (`kv_cache_dtype/storage`) and layout, and how",
        "many of them fell in each size class and fp8 value class ([SPEC.md](SPEC.md); classes in",
        "`kvconform/reports/coverage.py`). `·` is zero. A declared capability that no case reached",
        "is a hole; `tests/test_coverage.py` fails on any.",
        "",
        "## Clauses → checks",
        "",
        "| clause | checks (tests run) |",
        "|---|---|",
    ]
    for clause, checks in coverage.clauses.items():
        named = ", ".join(f"`{c.split('::')[1]}` ({n})" for c, n in checks.items())
        lines.append(f"| [{clause}](SPEC.md#{clause}) | {named} |")
    lines += ["", "## Holes", ""]
    lines += [f"- {hole}" for hole in coverage.holes] or ["None: every declared capability of every backend below has cases."]
    header = ["family", "cache dtype", "layout", "cases", *SIZE_CLASSES, *VALUE_CLASSES]
    for column in coverage.columns():
        facts = coverage.declared[column]
        lines += [
            "", f"## {column}", "",
            f"Declared: cache dtypes {', '.join(facts['cache_dtypes'])}; size classes {', '.join(facts['size_classes']) or '—'}; "
            f"layouts {', '.join(f'`{lay}`' for lay in facts['layouts'])}.".replace("|", "\\|"),
            "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header),
        ]
        for (_, family, dtype, layout), row in coverage.rows_of(column):
            cells = [family, dtype, f"`{layout}`".replace("|", "\\|"), str(row.cases), *(_count(row.sizes[s]) for s in SIZE_CLASSES),
                     *(_count(row.values[v]) if is_fp8_label(dtype) else "—" for v in VALUE_CLASSES)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
