"""Submission bundles: what a certified run hands over, and how a receiver re-checks it.

A bundle is a directory (``kvconform-submission/1``)::

    manifest.json    suite version, profile, seed, the exact command, the bundle's files
    results.json     the run's results document (kvconform-results/1)
    environment.json the run's environment plus the machine's installed packages
    capabilities.json  each backend's declared capabilities
    coverage.json    the coverage table of the run (COVERAGE.md: the same, for people)
    digests.json     the golden-case digests (kvconform-digests/1, for --compare-digests)
    collected.txt    every test id the run collected
    must_pass.txt    the suite's must-pass checks at certification
    canary.json      the canary's digests in the certified run's process (harness/canary.py)
    SHA256SUMS       sha256 of every other file (``sha256sum -c`` reads it)

The sha256 of SHA256SUMS is the bundle's checksum. :func:`verify` re-checks a bundle against
the receiver's kvconform (same suite version): checksums, schemas, the pinned profile and
seed, that every collected test has a record, that every must-pass check has a record for
every backend, that every outcome is passed or not applicable by the backend's declaration,
that no declared capability has an empty coverage cell, and that the derived files agree
with the results. It names everything it finds missing or wrong. Checksums prove integrity,
not authorship; an optional detached signature over SHA256SUMS (``SHA256SUMS.sig``,
kvconform/signing.py) proves who certified the files.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys

from . import coverage as C
from kvconform.errors import InputError

from .results import SCHEMA, package_version, read_text, write_atomically

BUNDLE_SCHEMA = "kvconform-submission/1"
PROFILE, SEED = "full", 0  # what a certified run is pinned to
SUMS = "SHA256SUMS"
SIGNATURE = "SHA256SUMS.sig"  # optional: a detached Ed25519 signature over SHA256SUMS (kvconform.signing)
FILES = ("manifest.json", "results.json", "environment.json", "capabilities.json", "coverage.json", "COVERAGE.md",
         "digests.json", "collected.txt", "must_pass.txt", "canary.json")
DIGEST_SCHEMA = "kvconform-digests/1"
SHOWN = 20  # problems of one kind listed before "… N more"


def certification_problems(document: dict, collected: list[str]) -> list[str]:
    """Why this results document cannot be certified (empty: it can)."""
    problems = []
    completion = document.get("completion")
    if not (completion or {}).get("complete", False):  # a document without the object cannot show it is complete
        problems.append(f"the run is incomplete: {json.dumps(completion, sort_keys=True)}")
    problems += _shown("outcome", [f"{r['nodeid']}: {_outcome(r)}" for r in document["tests"] if not allowed(r)])
    ids = {r["nodeid"] for r in document["tests"]}
    problems += _shown("no record", [test_id for test_id in collected if test_id not in ids])
    problems += _shown("coverage hole", [str(hole) for hole in C.build([document]).holes])
    return problems


def allowed(record: dict) -> bool:
    """Passed, or not applicable because the backend declares it does not do this."""
    if record["outcome"] == "passed":
        return True
    return record["outcome"] == "not-applicable" and (record.get("not_applicable") or {}).get("kind") == "declaration"


def _outcome(record: dict) -> str:
    reason = record.get("not_applicable")
    return f"{record['outcome']} ({reason['kind']}: {reason['who']} {reason['what']})" if reason else record["outcome"]


def _shown(kind: str, items: list[str]) -> list[str]:
    out = [f"{kind}: {item}" for item in items[:SHOWN]]
    if len(items) > SHOWN:
        out.append(f"{kind}: … {len(items) - SHOWN} more")
    return out


def _dump(data) -> str:
    return json.dumps(data, indent=1, sort_keys=True, default=str) + "\n"


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def digest_entries(document: dict) -> list[dict]:
    """The digest file entries of a results document (what ``--export-digests`` writes)."""
    return [{"backend": r["backend"], "platform": r.get("platform"), "arch": r.get("arch"), **r["digest"]} for r in document["tests"] if r.get("digest")]


def write_bundle(directory: str, document: dict, *, collected: list[str], must_pass: list[str], command: dict, digests_header: dict,
                 canary: dict) -> str:
    """Write a submission bundle for a certified run; returns the bundle checksum. ``digests_header``:
    the suite's digest-file header, so digests.json works with ``--compare-digests``; ``canary``:
    the canary's digests in the run's process."""
    os.makedirs(directory, exist_ok=True)
    environment = document["environment"]
    table = C.build([document])
    packages = sorted(f"{d.metadata['Name']}=={d.version}" for d in _distributions())
    texts = {
        "results.json": _dump(document),
        "environment.json": _dump({**environment, "machine": platform.platform(), "python_executable": sys.executable, "packages": packages}),
        "capabilities.json": _dump({name: facts.get("declared") for name, facts in environment["backends"].items()}),
        "coverage.json": _dump(coverage_data(table)),
        "COVERAGE.md": C.render_markdown(table, how=f"A certified run ({command['line']})."),
        "digests.json": _dump({**digests_header, "entries": digest_entries(document)}),
        "collected.txt": "".join(f"{test_id}\n" for test_id in sorted(collected)),
        "must_pass.txt": "".join(f"{check}\n" for check in must_pass),
        "canary.json": _dump(canary),
    }
    texts["manifest.json"] = _dump({
        "schema": BUNDLE_SCHEMA, "suite_version": environment["suite_version"], "profile": environment["profile"],
        "seeds": [environment["seed"]], "command": command, "backends": sorted(environment["backends"]),
        "files": sorted([*texts, "manifest.json"]),
    })
    for name, text in texts.items():
        write_atomically(os.path.join(directory, name), text)
    sums = "".join(f"{sha256_file(os.path.join(directory, name))}  {name}\n" for name in sorted(texts))
    if os.path.exists(os.path.join(directory, SIGNATURE)):  # an earlier bundle's signature signs other sums
        os.unlink(os.path.join(directory, SIGNATURE))
    write_atomically(os.path.join(directory, SUMS), sums)
    return sha256_file(os.path.join(directory, SUMS))


def _distributions():
    import importlib.metadata

    return [d for d in importlib.metadata.distributions() if d.metadata["Name"]]


def coverage_data(table: C.Coverage) -> dict:
    """The coverage table as JSON: rows, declared facts, holes and clause → checks."""
    return {
        "rows": [{"column": k[0], "family": k[1], "cache_dtype": k[2], "layout": k[3], "cases": r.cases,
                  "sizes": dict(sorted(r.sizes.items())), "values": dict(sorted(r.values.items()))} for k, r in sorted(table.rows.items())],
        "declared": table.declared, "holes": [str(h) for h in table.holes], "clauses": table.clauses,
    }


# ----------------------------------------------------------------------------- verification
BUNDLE_LIMIT = 1 << 30  # bytes of one bundle file read at most


def _read(directory: str, name: str):
    """A bundle file's content (JSON parsed); :class:`InputError` naming the file otherwise."""
    text = read_text(os.path.join(directory, name), f"bundle file {name} (UTF-8)", InputError, BUNDLE_LIMIT)
    if not name.endswith(".json"):
        return text
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{name}: not JSON ({exc if isinstance(exc, ValueError) else 'nested too deeply'})") from exc


