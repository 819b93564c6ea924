"""Vendor expectations: known failures kept in the vendor's repo (docs/EXPECTATIONS.md).

One entry per line, ``#`` starts a comment::

    REASON [ TAGS ] PATTERN [ OUTCOME ]

- REASON: a bug link or a single word (no spaces).
- TAGS: zero or more of the backend's platform (cuda, rocm, cpu), arch (sm90, gfx942) or
  name; an entry applies only when all its tags match. ``[ ]`` applies everywhere.
- PATTERN: a pytest node id where ``*`` matches any text and ``?`` one character; brackets
  are literal (node ids carry ``[backend-layout]``).
- OUTCOME: Fail (known failure: reported expected-failure, does not fail the run), Crash
  (same, for crashes), Skip (not run).
"""

from __future__ import annotations

import dataclasses
import re

from kvconform.reference.errors import InputError

from .results import EXPECTED_FAILURE, FAILING, NOT_RUN

OUTCOMES = ("Fail", "Crash", "Skip")
_LINE = re.compile(r"^(?P<reason>\S+)\s+\[(?P<tags>[^\]]*)\]\s+(?P<pattern>\S+)\s+\[\s*(?P<outcome>\w+)\s*\]$")
FORMAT = "REASON [ TAGS ] PATTERN [ Fail|Crash|Skip ]"
_COMMENT = re.compile(r"(^|\s)#.*$")  # a '#' inside a URL (issue fragment) is not a comment


class ExpectationsError(InputError):
    pass


@dataclasses.dataclass(frozen=True)
class Entry:
    file: str
    line: int
    reason: str
    tags: frozenset[str]
    pattern: str
    outcome: str

    @property
    def regex(self) -> re.Pattern:
        return re.compile("".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in self.pattern) + r"\Z")

    def matches(self, nodeid: str, tags: set[str]) -> bool:
        return self.tags <= tags and self.regex.match(nodeid) is not None


def parse(path: str) -> list[Entry]:
    """Entries of an expectations file; a malformed line raises naming file and line."""
    try:
        text = open(path, encoding="utf-8").read()
    except OSError as exc:
        raise ExpectationsError(f"{path}: cannot read expectations file ({exc.strerror})") from exc
    entries = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = _COMMENT.sub("", raw).strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            raise ExpectationsError(f"{path}:{number}: expected '{FORMAT}', got {raw.strip()!r}")
        if match["outcome"] not in OUTCOMES:
            raise ExpectationsError(f"{path}:{number}: outcome must be one of {', '.join(OUTCOMES)}, got {match['outcome']!r}")
        entries.append(Entry(path, number, match["reason"], frozenset(match["tags"].split()), match["pattern"], match["outcome"]))
    return entries


def first_match(entries: list[Entry], nodeid: str, tags: set[str]) -> Entry | None:
    return next((e for e in entries if e.matches(nodeid, tags)), None)


def record_tags(record: dict) -> set[str]:
    return {t for t in (record.get("platform"), record.get("arch"), record.get("backend")) if t}


def stale(entries: list[Entry], records: list[dict]) -> list[Entry]:
    """Entries that match none of the tests that ran (a stale baseline)."""
    return [e for e in entries if not any(e.matches(r["nodeid"], record_tags(r)) for r in records)]


HEADER = (
    "# kvconform expectations — written by --update-expectations; replace 'untriaged' with a bug link.\n"
    f"# {FORMAT}\n"
)
KNOWN_BAD = FAILING | {EXPECTED_FAILURE}


@dataclasses.dataclass
class Update:
    """The next baseline and what changed; ``text`` is the whole new file."""

    text: str
    kept_outside: int  # entries matching no test this run ran: outside its selection, kept as written
    kept_failing: int  # entries whose tests still fail here
    kept_wildcards_passing: list[Entry]  # patterns whose tests all passed here: may cover tests elsewhere, kept
    removed: list[Entry]  # exact entries whose one test passed here
    added: int  # new failures, as 'untriaged' lines


def _is_exact(entry: Entry) -> bool:
    return "*" not in entry.pattern and "?" not in entry.pattern


def update(existing_text: str | None, existing: list[Entry], records: list[dict], gating: list[Entry]) -> Update:
    """The next baseline from the file being updated (its text and entries), this run's records
    and the entries that gated it (for reasons). Nothing outside the run's selection is lost:
    an entry is removed only when it names exactly one test id and that test passed here."""
    ran = [r for r in records if r["outcome"] not in NOT_RUN]
    kept_outside = kept_failing = 0
    wildcards, removed = [], []
    for entry in existing:
        matched = [r for r in ran if entry.matches(r["nodeid"], record_tags(r))]
        if not matched:
            kept_outside += 1
        elif any(r["outcome"] in KNOWN_BAD for r in matched):
            kept_failing += 1
        elif _is_exact(entry):
            removed.append(entry)
        else:
            wildcards.append(entry)
    new_lines = []
    for record in sorted(ran, key=lambda r: r["nodeid"]):
        if record["outcome"] not in KNOWN_BAD or first_match(existing, record["nodeid"], record_tags(record)):
            continue
        tags = record_tags(record) - {record.get("backend")}
        known = first_match(gating, record["nodeid"], record_tags(record))
        outcome = "Crash" if record["outcome"] in ("crashed", "timeout") else (known.outcome if known else "Fail")
        new_lines.append(f"{known.reason if known else 'untriaged'} [ {' '.join(sorted(tags))} ] {record['nodeid']} [ {outcome} ]")
    gone = {entry.line for entry in removed}
    lines = [line for number, line in enumerate((existing_text or HEADER).splitlines(), start=1) if number not in gone]
    return Update("\n".join(lines + new_lines) + "\n", kept_outside, kept_failing, wildcards, removed, len(new_lines))

