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

import contextlib
import dataclasses
import functools
import gc
import re

from kvconform.errors import InputError

from .results import EXPECTED_FAILURE, FAILING, NOT_RUN, read_text, write_atomically

OUTCOMES = ("Fail", "Crash", "Skip")
_LINE = re.compile(r"^(?P<reason>\S+)\s+\[(?P<tags>[^\]]*)\]\s+(?P<pattern>\S+)\s+\[\s*(?P<outcome>\w+)\s*\]$")
FORMAT = "REASON [ TAGS ] PATTERN [ Fail|Crash|Skip ]"
_COMMENT = re.compile(r"(^|\s)#.*$")  # a '#' inside a URL (issue fragment) is not a comment
# Control characters (C0 but tab, DEL, C1) never belong in an entry, and an ESC sequence in one
# would reach a terminal that prints the entry.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
SIZE_LIMIT = 64 << 20  # bytes: an expectations file of 150k entries is 13 MB
LINE_LIMIT = 4096  # characters of one line (a test id is a few hundred)


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
    def is_exact(self) -> bool:
        return "*" not in self.pattern and "?" not in self.pattern

    def matches(self, nodeid: str, tags: set[str]) -> bool:
        return self.tags <= tags and _glob(self.pattern).matches(nodeid)


class Glob:
    """A PATTERN: ``*`` any text, ``?`` one character, everything else literal. Matched without
    backtracking over stars (each literal piece is placed leftmost, which is exact for globs),
    so ``*a*a*a*a*b`` costs linear time, not exponential; pieces without ``?`` are plain
    string searches (nothing to compile)."""

    def __init__(self, pattern: str):
        self.pieces = [_Piece(piece) for piece in pattern.split("*")]

    def matches(self, text: str) -> bool:
        first, *middle = self.pieces
        if not middle:
            return len(text) == first.length and first.at(text, 0)
        last = middle.pop()
        if not first.at(text, 0):
            return False
        position = first.length
        for piece in middle:
            found = piece.find(text, position)
            if found < 0:
                return False
            position = found + piece.length
        start = len(text) - last.length
        return start >= position and last.at(text, start)


class _Piece:
    """Literal text between stars, where ``?`` is any one character."""

    __slots__ = ("text", "length", "regex")

    def __init__(self, text: str):
        self.text, self.length = text, len(text)
        self.regex = re.compile("".join("." if c == "?" else re.escape(c) for c in text), re.DOTALL) if "?" in text else None

    def at(self, text: str, position: int) -> bool:
        if self.regex is None:
            return text.startswith(self.text, position)
        return self.regex.match(text, position) is not None

    def find(self, text: str, position: int) -> int:
        if self.regex is None:
            return text.find(self.text, position)
        found = self.regex.search(text, position)
        return found.start() if found else -1


@functools.lru_cache(maxsize=4096)
def _glob(pattern: str) -> Glob:
    return Glob(pattern)


class Entries(list):
    """The entries of one file in file order, with an index for matching many test ids: exact
    ids in a dict, patterns bucketed by their literal prefix and compiled once. Matching a run
    of T tests against E entries costs about T·(candidates) instead of T·E. Not to be mutated
    after the first match."""

    @functools.cached_property
    def _index(self) -> "_Index":
        with _no_gc():
            return _Index(self)

    def matching(self, nodeid: str, tags: set[str]):
        """Positions of the entries that match, in file order."""
        return self._index.matching(nodeid, tags)


class _Index:
    def __init__(self, entries: list[Entry]):
        self.entries = entries
        self.exact: dict[str, list[int]] = {}
        self.by_prefix: dict[str, list[tuple[int, Glob]]] = {}
        for position, entry in enumerate(entries):
            if entry.is_exact:
                self.exact.setdefault(entry.pattern, []).append(position)
            else:
                cut = min(i for i in (entry.pattern.find("*"), entry.pattern.find("?")) if i >= 0)
                self.by_prefix.setdefault(entry.pattern[:cut], []).append((position, Glob(entry.pattern)))
        self.prefix_lengths = sorted({len(prefix) for prefix in self.by_prefix})

    def matching(self, nodeid: str, tags: set[str]) -> list[int]:
        found = list(self.exact.get(nodeid, ()))
        for length in self.prefix_lengths:
            if length > len(nodeid):
                break
            found += [position for position, glob in self.by_prefix.get(nodeid[:length], ()) if glob.matches(nodeid)]
        return sorted(position for position in found if self.entries[position].tags <= tags)


def _index_of(entries: list[Entry]) -> Entries:
    return entries if isinstance(entries, Entries) else Entries(entries)


def parse(path: str) -> Entries:
    """Entries of an expectations file; a malformed line raises naming file and line."""
    return parse_text(read_text(path, "expectations file (UTF-8 text, one entry per line)", ExpectationsError, SIZE_LIMIT), path)



def parse_text(text: str, path: str) -> Entries:
    with _no_gc():  # 150k entries: the cyclic collector would rescan them all again and again
        return _parse_text(text, path)