RECORD_TEXT = ("nodeid", "backend", "outcome")


def shape_problems(readable: dict) -> list[str]:
    """What in the bundle's JSON files is not of the shape the checks read (empty: all is)."""
    problems = []
    manifest, document = readable.get("manifest.json"), readable.get("results.json")
    if "manifest.json" in readable and not isinstance(manifest, dict):
        problems.append(f"manifest.json: expected a JSON object, got {type(manifest).__name__}")
    if "results.json" not in readable:
        return problems
    if not isinstance(document, dict):
        return problems + [f"results.json: expected a {SCHEMA} object, got {type(document).__name__}"]
    if document.get("schema") != SCHEMA:
        return problems + [f"results.json: schema {document.get('schema')!r}, expected {SCHEMA!r}"]
    environment, tests = document.get("environment"), document.get("tests")
    if not isinstance(environment, dict) or not isinstance(environment.get("backends"), dict) \
            or not all(isinstance(facts, dict) for facts in environment["backends"].values()):
        problems.append("results.json: environment must be an object whose backends is an object of objects")
    if not isinstance(tests, list):
        return problems + [f"results.json: tests must be a list of records, got {type(tests).__name__}"]
    bad = [f"record {i}: expected an object with string {', '.join(RECORD_TEXT)}" for i, r in enumerate(tests)
           if not (isinstance(r, dict) and all(isinstance(r.get(k), str) for k in RECORD_TEXT)
                   and isinstance(r.get("not_applicable") or {}, dict))]
    problems += [f"results.json: {p}" for p in bad[:SHOWN]] + ([f"results.json: … {len(bad) - SHOWN} more"] if len(bad) > SHOWN else [])
    if not isinstance(document.get("completion", {}), (dict, type(None))):
        problems.append("results.json: completion must be an object")
    for name in ("capabilities.json", "coverage.json", "digests.json", "canary.json"):
        if name in readable and not isinstance(readable[name], dict):
            problems.append(f"{name}: expected a JSON object, got {type(readable[name]).__name__}")
    return problems


