"""The dashboard's files, from the model: HTML pages (Jinja2, autoescaped), the browser's data for
the diff of any two runs, the style sheet and script. Every link is relative, so the site opens
from disk and from any static host; nothing is fetched from elsewhere.

    index.html  histories.html  clauses.html  diff.html  index.json  style.css  dashboard.js
    runs/ENTRY.html              one backend of one run: its checks by family, what did not pass
    history/SERIES.html          one backend on one platform across versions
    diff/OLDER--NEWER.html       consecutive runs of a backend
    detail/ENTRY/TESTHASH.html   one test that did not pass (the HTML report's rendering)
    data/tests.js  data/ENTRY.js what diff.html compares in the browser
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from importlib.resources import files

from jinja2 import Environment, PackageLoader, select_autoescape
from markupsafe import Markup, escape

from .dashboard_model import (
    BROKEN,
    CODE,
    Dashboard,
    Entry,
    Series,
    first_sentence,
    reason_text,
    slug,
    test_key,
    worst,
)
from .draws import summary as draw_summary
from .results import FAILING, NOT_APPLICABLE, PASSED, SEVERITY, counts_text, headline
from .svg import byte_map_svg

SYMBOL = {"passed": "✓", "failed": "✗", "error": "✗", "crashed": "✗", "timeout": "✗", "expected-failure": "✗",
          "unexpected-pass": "!", "skipped": "–", "not-applicable": "–"}
WORD = {"passed": "pass", "failed": "FAIL", "error": "ERROR", "crashed": "CRASH", "timeout": "TIMEOUT",
        "expected-failure": "known failure", "unexpected-pass": "unexpected pass", "skipped": "skipped", "not-applicable": "n/a"}
SHORT = {"passed": "pass", "failed": "fail", "error": "error", "crashed": "crash", "timeout": "timeout", "expected-failure": "known",
         "unexpected-pass": "xpass", "skipped": "skip", "not-applicable": "n/a"}
COUNT_ORDER = (PASSED, *(o for o in SEVERITY if o != PASSED))
VERSION_KEYS = ("torch", "triton", "vllm", "aiter", "flashinfer", "lmcache", "cuda", "hip", "python", "triton_mode")


MARK = {"regression": "▲ started failing", "fixed": "▼ fixed"}


def verdict_cell(counts: Counter | None, href: str | None = None, mark: str = "") -> Markup:
    """A table cell of outcomes: the worst that ran as a symbol and a word, then every outcome counted;
    striped when the run has no such test. (Python, not a Jinja macro: a run page has hundreds.)"""
    marked = f'<span class="mark {escape(mark)}">{MARK[mark]}</span>' if mark else ""
    if not counts:
        return Markup(f'<td class="v empty" title="not in this run"><span class="counts">not in this run</span>{marked}</td>')
    w = worst(counts)
    inner = f'<span class="word">{SYMBOL[w]} {WORD[w]}</span><span class="counts">{short_counts(counts)}</span>{marked}'
    if href:
        inner = f'<a href="{escape(href)}">{inner}</a>'
    return Markup(f'<td class="v o-{w}" data-outcome="{w}">{inner}</td>')


def short_counts(counts: Counter) -> str:
    return " · ".join(f"{counts[o]} {SHORT[o]}" for o in COUNT_ORDER if counts[o])


def date(run) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(run.created_unix)) if run.created_unix else "undated"


def _environment() -> Environment:
    env = Environment(loader=PackageLoader("kvconform.reports", "templates"), autoescape=select_autoescape(["html", "j2"]))
    env.filters["slug"] = slug
    env.globals.update(
        failing=FAILING, byte_map_svg=byte_map_svg, draw_summary=draw_summary,  # what test_detail.j2 reads
        symbol=SYMBOL, word=WORD, worst=worst, short_counts=short_counts, date=date, counts_text=counts_text,
        counts_text_of=lambda counts: short_counts(counts), first_sentence=first_sentence, reason_text=reason_text,
        verdict_cell=verdict_cell, partial_run=lambda run: headline(run.document),  # the PARTIAL RUN line every output shows, or None
        legend_order=("passed", "failed", "crashed", "expected-failure", "unexpected-pass", "not-applicable"),
    )
    return env


_ENV = _environment()


class Writer:
    """Writes the site's files under one directory (a fresh one: dashboard.py makes and swaps it)."""

    def __init__(self, directory: str):
        self.directory = directory
        self.made: set[str] = set()

    def text(self, path: str, text: str) -> None:
        full = os.path.join(self.directory, path)
        parent = os.path.dirname(full)
        if parent not in self.made:
            os.makedirs(parent, exist_ok=True)
            self.made.add(parent)
        with open(full, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)

    def page(self, path: str, template: str, **context) -> None:
        root = "../" * path.count("/")
        self.text(path, _ENV.get_template(template).render(root=root, here=path, **context))