@contextlib.contextmanager
def _no_gc():
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _parse_text(text: str, path: str) -> Entries:
    entries = Entries()
    suspect = _CONTROL.search(text) is not None  # one scan of the file; lines are checked only when it finds one
    for number, raw in enumerate(text.splitlines(), start=1):
        if len(raw) > LINE_LIMIT:
            raise ExpectationsError(f"{path}:{number}: line longer than {LINE_LIMIT} characters; expected '{FORMAT}'")
        control = suspect and _CONTROL.search(raw)
        if control:
            raise ExpectationsError(f"{path}:{number}: control character {control.group()!r} in {raw.strip()!r}; expected "
                                    f"printable text '{FORMAT}'")
        line = (_COMMENT.sub("", raw) if "#" in raw else raw).strip()
        if not line:
            continue
        match = _LINE.match(line)
        if not match:
            raise ExpectationsError(f"{path}:{number}: expected '{FORMAT}', got {raw.strip()!r}")
        if match["outcome"] not in OUTCOMES:
            raise ExpectationsError(f"{path}:{number}: outcome must be one of {', '.join(OUTCOMES)}, got {match['outcome']!r}")
        entries.append(Entry(path, number, match["reason"], frozenset(match["tags"].split()), suite_pattern(match["pattern"]), match["outcome"]))
    return entries


def suite_pattern(pattern: str) -> str:
    """PATTERN in the suite's test ids, ``conformance/<file>::<name>``. pytest's summary names a
    check relative to where it found the file (``test_write.py::…`` for the whole suite, ``::…``
    when one module was named, ``../.venv/…/kvconform/conformance/test_write.py::…`` from a
    directory above), and a vendor copies those lines: each is read as the check it names."""
    path, sep, name = pattern.partition("::")
    file = path.rsplit("/", 1)[-1]
    if not sep or path.startswith("conformance/") or not (file == "" or file.startswith("test_")):
        return pattern
    return f"conformance/{file or '*'}::{name}"


def first_match(entries: list[Entry], nodeid: str, tags: set[str]) -> Entry | None:
    """The first entry in file order that matches (pass the list :func:`parse` returns: indexed)."""
    positions = _index_of(entries).matching(nodeid, tags)
    return entries[positions[0]] if positions else None


def record_tags(record: dict) -> set[str]:
    return {t for t in (record.get("platform"), record.get("arch"), record.get("backend")) if t}


def _matched_records(entries: Entries, records: list[dict]) -> dict[int, list[dict]]:
    """Entry position -> the records it matches (one index look-up per record)."""
    matched: dict[int, list[dict]] = {}
    for record in records:
        for position in entries.matching(record["nodeid"], record_tags(record)):
            matched.setdefault(position, []).append(record)
    return matched


def stale(entries: list[Entry], records: list[dict]) -> list[Entry]:
    """Entries that match none of the tests that ran (a stale baseline)."""
    entries = _index_of(entries)
    matched = _matched_records(entries, records)
    return [entry for position, entry in enumerate(entries) if position not in matched]


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
    written: bool = False  # update_file: whether the file was rewritten (an unchanged one is not)


def update(existing_text: str | None, existing: list[Entry], records: list[dict], gating: list[Entry]) -> Update:
    """The next baseline from the file being updated (its text and entries), this run's records
    and the entries that gated it (for reasons). Nothing outside the run's selection is lost:
    an entry is removed only when it names exactly one test id and that test passed here. Every
    line kept is kept byte for byte, its line ending too; added lines take the file's ending."""
    existing, gating = _index_of(existing), _index_of(gating)
    ran = [r for r in records if r["outcome"] not in NOT_RUN]
    matched = _matched_records(existing, ran)
    kept_outside = kept_failing = 0
    wildcards, removed = [], []
    for position, entry in enumerate(existing):
        mine = matched.get(position, [])
        if not mine:
            kept_outside += 1
        elif any(r["outcome"] in KNOWN_BAD for r in mine):
            kept_failing += 1
        elif entry.is_exact:
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
    text = existing_text if existing_text is not None else HEADER
    newline = "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"
    gone = {entry.line for entry in removed}
    lines = [line for number, line in enumerate(text.splitlines(keepends=True), start=1) if number not in gone]
    if new_lines and lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    return Update("".join(lines) + "".join(line + newline for line in new_lines), kept_outside, kept_failing, wildcards, removed, len(new_lines))


def update_file(path: str, records: list[dict], gating: list[Entry]) -> Update:
    """Update the expectations file ``path`` in place from this run's records (see :func:`update`).

    The file is read as bytes and written back only when its text changes: an unchanged file is
    not touched (its time stamps neither), CRLF stays CRLF, a symbolic link stays a link to the
    rewritten target, and the file keeps its mode (``write_atomically``). A file that does not
    exist is created with the header and this run's failures."""
    import os

    what = "expectations file (UTF-8 text, one entry per line)"
    existing_text = read_text(path, what, ExpectationsError, SIZE_LIMIT) if os.path.lexists(path) else None
    existing = parse_text(existing_text, path) if existing_text is not None else Entries()
    result = update(existing_text, existing, records, gating)
    if result.text != existing_text:
        write_atomically(path, result.text)
        result.written = True
    return result