def verify(directory: str, must_pass: list[str], suite_version: str | None = None, collect=None, canary=None) -> list[str]:
    """Everything wrong with a bundle (empty: it is accepted). ``must_pass``: this suite's checks.

    ``collect(backends, standard) -> test ids``: what this suite version collects for the
    bundle's backends (kvconform.receiver.collect, which runs the suite's collection here); the
    bundle's collected.txt must equal it. Without it the bundle's own list is taken as given.
    ``canary(canary.json's content) -> problems``: the bundle's canary against a clean process's
    here (``harness/canary.py`` ``bundle_problems``)."""
    suite_version = suite_version or package_version("kvconform") or "unknown"
    if not os.path.isdir(directory):
        return [f"{directory}: not a bundle directory"]
    problems = _checksum_problems(directory)
    readable = {}
    for name in FILES:
        try:
            readable[name] = _read(directory, name)
        except InputError as exc:
            problems.append(f"unreadable: {name} ({exc})")
    if any(name not in readable for name in ("manifest.json", "results.json")):
        return problems
    shape = shape_problems(readable)
    if shape:
        return problems + shape
    manifest, document = readable["manifest.json"], readable["results.json"]
    if manifest.get("schema") != BUNDLE_SCHEMA:
        problems.append(f"manifest.json: schema {manifest.get('schema')!r} is not {BUNDLE_SCHEMA!r}")
    if manifest.get("suite_version") != suite_version:
        problems.append(f"manifest.json: bundle from kvconform {manifest.get('suite_version')}; this is {suite_version} (verify with the same version)")
    environment = document["environment"]
    if (environment.get("profile"), environment.get("seed")) != (PROFILE, SEED):
        problems.append(f"results.json: profile {environment.get('profile')!r} seed {environment.get('seed')!r}; a certified run uses profile {PROFILE!r} seed {SEED}")
    if (manifest.get("profile"), manifest.get("seeds")) != (PROFILE, [SEED]):
        problems.append(f"manifest.json: profile {manifest.get('profile')!r} seeds {manifest.get('seeds')!r}; a certified run uses profile {PROFILE!r} seeds {[SEED]}")
    if manifest.get("backends") != sorted(environment["backends"]):
        problems.append(f"manifest.json: backends {manifest.get('backends')!r} are not the results' {sorted(environment['backends'])}")
    collected = readable.get("collected.txt", "").split()
    if canary is not None and "canary.json" in readable:
        problems += _canary_problems(readable["canary.json"], canary)
    try:
        problems += _content_problems(readable, document, collected, must_pass, collect)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:  # a field of a shape no check reads
        problems.append(f"results.json: a record or file does not have the fields a {SCHEMA} document has ({type(exc).__name__}: {exc})")
    return problems


def _content_problems(readable: dict, document: dict, collected: list[str], must_pass: list[str], collect) -> list[str]:
    problems = certification_problems(document, collected)
    problems += _shown("collected.txt", [f"record of a test the run did not collect: {r['nodeid']}" for r in document["tests"] if r["nodeid"] not in set(collected)])
    if collect is not None:
        problems += _collection_problems(collected, document, collect)
    problems += _must_pass_problems(document, readable.get("must_pass.txt", "").split(), must_pass)
    problems += _derived_problems(readable, document)
    return problems