def write_site(d: Dashboard, writer: Writer) -> None:
    writer.text("style.css", files("kvconform.reports").joinpath("templates", "dashboard.css").read_text(encoding="utf-8"))
    writer.text("dashboard.js", files("kvconform.reports").joinpath("templates", "dashboard.js").read_text(encoding="utf-8"))
    writer.page("index.html", "dashboard_index.html.j2", d=d, total=sum(len(e.records) for e in d.entries))
    writer.page("histories.html", "dashboard_histories.html.j2", d=d)
    writer.page("clauses.html", "dashboard_clauses.html.j2", d=d,
                clause_rows=[(clause, [cells.get(s.latest.id) for s in d.series]) for clause, cells in d.clauses.items()])
    latest = next((one.diffs[-1] for one in d.series if one.diffs), None)  # shown first: a backend's last change
    writer.page("diff.html", "dashboard_picker.html.j2", d=d,
                pair=(latest.a.id, latest.b.id) if latest else (d.entries[0].id, d.entries[-1].id))
    for s in d.series:
        writer.page(s.page, "dashboard_history.html.j2", s=s, d=d, families=[f for f in d.families if any(f in e.families for e in s.entries)])
        for x in s.diffs:
            writer.page(x.page, "dashboard_diff.html.j2", x=x, d=d)
        for i, entry in enumerate(s.entries):
            _entry_pages(writer, d, s, i)
    _browser_data(d, writer)


def _entry_pages(writer: Writer, d: Dashboard, s: Series, i: int) -> None:
    entry = s.entries[i]
    env = next((e for e in [entry.run.document["environment"], *entry.run.document.get("merged_from", [])]
                if isinstance(e, dict) and entry.backend in (e.get("backends") or {})), entry.run.document["environment"])
    facts = (env.get("backends") or {}).get(entry.backend) or {}
    versions = [(k, facts.get(k) or env.get(k)) for k in VERSION_KEYS if facts.get(k) or env.get(k)]
    writer.page(entry.page, "dashboard_run.html.j2", e=entry, s=s, env=env, versions=versions, checks=_checks(entry),
                families=sorted(entry.families, key=d.families.index), partial=headline(entry.run.document),
                previous=s.diffs[i - 1] if i > 0 else None, following=s.diffs[i] if i < len(s.diffs) else None)
    for record in entry.records:
        page = entry.detail(record)
        if page:
            key = test_key(record["nodeid"], entry.backend)
            history = [(other, other.by_key.get(key)) for other in s.entries]
            writer.page(page, "dashboard_detail.html.j2", e=entry, s=s, r=record, history=history, since=_failing_since(history, i))


def _failing_since(history: list[tuple[Entry, dict | None]], i: int) -> int | None:
    """Where the test's failing streak that reaches run ``i`` began (None: it does not fail there)."""
    def broken(j):
        return history[j][1] is not None and history[j][1]["outcome"] in BROKEN

    if not broken(i):
        return None
    while i > 0 and broken(i - 1):
        i -= 1
    return i


def _checks(entry: Entry) -> dict[str, tuple[list, Markup]]:
    """family -> (a row per check that did not pass whole: (check, records, counts, records with a
    detail page, not-applicable reasons counted); the checks whose every test passed, as one line)."""
    rows: dict[str, list] = {}
    passed: dict[str, list[str]] = {}
    for check, records in entry.checks().items():
        family = records[0]["family"]
        rows.setdefault(family, [])
        counts = Counter(r["outcome"] for r in records)
        if counts[PASSED] == len(records):
            passed.setdefault(family, []).append(f'<code id="check-{escape(slug(check))}">{escape(check)}</code>')
            continue
        shown = [r for r in records if entry.detail(r)]
        reasons = Counter(reason_text(r) for r in records if r["outcome"] == NOT_APPLICABLE)
        rows[family].append((check, records, counts, shown, sorted(reasons.items())))
    return {family: (rows[family], Markup(", ".join(passed.get(family, [])))) for family in rows}


def _browser_data(d: Dashboard, writer: Writer) -> None:
    """data/tests.js: every test key once; data/ENTRY.js: per key one outcome character, and notes
    (detail page, why, repro, not-applicable reason) on the tests that did not pass."""
    index = {key: i for i, key in enumerate(d.test_keys)}
    writer.text("data/tests.js", f"kvcDashboard.tests({_json(d.test_keys)});\n")
    for entry in d.entries:
        outcomes = bytearray(b"." * len(d.test_keys))
        notes = {}
        for key, record in entry.by_key.items():
            i = index[key]
            outcomes[i] = ord(CODE[record["outcome"]])
            if record["outcome"] != PASSED:
                note = {"detail": entry.detail(record)}
                if record["outcome"] == NOT_APPLICABLE:
                    note["reason"] = reason_text(record)
                elif record["outcome"] in BROKEN:
                    note.update(why=first_sentence(record), repro=record.get("repro"))
                notes[str(i)] = note
        data = {"outcomes": outcomes.decode("ascii").rstrip("."), "notes": notes}
        writer.text(entry.data, f"kvcDashboard.entry({_json(entry.id)}, {_json(data)});\n")


def _json(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
