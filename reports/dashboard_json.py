"""``index.json``: the dashboard as data (schema ``kvconform-dashboard/1``, docs/DASHBOARD.md) —
the runs, the entries with their counts and failures, the grid, each backend's history with the
changes between consecutive runs, and the clauses. Paths in it are relative to the site's root."""

from __future__ import annotations

from .dashboard_model import (
    CODE,
    Change,
    Dashboard,
    Diff,
    Entry,
    Series,
    first_sentence,
    worst,
)
from .results import headline, is_complete

SCHEMA = "kvconform-dashboard/1"
ENVIRONMENT = ("suite_version", "python", "torch", "triton", "vllm", "cuda", "hip", "device", "device_name", "run_platform",
               "profile", "seed", "standard")


def index(d: Dashboard) -> dict:
    return {
        "schema": SCHEMA,
        "outcome_codes": CODE,
        "families": d.families,
        "runs": [{"id": run.id, "source": run.source, "created_unix": run.created_unix, "certified_bundle_sha256": run.bundle_sha256,
                  "complete": is_complete(run.document), "partial": headline(run.document),
                  "environment": {k: run.document["environment"].get(k) for k in ENVIRONMENT}} for run in d.runs],
        "entries": [_entry(e) for e in d.entries],
        "grid": {platform: [e.id for one in rows for e in one.entries] for platform, rows in d.grid.items()},
        "series": [_series(s) for s in d.series],
        "clauses": {clause: {entry_id: {"verdict": cell.verdict, "counts": dict(cell.counts), "first_failure": cell.first_failure}
                             for entry_id, cell in cells.items()} for clause, cells in d.clauses.items()},
        "tests": "data/tests.js",
    }


def _entry(e: Entry) -> dict:
    return {
        "id": e.id, "run": e.run.id, "backend": e.backend, "platform": e.platform, "column": e.column, "series": e.series,
        "library": e.library, "version": e.version, "suite_version": e.suite_version, "page": e.page, "data": e.data,
        "counts": dict(e.counts),
        "families": {family: dict(counts) for family, counts in e.families.items()},
        "failures": [{"test": r["nodeid"], "check": r["check"], "family": r["family"], "outcome": r["outcome"], "detail": e.detail(r),
                      "why": first_sentence(r), "repro": r.get("repro")}
                     for r in e.records if e.detail(r)],
    }


def _series(s: Series) -> dict:
    return {
        "id": s.id, "column": s.column, "backend": s.backend, "platform": s.platform, "page": s.page,
        "entries": [e.id for e in s.entries],
        "changes": [_diff(x) for x in s.diffs],
        "checks": [{"check": c.check, "family": c.family,
                    "worst": [worst(cell) if cell else None for cell in c.cells], "marks": c.marks,
                    "failing_since": s.entries[c.failing_since].id if c.failing_since is not None else None} for c in s.checks],
    }


def _diff(x: Diff) -> dict:
    return {"from": x.a.id, "to": x.b.id, "page": x.page,
            "newly_failing": [_change(c, x) for c in x.newly_failing], "fixed": [_change(c, x) for c in x.fixed],
            "newly_not_applicable": [_change(c, x) for c in x.newly_not_applicable],
            "still_failing": x.still_failing, "now_running": x.now_running, "added": x.added, "removed": x.removed}


def _change(c: Change, x: Diff) -> dict:
    return {"test": c.latest["nodeid"], "before": c.before["outcome"] if c.before else None,
            "after": c.after["outcome"] if c.after else None,
            "detail_before": x.a.detail(c.before) if c.before else None, "detail_after": x.b.detail(c.after) if c.after else None}