def _collection_problems(collected: list[str], document: dict, collect) -> list[str]:
    """The bundle's collected tests against what this suite version collects for its backends."""
    backends, standard = sorted(document["environment"]["backends"]), document["environment"].get("standard")
    try:
        expected = set(collect(backends, standard))
    except InputError as exc:
        return [f"cannot recompute what this suite collects: {exc}"]
    bundled = set(collected)
    return (_shown("not in the bundle", [f"this suite collects {test_id} for the declared backends; collected.txt does not list it"
                                         for test_id in sorted(expected - bundled)])
            + _shown("not collected here", [f"collected.txt lists {test_id}, which this suite does not collect for the declared backends"
                                            for test_id in sorted(bundled - expected)]))


def _canary_problems(bundled: dict, canary) -> list[str]:
    """The run's canary digests against a clean process's here: the same ops on the same inputs."""
    try:
        return _shown("canary.json", canary(bundled))
    except (InputError, RuntimeError, OSError) as exc:
        return [f"canary.json: cannot compute the canary here: {exc}"]


def _checksum_problems(directory: str) -> list[str]:
    try:
        lines = _read(directory, SUMS).splitlines()
    except InputError as exc:
        return [f"missing or unreadable file: {SUMS} ({exc})"]
    listed = {}
    for line in lines:
        digest, _, name = line.partition("  ")
        listed[name] = digest
    problems = [f"missing from {SUMS}: {name}" for name in FILES if name not in listed]
    for name, digest in sorted(listed.items()):
        path = os.path.join(directory, name)
        if name not in FILES or os.path.basename(name) != name:
            problems.append(f"{SUMS} lists {name!r}, which is not a bundle file")
        elif not os.path.isfile(path):
            problems.append(f"missing file: {name}")
        elif os.path.getsize(path) > BUNDLE_LIMIT:  # checked before hashing: a link to a 20 GB sparse file took 75 s
            problems.append(f"{name}: larger than {BUNDLE_LIMIT} bytes, the most a bundle file holds; not read")
        elif sha256_file(path) != digest:
            problems.append(f"checksum mismatch: {name} (the file was changed after certification)")
    problems += [f"file not in {SUMS}: {name}" for name in sorted(os.listdir(directory)) if name not in listed and name not in (SUMS, SIGNATURE)]
    return problems


def _must_pass_problems(document: dict, bundled: list[str], must_pass: list[str]) -> list[str]:
    problems = []
    if bundled != must_pass:
        problems.append(f"must_pass.txt differs from this suite's must-pass list (missing {sorted(set(must_pass) - set(bundled))}, "
                        f"extra {sorted(set(bundled) - set(must_pass))})")
    checks = {(r["backend"], C.check_of(r)) for r in document["tests"]}
    missing = [f"backend {b}: {check}" for b in sorted(document["environment"]["backends"]) for check in must_pass if (b, check) not in checks]
    return problems + _shown("must-pass check without a record", missing)


def _derived_problems(readable: dict, document: dict) -> list[str]:
    """The files derived from the results must say what the results say (COVERAGE.md rendered
    again from them, with the manifest's command)."""
    environment = document["environment"]
    expected = {
        "capabilities.json": {name: facts.get("declared") for name, facts in environment["backends"].items()},
        "coverage.json": json.loads(_dump(coverage_data(C.build([document])))),
    }
    problems = [f"{name} does not match results.json" for name, data in expected.items() if name in readable and readable[name] != data]
    command = readable["manifest.json"].get("command")
    line = command.get("line") if isinstance(command, dict) else None
    if not isinstance(line, str):
        problems.append("manifest.json: command has no line (the command the certified run ran)")
    elif "COVERAGE.md" in readable and readable["COVERAGE.md"] != C.render_markdown(C.build([document]), how=f"A certified run ({line})."):
        problems.append("COVERAGE.md does not match results.json")
    machine = readable.get("environment.json")
    if machine is not None and (not isinstance(machine, dict) or any(machine.get(k) != v for k, v in environment.items())):
        problems.append("environment.json does not match the environment in results.json")
    digests = readable.get("digests.json")
    if digests is not None and (digests.get("schema") != DIGEST_SCHEMA or digests.get("entries") != json.loads(_dump(digest_entries(document)))):
        problems.append("digests.json does not match the digests in results.json")
    return problems
