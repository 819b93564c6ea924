"""The results document: its schema, the outcomes, the typed record of one test, and reading
and writing it safely.

The JSON schema (docs/RESULTS_SCHEMA.md, ``kvconform-results/1``) is *derived* from
:class:`TestRecord`: the plugin fills one record per test and writes ``asdict`` of it, and
:func:`record_schema` turns the dataclass's fields into a JSON Schema that the tests hold
documents to. Everything in this package reads the document; only the plugin writes it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import stat
import types
import typing
from collections import Counter

from kvconform.errors import InputError

SCHEMA = "kvconform-results/1"

# The outcomes, worst first: a matrix cell shows the worst outcome among its tests.
CRASHED, TIMEOUT, ERROR, FAILED = "crashed", "timeout", "error", "failed"
UNEXPECTED_PASS, EXPECTED_FAILURE, SKIPPED = "unexpected-pass", "expected-failure", "skipped"
NOT_APPLICABLE, PASSED = "not-applicable", "passed"
SEVERITY = (CRASHED, TIMEOUT, ERROR, FAILED, UNEXPECTED_PASS, EXPECTED_FAILURE, SKIPPED, NOT_APPLICABLE, PASSED)
OUTCOMES = SEVERITY
FAILING = frozenset({FAILED, ERROR, CRASHED, TIMEOUT})  # a new failure: the run fails
NOT_RUN = frozenset({NOT_APPLICABLE, SKIPPED})  # no verdict on the backend's bytes
# How every output names an outcome, in the order counts are listed.
WORDS = {PASSED: "passed", FAILED: "failed", ERROR: "error", CRASHED: "crashed", TIMEOUT: "timeout",
         EXPECTED_FAILURE: "known failure", UNEXPECTED_PASS: "unexpected pass", NOT_APPLICABLE: "not applicable",
         SKIPPED: "skipped by expectations"}


@dataclasses.dataclass
class TestRecord:
    """Everything the reports know of one test (one entry of the document's ``tests``)."""

    __test__ = False  # not a pytest test class

    nodeid: str  # conformance/<file>::<test>[<params>]: the same however the suite was started
    backend: str
    platform: str  # what the backend declares (cpu, cuda, rocm)
    arch: str
    family: str  # the check family (pytest marker)
    check: str  # the test function
    repro: str  # a shell line that re-runs exactly this test
    clauses: list[str]  # docs/SPEC.md clause ids the check verifies
    seed: int
    run_platform: str | None  # where it ran (cpu, cuda-sm90, rocm-gfx942)
    outcome: str  # one of OUTCOMES
    duration_s: float = 0.0
    message: str = ""  # the check's own message (Hypothesis' notes are in hypothesis_draw)
    layout: str | None = None  # of the last cache the test built
    geometry: str | None = None
    kv_cache_dtype: str | None = None
    model_dtype: str | None = None
    exercised: list[dict] | None = None  # one entry per cache built (kvconform.conformance.harness.exercised)
    not_applicable: dict | None = None  # {kind, who, what} when the outcome is not-applicable
    failure: dict | None = None  # {property, differing_elements, mismatches, byte_map, diagnosis} of a failed assertion
    raised: str | None = None  # the exception type when the backend raised (outcome error)
    hypothesis_draw: str | None = None  # Hypothesis' notes on a failing example
    digest: dict | None = None  # equivalence family: the golden case's digests
    interop: dict | None = None  # connector family: one producer row of the interop table
    examples_not_applicable: dict | None = None  # cases of this test that could not run here, counted by reason
    block_sizes: list[int] | None = None  # a fixed check run at several block sizes: those that ran
    result_digest: str | None = None  # what a rerun elsewhere must reproduce (result_digest())

    def as_json(self) -> dict:
        # The fields hold JSON values already; dataclasses.asdict's deep copy took 2 s at the end
        # of a 4000-test run.
        return {name: getattr(self, name) for name in FIELDS}


def result_digest(fields: dict, compared_sha256: str | None) -> str:
    """SHA-256 of what a test's result is, independent of the machine and the clock: its id,
    outcome, what it exercised, its block sizes and golden digests, and the bytes it compared
    with the reference (``compared_sha256``, hashed in order as the test compared them)."""
    kept = {name: fields.get(name) for name in ("nodeid", "outcome", "exercised", "block_sizes", "digest")}
    text = json.dumps({**kept, "compared": compared_sha256}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


FIELDS = tuple(f.name for f in dataclasses.fields(TestRecord))
_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object", type(None): "null"}


def record_schema() -> dict:
    """A JSON Schema of one ``tests`` entry, from :class:`TestRecord`'s field types."""
    hints = typing.get_type_hints(TestRecord)
    properties = {}
    for name in FIELDS:
        hint = hints[name]
        kinds = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
        names = sorted({_JSON_TYPES[typing.get_origin(k) or k] for k in kinds})
        properties[name] = {"type": names[0] if len(names) == 1 else names}
    properties["outcome"]["enum"] = list(OUTCOMES)
    required = [f.name for f in dataclasses.fields(TestRecord) if f.default is dataclasses.MISSING]
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


# ----------------------------------------------------------------------------- completion and the run's verdict
# Whether a run reached a verdict on everything it was asked for — the document's ``completion``
# object — and the one wording every output uses for it. A run is complete when every check it
# selected for its backends has a verdict and nothing narrowed that selection: no -m/-k/--deselect/
# test-id arguments, no interruption, -x/--maxfail stop, internal or collection error, and a
# requested --kvc-compare-digests that compared something. Which backends a run covers is its
# *scope*, not a filter: a vendor run of --backend acme that ran every check for acme is complete.

UNKNOWN = {"complete": False, "reasons": [{"kind": "unknown", "what": "the results file does not say whether its run completed"}]}


def of(document: dict) -> dict:
    """The document's completion; a document that does not say is never taken as complete."""
    return document.get("completion") or UNKNOWN


def is_complete(document: dict) -> bool:
    """The document says it is complete, and nothing in it says otherwise (see :func:`contradictions`)."""
    return of(document).get("complete") is True and not of(document).get("reasons") and not contradictions(document)


def contradictions(document: dict) -> list[dict]:
    """Why a document that claims ``complete: true`` is not (a file edited after its run): a
    check skipped by expectations in its records, or counts that do not add up to its records."""
    c, tests = of(document), document.get("tests")
    if c.get("complete") is not True or tests is None:
        return []
    if not isinstance(tests, list):
        return [{"kind": "unknown", "what": "its tests are not a list"}]
    found = []
    if any(isinstance(r, dict) and r.get("outcome") == SKIPPED for r in tests):
        found.append({"kind": "skipped", "what": "it says complete, yet its records hold checks skipped by expectations"})
    counts = {k: c.get(k) for k in ("selected", "recorded") if isinstance(c.get(k), int) and c.get(k) != len(tests)}
    if counts:
        found.append({"kind": "unknown", "what": f"it says complete, yet {', '.join(f'{k} {n}' for k, n in counts.items())} != {len(tests)} records"})
    return found


def reasons_text(document: dict) -> str:
    """``interrupted (…); filtered (…)`` — why the run is partial ('' when complete)."""
    return "; ".join(f"{r['kind']}: {r['what']}" for r in [*of(document).get("reasons", []), *contradictions(document)])


def headline(document: dict) -> str | None:
    """The warning a partial run carries at the top of every output; None when complete."""
    if is_complete(document):
        return None
    c = of(document)
    counted = ""
    if c.get("selected") is not None:
        counted = f" — {c.get('recorded', 0)} of {c['selected']} selected tests have a verdict"
    return f"PARTIAL RUN ({reasons_text(document)}){counted}; the checks it did not run are not in this report"


def merged(documents: list[dict]) -> dict:
    """Completion of several runs shown together: complete only when every run is."""
    reasons = []
    for number, document in enumerate(documents, start=1):
        reasons += [{**reason, "what": f"run {number}: {reason['what']}"} for reason in [*of(document).get("reasons", []), *contradictions(document)]]
    return {"complete": all(is_complete(d) for d in documents), "reasons": reasons}


CONFORMS, NO_NEW_FAILURES, DOES_NOT_CONFORM, PARTIAL = "CONFORMS", "NO NEW FAILURES", "DOES NOT CONFORM", "PARTIAL RUN"


def _counted(n: int, one: str, many: str | None = None) -> str:
    return f"{n} {one if n == 1 else many or one + 's'}"


def baselines(documents: list[dict]) -> list[str]:
    """The expectations files the runs were gated by (merged runs' too), in order."""
    found = [env.get("expectations") for d in documents for env in [d["environment"], *d.get("merged_from", [])] if isinstance(env, dict)]
    return list(dict.fromkeys(f for f in found if isinstance(f, str) and f))


def verdict(documents: list[dict], holes: int) -> tuple[str, str]:
    """The run's verdict as every output states it, and what decided it: ``(word, why)``.

    PARTIAL RUN when a run did not complete (its checks are not all in); DOES NOT CONFORM when
    any test failed, errored, crashed or timed out (a new failure: not in the expectations);
    NO NEW FAILURES when the run fails on nothing new but the evidence is short of conformance:
    known failures or checks skipped by an expectations file, or ``holes`` (declared
    capabilities no case reached, or a declaration at odds with itself: reports/coverage.py);
    CONFORMS only with none of those. What holds it short comes first in ``why``."""
    counts = Counter(r["outcome"] for d in documents for r in d["tests"])
    stale = sum(len(d.get("stale_expectations") or []) for d in documents)
    statuses = sorted({status for d in documents if (status := of(d).get("exit_status")) is not None})
    new = sum(counts[o] for o in FAILING)
    known, skipped = counts[EXPECTED_FAILURE], counts[SKIPPED]
    together = documents[0] if len(documents) == 1 else {"completion": merged(documents)}
    holes = holes if is_complete(together) else 0  # a partial run's holes are the checks it did not run
    written = ", written by this run" if any(d["environment"].get("expectations_written") for d in documents) else ""
    baseline = f" (baseline {', '.join(baselines(documents))}{written})" if baselines(documents) else ""
    short = [_counted(known, "known failure") + baseline if known else "",
             f"{_counted(skipped, 'check')} skipped by expectations" if skipped else "",
             _counted(holes, "coverage hole") if holes else ""]
    why = [*filter(None, short), _counted(new, "new failure"), _counted(counts[UNEXPECTED_PASS], "unexpected pass", "unexpected passes"),
           _counted(stale, "stale expectation")]
    if statuses:
        why.append(f"exit status {', '.join(map(str, statuses))}")
    if not is_complete(together):
        word = PARTIAL
        why.insert(0, reasons_text(together))
    elif new or any(r["kind"] == "nothing-compared" for d in documents for r in of(d).get("reasons", [])):
        word = DOES_NOT_CONFORM
    else:
        word = NO_NEW_FAILURES if any(short) else CONFORMS
    return word, "; ".join(why)


def counts_text(records) -> str:
    """Every outcome that occurs, counted, in one order; the counts add up to the records."""
    counts = Counter(r["outcome"] for r in records)
    order = ("passed", *[o for o in SEVERITY if o != "passed"])
    return " · ".join(f"{counts[o]} {WORDS[o]}" for o in order if counts[o]) or "no results"


def backend_facts(documents: list[dict]):
    """(name, facts) of every backend the runs' environments describe (merged runs' too)."""
    for document in documents:
        for env in [document["environment"], *document.get("merged_from", [])]:
            yield from ((name, info) for name, info in env.get("backends", {}).items() if isinstance(info, dict))


def any_mutant(documents: list[dict]) -> bool:
    """Whether a seeded-fault backend is among the runs' (their reports add the kill-rate table)."""
    return any(info.get("mutant") for _, info in backend_facts(documents))


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


READ_LIMIT = 1 << 30  # bytes of one input file read at most: 1 GiB (a results file of many backends is tens of MiB)


def read_text(path: str, what: str, error: type[Exception], limit: int | None = None) -> str:
    """The UTF-8 text of a regular file of at most ``limit`` bytes, or ``error`` naming the file
    and what it should have been: a device, FIFO or directory is never read (``/dev/zero`` would
    never end), nor a file past the limit (default :data:`READ_LIMIT`)."""
    limit = READ_LIMIT if limit is None else limit
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opened so does not wait for a writer
        with open(fd, "rb") as fh:
            status = os.fstat(fd)
            if not stat.S_ISREG(status.st_mode):
                raise error(f"{path}: not a regular file; expected a {what}")
            if status.st_size > limit:  # refused unread: reading 1 GiB of a 20 GB sparse file to learn it is too big took seconds
                raise error(f"{path}: larger than {limit} bytes; expected a {what}")
            data = fh.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    if len(data) > limit:
        raise error(f"{path}: larger than {limit} bytes; expected a {what}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); expected a {what}") from exc


def read_json(path: str, what: str, error: type[Exception]) -> dict:
    """Load a JSON file or raise ``error`` naming the file and what it should have been."""
    text = read_text(path, what, error)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise error(f"{path}: not a readable {what} ({'nested too deeply' if isinstance(exc, RecursionError) else exc})") from exc


def document_text(document: dict) -> str:
    """A results document as JSON text: the rest indented, then ``tests`` last, one test per line.

    One line per test is what grep and diff want, and each line goes through json's C encoder
    (an indented dump runs the pure-Python one: 1.2 s instead of 0.2 s for 20 MB of results)."""
    head = json.dumps({key: value for key, value in document.items() if key != "tests"}, indent=1, default=str)
    if "tests" not in document:
        return head
    tests = ",\n  ".join(json.dumps(test, default=str) for test in document["tests"])
    opening = head[:-2] + ",\n" if head != "{}" else "{\n"  # an indented dump ends with "\n}"
    return opening + (f' "tests": [\n  {tests}\n ]\n}}' if tests else ' "tests": []\n}')


def write_atomically(path: str, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file and rename: readers never see half a file.

    A symbolic link is written through (the link stays, its target is replaced), the file keeps
    its permission bits, and the text is written as given (``\r\n`` stays). Anything but a regular
    file (a device, a FIFO) is refused: kvconform replaces only files."""
    target = os.path.realpath(path)
    directory = os.path.dirname(target)
    os.makedirs(directory, exist_ok=True)
    try:
        existing = os.stat(target)
    except FileNotFoundError:
        existing = None
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        raise InputError(f"{path}: not a regular file; kvconform writes only regular files")
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # the umask applies, as for a new file
        # a lone surrogate (a backend's message decoded with surrogateescape) is written as \udcff, never a crash
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="") as fh:
            fh.write(text)
        if existing is not None:
            os.chmod(tmp, stat.S_IMODE(existing.st_mode))
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
