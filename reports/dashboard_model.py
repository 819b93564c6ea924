"""What the dashboard shows, as data: one *entry* per backend of a run on one platform, the grid of
entries × check families, each backend's *series* across versions with its regressions and fixes,
the diff of two entries, and per docs/SPEC.md clause which entries hold it. The pages
(``dashboard_pages``) and ``index.json`` (``dashboard_index``) are both made from this.

A backend's version is that of the library it drives (vLLM, AITER, FlashInfer, LMCache: the
version its adapter records in the run's environment), else kvconform's own: kvconform's
reference and Triton backends change with kvconform. A test *fails* here when its outcome is a
failure, error, crash, timeout or a known failure (an expectations file does not make bytes
right); it *holds* when it passed (or passed unexpectedly).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import itertools
import re
from collections import Counter, defaultdict

from packaging.version import InvalidVersion, Version  # packaging: a dependency of pytest, hence of kvconform

from .dashboard_inputs import Run
from .matrix import column_of
from .results import (
    CRASHED,
    ERROR,
    EXPECTED_FAILURE,
    FAILED,
    FAILING,
    NOT_APPLICABLE,
    NOT_RUN,
    PASSED,
    SEVERITY,
    SKIPPED,
    TIMEOUT,
    UNEXPECTED_PASS,
)

LIBRARIES = ("vllm", "aiter", "flashinfer", "lmcache")  # environment.backends.NAME keys an adapter records its library's version under
# The suite's family order (conformance/plugin/collection.py FAMILIES; the reports library may not
# import the suite); families it does not know come after, alphabetically.
FAMILY_ORDER = ("shape", "split", "write", "shuffle", "swap", "copy", "read", "gating", "equivalence", "connector")
BROKEN = FAILING | {EXPECTED_FAILURE}
HELD = frozenset({PASSED, UNEXPECTED_PASS})
DETAILED = BROKEN | {UNEXPECTED_PASS}  # outcomes with a detail page: those the HTML report renders whole
# One character per outcome: the per-test strings of data/ENTRY.js (docs/DASHBOARD.md); "." no such test.
CODE = {PASSED: "P", FAILED: "F", ERROR: "E", CRASHED: "C", TIMEOUT: "T", UNEXPECTED_PASS: "X", EXPECTED_FAILURE: "K",
        SKIPPED: "S", NOT_APPLICABLE: "N"}


def short_hash(*parts: str, length: int = 10) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:length]


def slug(text: str, limit: int = 48) -> str:
    """A readable file-name part: ASCII letters, digits, ``.``, ``_`` and ``-``; ids add a hash
    of the unfolded text, so two names that fold alike never share a file."""
    folded = re.sub(r"[^A-Za-z0-9._]+", "-", text).strip("-.")
    return folded[:limit] or "x"


def version_key(version: str):
    """Release order (PEP 440: 0.9 < 0.10 < 0.34.0rc1 < 0.34.0), else the digits as numbers."""
    try:
        return (0, Version(version), ())
    except InvalidVersion:
        return (1, Version("0"), tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in re.split(r"(\d+)", version) if p))


def family_key(family: str):
    return (FAMILY_ORDER.index(family), "") if family in FAMILY_ORDER else (len(FAMILY_ORDER), family)


def test_key(nodeid: str, backend: str) -> str:
    """The test id with its backend parameter written ``{backend}``: the same check with the
    same parameters on two backends has one key, so any two entries can be compared."""
    head, bracket, params = nodeid.partition("[")
    if not bracket or backend not in params:
        return nodeid
    return head + bracket + _backend_parameter(backend).sub("{backend}", "[" + params)[1:]


@functools.cache
def _backend_parameter(backend: str) -> re.Pattern:
    return re.compile(rf"(?<=[\[-]){re.escape(backend)}(?=[-\]])")


def worst(counts: Counter) -> str:
    """The outcome a cell of many tests shows: the worst of those that ran, so 37 passed and 3
    not applicable read "pass" (both counted beside it); not applicable or skipped only when
    nothing ran."""
    ran = next((o for o in SEVERITY if counts[o] and o not in NOT_RUN), None)
    return ran or next((o for o in SEVERITY if counts[o]), NOT_APPLICABLE)


def first_sentence(record: dict) -> str:
    """What went wrong, in a line: the first diagnosis finding, else the message's first line."""
    findings = (record.get("failure") or {}).get("diagnosis") or []
    sentence = next((f.get("sentence") for f in findings if isinstance(f, dict) and isinstance(f.get("sentence"), str)), None)
    if sentence:
        more = f" (+{len(findings) - 1} more findings)" if len(findings) > 1 else ""
        return sentence + more
    return (record.get("message") or "").split("\n", 1)[0] or record["outcome"]


