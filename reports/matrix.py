"""The pass/fail matrix: rows = checks, columns = backend@platform, built from result documents.

One builder serves the terminal table, the HTML report and ``merge``; runs from different
machines become different columns.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter, defaultdict

from kvconform.errors import InputError

from .results import FAILING, NOT_APPLICABLE, NOT_RUN, OUTCOMES, SCHEMA, SEVERITY


class SchemaError(InputError):
    pass


def check_schema(document: dict, source: str) -> None:
    """Refuse documents of another schema (major version), and documents whose fields are not
    of the types docs/RESULTS_SCHEMA.md gives them, with a message naming the file and field:
    a results file may come from anyone, and no renderer should meet a field it cannot read."""
    if not isinstance(document, dict):
        raise SchemaError(f"{source}: expected a {SCHEMA} JSON object, got {type(document).__name__}")
    schema = document.get("schema")
    if schema != SCHEMA:
        raise SchemaError(f"{source}: results schema {schema!r} is not {SCHEMA!r}; re-run the suite with this kvconform version")
    problem = document_problem(document)
    if problem:
        raise SchemaError(f"{source}: {problem}; expected a {SCHEMA} document (docs/RESULTS_SCHEMA.md)")


_STR, _OPT_STR, _OPT_NUM = (str,), (str, type(None)), (int, float, type(None))
_OPT_DICT, _OPT_LIST = (dict, type(None)), (list, type(None))
RECORD_TYPES = {
    "nodeid": _STR, "backend": _STR, "check": _STR, "outcome": _STR, "family": _STR, "platform": _OPT_STR, "arch": _OPT_STR, "run_platform": _OPT_STR, "layout": _OPT_STR, "geometry": _OPT_STR,
    "kv_cache_dtype": _OPT_STR, "model_dtype": _OPT_STR, "message": _OPT_STR, "repro": _OPT_STR, "hypothesis_draw": _OPT_STR,
    "raised": _OPT_STR, "seed": _OPT_NUM, "duration_s": _OPT_NUM, "clauses": _OPT_LIST, "exercised": _OPT_LIST,
    "not_applicable": _OPT_DICT, "failure": _OPT_DICT, "digest": _OPT_DICT, "interop": _OPT_DICT,
    "examples_not_applicable": _OPT_DICT, "block_sizes": _OPT_LIST, "result_digest": _OPT_STR,
}
EXERCISED_TEXT = ("kv_cache_dtype", "dtype", "layout")


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _objects_with_text(value, *fields) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) and all(isinstance(v.get(f), str) for f in fields) for v in value)


def _declared_problem(facts) -> bool:
    """Whether a backend's ``declared`` facts are not lists of strings (and a dict of them), with
    the cache dtypes and size classes the coverage table holds it to."""
    if facts is None:
        return False
    if not isinstance(facts, dict):
        return True
    held = facts.get("layout_cache_dtypes", {})
    return (not all(_strings(facts.get(k)) for k in ("cache_dtypes", "size_classes")) or not all(_strings(v) for k, v in facts.items() if k not in ("layout_cache_dtypes", "head_sizes", "block_sizes", "num_kv_heads", "num_layers"))
            or not isinstance(held, dict) or not all(_strings(v) for v in held.values()))


def _failure_problem(failure) -> str | None:
    if failure is None:
        return None
    if not _objects_with_text(failure.get("mismatches", []), "where"):
        return "failure.mismatches is not a list of objects with a string where"
    if not isinstance(failure.get("byte_map"), (dict, type(None))):
        return "failure.byte_map is not an object"
    if not isinstance(failure.get("diagnosis") or [], list) or not all(isinstance(d, dict) for d in failure.get("diagnosis") or []):
        return "failure.diagnosis is not a list of objects"
    return None


def _interop_problem(interop) -> str | None:
    if interop is None:
        return None
    endpoint = interop.get("endpoint")
    if not (isinstance(endpoint, dict) and all(isinstance(endpoint.get(k), str) for k in ("label", "platform"))
            and _objects_with_text(endpoint.get("scenarios", []), "name") and isinstance(endpoint.get("descriptors", {}), dict)):
        return "interop.endpoint is not an object with string label and platform and scenarios with names"
    if not _objects_with_text(interop.get("cells", []), "consumer", "consumer_platform", "scenario", "outcome"):
        return "interop.cells is not a list of objects with string consumer, consumer_platform, scenario and outcome"
    return None


def _type_problem(value, types: tuple, where: str) -> str | None:
    if isinstance(value, bool) and bool not in types and types != _STR:  # JSON true is not a number here
        return f"{where} is a boolean"
    if not isinstance(value, types):
        return f"{where} is {type(value).__name__}, expected {' or '.join('null' if t is type(None) else t.__name__ for t in types)}"
    return None


def document_problem(document: dict) -> str | None:
    """The first field of a results document that is not of its documented type (None: all are)."""
    environment = document.get("environment")
    if not isinstance(environment, dict):
        return "environment is not an object"
    backends = environment.get("backends")
    if not isinstance(backends, dict) or not all(isinstance(f, dict) and isinstance(f.get("declared", {}), (dict, type(None)))
                                                 for f in backends.values()):
        return "environment.backends is not an object of objects"
    if any(_declared_problem(facts.get("declared")) for facts in backends.values()):
        return "environment.backends.*.declared is not an object of lists of strings"
    completion = document.get("completion")
    if completion is not None:
        if not isinstance(completion, dict) or not isinstance(completion.get("reasons", []), list) \
                or not all(isinstance(r, dict) and isinstance(r.get("kind"), str) and isinstance(r.get("what"), str) for r in completion.get("reasons", [])):
            return "completion is not an object whose reasons each have a kind and a what"
        problem = _type_problem(completion.get("exit_status"), (int, type(None)), "completion.exit_status")
        if problem:
            return problem
        left_out = completion.get("backends_left_out")
        if not isinstance(left_out, (dict, type(None))) or not all(isinstance(why, str) for why in (left_out or {}).values()):
            return "completion.backends_left_out is not an object of strings"
    stale = document.get("stale_expectations", [])
    if not isinstance(stale, list) or not all(isinstance(e, dict) for e in stale):
        return "stale_expectations is not a list of objects"
    tests = document.get("tests")
    if not isinstance(tests, list):
        return f"tests is {type(tests).__name__}, expected a list of records"
    for number, record in enumerate(tests):
        if not isinstance(record, dict):
            return f"tests[{number}] is {type(record).__name__}, expected an object"
        for field, types in RECORD_TYPES.items():
            if field in record or types is _STR:
                problem = _type_problem(record.get(field), types, f"tests[{number}].{field}")
                if problem:
                    return problem
        if record["outcome"] not in OUTCOMES:
            return f"tests[{number}].outcome {record['outcome']!r} is not one of {', '.join(OUTCOMES)}"
        for entry in record.get("exercised") or ():
            if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in EXERCISED_TEXT) \
                    or not _strings(entry.get("sizes", [])) or not _strings(entry.get("values", [])):
                return f"tests[{number}].exercised holds an entry without string {', '.join(EXERCISED_TEXT)} and lists of sizes and values"
        if not _strings(record.get("clauses") or []):
            return f"tests[{number}].clauses is not a list of strings"
        problem = _failure_problem(record.get("failure")) or _interop_problem(record.get("interop"))
        if problem:
            return f"tests[{number}].{problem}"
        reason = record.get("not_applicable")
        if reason is not None and not all(isinstance(reason.get(k), str) for k in ("kind", "who", "what")):
            return f"tests[{number}].not_applicable has no string kind, who and what"
    return None


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
        return next((o for o in SEVERITY if counts[o]), NOT_APPLICABLE)  # worst first

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

    def column_records(self, column: str) -> list[dict]:
        return [r for row in self.rows if (cell := self.cell(row, column)) for r in cell.records]

    def column_totals(self, column: str) -> Counter[str]:
        total: Counter[str] = Counter()
        for row in self.rows:
            cell = self.cell(row, column)
            if cell:
                total.update(cell.counts)
        return total

    def cells_with(self, outcome: str) -> list[tuple[str, str, Cell]]:
        """(check, column, cell) of every cell holding a test of this outcome, in matrix order."""
        return [(row, column, cell) for row in self.rows for column in self.columns
                if (cell := self.cell(row, column)) and cell.counts[outcome]]

    def backend_specific_failures(self) -> list[tuple[str, str]]:
        """(check, column) where exactly one column fails among ≥ 2 that ran the check."""
        out = []
        for row in self.rows:
            ran = [(c, cell) for c in self.columns if (cell := self.cell(row, c)) and cell.worst not in NOT_RUN]
            failing = [c for c, cell in ran if cell.worst in FAILING]
            if len(ran) >= 2 and len(failing) == 1:
                out.append((row, failing[0]))
        return out


def build(documents: list[dict]) -> Matrix:
    cells: dict[tuple[str, str], Cell] = {}
    families: dict[str, str] = {}
    columns: dict[str, None] = {}
    rows_by_family: defaultdict[str, dict[str, None]] = defaultdict(dict)  # family -> its checks, in order
    for document in documents:
        for record in document["tests"]:
            row, column = record["check"], column_of(record)
            families[row] = record.get("family") or "other"
            rows_by_family[families[row]][row] = None
            columns[column] = None
            cells.setdefault((row, column), Cell(row, column)).records.append(record)
    rows = [row for family in sorted(rows_by_family) for row in rows_by_family[family]]
    return Matrix(rows=rows, columns=list(columns), cells=cells, families=families)