def reason_text(record: dict) -> str:
    reason = record.get("not_applicable") or {}
    return f"{reason.get('kind')}: {reason.get('who')} {reason.get('what')}" if reason else ""


@dataclasses.dataclass
class Entry:
    """One backend's records of one run on one platform: a row of the grid, a column of a history."""

    id: str
    run: Run
    backend: str
    platform: str  # where it ran (cpu, cuda-sm90, rocm-gfx942)
    column: str  # backend@platform as every report names it (matrix.column_of)
    library: str  # vllm, aiter, flashinfer, lmcache, or kvconform
    version: str
    suite_version: str
    records: list[dict]
    by_key: dict[str, dict] = dataclasses.field(default_factory=dict)  # test key -> record
    check_counts: dict[str, Counter] = dataclasses.field(default_factory=dict)  # check -> its outcomes counted
    families: dict[str, Counter] = dataclasses.field(default_factory=dict)
    counts: Counter = dataclasses.field(default_factory=Counter)
    check_family: dict[str, str] = dataclasses.field(default_factory=dict)
    broken_checks: frozenset = frozenset()  # the checks with a failing test
    series: str = ""

    @property
    def label(self) -> str:
        return f"{self.library} {self.version}"

    @property
    def page(self) -> str:
        return f"runs/{self.id}.html"

    @property
    def data(self) -> str:
        return f"data/{self.id}.js"

    @property
    def broken(self) -> int:
        return sum(self.counts[o] for o in BROKEN)

    def detail(self, record: dict) -> str | None:
        """The page of a test that did not simply pass: stable, from the run id and the test id."""
        if record["outcome"] not in DETAILED:
            return None
        return f"detail/{self.id}/{short_hash(record['nodeid'], length=16)}.html"

    def checks(self) -> dict[str, list[dict]]:
        """check -> its records, in family order then the run's order."""
        grouped = defaultdict(list)
        for record in sorted(self.records, key=lambda r: family_key(r["family"])):
            grouped[record["check"]].append(record)
        return grouped


@dataclasses.dataclass
class Change:
    key: str
    before: dict | None
    after: dict | None

    @property
    def latest(self) -> dict:
        """The test's record in the later run, else in the earlier (a change has one at least)."""
        record = self.after or self.before
        if record is None:
            raise ValueError(f"{self.key}: a change without a record on either side")
        return record


@dataclasses.dataclass
class Diff:
    """What changed from entry ``a`` to entry ``b``, test by test."""

    a: Entry
    b: Entry
    newly_failing: list[Change]
    fixed: list[Change]
    newly_not_applicable: list[Change]
    still_failing: int
    now_running: int  # not applicable before, run now
    added: int  # tests only in b
    removed: int  # tests only in a

    @property
    def page(self) -> str:
        return f"diff/{self.a.id}--{self.b.id}.html"


def diff(a: Entry, b: Entry) -> Diff:
    newly_failing, fixed, newly_na = [], [], []
    still = running = 0
    before_of, after_of = a.by_key, b.by_key
    for key in before_of.keys() | after_of.keys():
        before, after = before_of.get(key), after_of.get(key)
        was = before["outcome"] if before else None
        now = after["outcome"] if after else None
        if was == now:
            still += was in BROKEN
            continue
        if now in BROKEN:
            if was in BROKEN:
                still += 1
            else:
                newly_failing.append(Change(key, before, after))
        elif was in BROKEN and now in HELD:
            fixed.append(Change(key, before, after))
        if now == NOT_APPLICABLE and was is not None:
            newly_na.append(Change(key, before, after))
        elif was == NOT_APPLICABLE and now is not None and now not in BROKEN:
            running += 1
    added, removed = len(after_of.keys() - before_of.keys()), len(before_of.keys() - after_of.keys())
    return Diff(a, b, newly_failing=sorted(newly_failing, key=_change_order), fixed=sorted(fixed, key=_change_order),
                newly_not_applicable=sorted(newly_na, key=_change_order), still_failing=still, now_running=running, added=added, removed=removed)


def _change_order(change: Change):
    return family_key(change.latest["family"]), change.key


@dataclasses.dataclass
class CheckHistory:
    """One check across a series: per entry its outcomes counted (None: not in that run)."""

    check: str
    family: str
    cells: list[Counter | None]
    marks: list[str]  # per entry: "regression", "fixed" or ""
    failing_since: int | None  # the entry where the failing streak that reaches the latest one began


@dataclasses.dataclass
class Series:
    """One backend on one platform across versions (and kvconform versions, and reruns), oldest first."""

    id: str
    column: str
    backend: str
    platform: str
    entries: list[Entry]
    diffs: list[Diff] = dataclasses.field(default_factory=list)  # entries[i] -> entries[i + 1]
    checks: list[CheckHistory] = dataclasses.field(default_factory=list)  # the checks that failed in some entry

    @property
    def page(self) -> str:
        return f"history/{self.id}.html"

    @property
    def latest(self) -> Entry:
        return self.entries[-1]


def check_history(entries: list[Entry]) -> list[CheckHistory]:
    rows = []
    for check in set().union(*(e.broken_checks for e in entries)):
        cells = [e.check_counts.get(check) for e in entries]
        family = next(e.check_family[check] for e in entries if check in e.check_counts)
        row = CheckHistory(check, family, cells, [""] * len(entries), None)
        broken = [check in e.broken_checks for e in entries]
        for i in range(1, len(entries)):
            if broken[i] and not broken[i - 1]:
                row.marks[i] = "regression"
            elif broken[i - 1] and not broken[i] and (cell := cells[i]) and any(cell[o] for o in HELD):
                row.marks[i] = "fixed"
        if broken[-1]:
            start = len(entries) - 1
            while start > 0 and broken[start - 1]:
                start -= 1
            row.failing_since = start
        rows.append(row)
    return sorted(rows, key=lambda r: (family_key(r.family), r.check))


@dataclasses.dataclass
class ClauseCell:
    counts: Counter
    first_failure: str | None  # detail page of its first failing test

    @property
    def verdict(self) -> str:
        if any(self.counts[o] for o in BROKEN):
            return "violated"
        return "holds" if any(self.counts[o] for o in HELD) else "not run"


@dataclasses.dataclass
class Dashboard:
    runs: list[Run]
    entries: list[Entry]
    series: list[Series]
    families: list[str]
    grid: dict[str, list[Series]]  # platform -> its backends, whose entries (oldest version first) are the grid's rows
    clauses: dict[str, dict[str, ClauseCell]]  # clause -> entry id -> cell
    test_keys: list[str]  # every test key of every entry, sorted: the index of data/tests.js

    def entry(self, entry_id: str) -> Entry:
        return self._by_id[entry_id]

    def __post_init__(self):
        self._by_id = {e.id: e for e in self.entries}
        self._series = {s.id: s for s in self.series}

    def series_of(self, entry: Entry) -> Series:
        return self._series[entry.series]


def _facts(document: dict, backend: str) -> dict:
    """The run environment that describes ``backend`` (a merged document keeps one per run)."""
    environments = [document["environment"], *(e for e in document.get("merged_from", []) if isinstance(e, dict))]
    return next((env for env in environments if backend in (env.get("backends") or {})), document["environment"])


def entries_of(run: Run) -> list[Entry]:
    where: dict[tuple, list[dict]] = {}  # what column_of reads -> records; one call of it per group
    for record in run.document["tests"]:
        where.setdefault((record["backend"], record.get("platform"), record.get("arch"), record.get("run_platform")), []).append(record)
    grouped: dict[tuple[str, str], list[dict]] = {}
    for records in where.values():
        grouped.setdefault((records[0]["backend"], column_of(records[0])), []).extend(records)
    entries = []
    for (backend, column), records in grouped.items():
        env = _facts(run.document, backend)
        facts = (env.get("backends") or {}).get(backend) or {}
        library = next((name for name in LIBRARIES if isinstance(facts.get(name), str)), "kvconform")
        suite = str(env.get("suite_version") or "unknown")
        platform = records[0].get("run_platform") or records[0].get("platform") or "?"
        entry = Entry(id=f"{run.id}-{slug(column, 40)}-{short_hash(column, length=6)}", run=run, backend=backend, platform=platform,
                      column=column, library=library, version=facts[library] if library != "kvconform" else suite, suite_version=suite,
                      records=records)
        by_key, per_check, family_of = entry.by_key, entry.check_counts, entry.check_family
        for record in records:
            by_key[test_key(record["nodeid"], backend)] = record
            check = record["check"]
            counts = per_check.get(check)
            if counts is None:
                counts = per_check[check] = Counter()
                family_of[check] = record["family"]
            counts[record["outcome"]] += 1
        for check, counts in per_check.items():
            entry.families.setdefault(family_of[check], Counter()).update(counts)
            entry.counts.update(counts)
        entry.broken_checks = frozenset(check for check, counts in per_check.items() if any(counts[o] for o in BROKEN))
        entries.append(entry)
    return entries


def build(runs: list[Run]) -> Dashboard:
    entries = [entry for run in runs for entry in entries_of(run)]
    order = {run.id: i for i, run in enumerate(runs)}  # runs come oldest first
    by_column = defaultdict(list)
    for entry in entries:
        by_column[entry.column].append(entry)
    series = []
    for column, members in sorted(by_column.items()):
        members.sort(key=lambda e: (version_key(e.version), version_key(e.suite_version), order[e.run.id]))
        one = Series(id=f"{slug(column, 40)}-{short_hash(column, length=6)}", column=column, backend=members[0].backend,
                     platform=members[0].platform, entries=members)
        for entry in members:
            entry.series = one.id
        one.diffs = [diff(a, b) for a, b in itertools.pairwise(members)]
        one.checks = check_history(members)
        series.append(one)
    grid = defaultdict(list)  # per platform: backends by name (the series are sorted by column)
    for one in series:
        grid[one.platform].append(one)
    families = sorted({f for e in entries for f in e.families}, key=family_key)
    return Dashboard(runs=runs, entries=[e for one in series for e in one.entries], series=series, families=families, grid=dict(sorted(grid.items())),
                     clauses=clauses(entries), test_keys=sorted({k for e in entries for k in e.by_key}))


def clauses(entries: list[Entry]) -> dict[str, dict[str, ClauseCell]]:
    table: dict[str, dict[str, ClauseCell]] = defaultdict(dict)
    for entry in entries:
        first: dict[str, dict] = {}  # clause -> its failing record of the smallest test id
        for record in entry.records:
            for clause in record.get("clauses") or ():
                cell = table[clause].get(entry.id)
                if cell is None:
                    cell = table[clause][entry.id] = ClauseCell(Counter(), None)
                cell.counts[record["outcome"]] += 1
                if record["outcome"] in BROKEN and (clause not in first or record["nodeid"] < first[clause]["nodeid"]):
                    first[clause] = record
        for clause, record in first.items():
            table[clause][entry.id].first_failure = entry.detail(record)
    return {clause: table[clause] for clause in sorted(table, key=version_key)}
