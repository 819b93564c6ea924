"""What the receiver of a submission bundle recomputes and re-executes on its own machine
(``kvconform verify-submission DIR [--rerun N]``, docs/RELIABILITY.md "Certified runs").

- :func:`collect`: the tests *this* suite version collects for the bundle's backends and
  standard (``pytest --collect-only`` of the installed suite). The bundle's own list of
  collected tests is a claim; this is the fact it is held to.
- :func:`rerun`: N recorded tests, chosen at random here, run again with their recorded seed,
  backend, profile, standard and device; each outcome (and result digest, where the record
  has one) must equal the record's. A bundle whose results were edited fails on the first
  rerun that differs.

Only backends registered on this machine are imported (a name of the ``kvconform.backends``
entry points, a built-in, or ``vllm:NAME``): a bundle cannot make the receiver import a module
it names (``pkg.module:attr``) — register it to verify it.
"""

from __future__ import annotations

import functools
import json
import os
import random
import subprocess
import tempfile

from kvconform.conformance.plugin.collection import suite_command, suite_test_id
from kvconform.errors import InputError

COMPARED = ("outcome", "result_digest")  # what a rerun must reproduce (result_digest: where the record has one)


class ReceiverError(InputError):
    """The receiver cannot recompute or re-execute what the bundle needs (a backend absent here)."""


def check_backends(backends: list[str]) -> None:
    """Refuse backend names this machine would have to import from the bundle's say-so."""
    from kvconform.backends_under_test import registry

    registered = registry.registered()
    refused = [b for b in backends if not isinstance(b, str) or not (b in registered and not b.startswith(("mutant:", "fault:"))
                                                                   or b.startswith("vllm:") and b[5:].replace("+", "").isidentifier())]
    if refused:
        raise ReceiverError(f"backend(s) {', '.join(map(repr, refused))} are not registered on this machine (kvconform.backends "
                            "entry points, built-ins, vllm:NAME); install and register the vendor's backend to verify its bundle")
    for name in backends:
        loaded = registry.load(name)
        if loaded.backend is None:
            raise ReceiverError(f"backend {name} does not load here ({loaded.unavailable or loaded.error}); "
                                "install it to recompute what this suite collects for it")


@functools.cache
def _collect(backends: tuple[str, ...], standard: str) -> tuple[str, ...]:
    with tempfile.TemporaryDirectory(prefix="kvconform-receiver-") as tmp:
        cmd = suite_command("--collect-only", "-q", "--kvc-backend", ",".join(backends), "--kvc-standard", standard,
                            "--kvc-device", "cpu", "--kvc-json", os.path.join(tmp, "results.json"))
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
    if proc.returncode != 0:
        raise ReceiverError(f"this suite's collection for backends {', '.join(backends)} (standard {standard}) failed "
                            f"(exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-500:]}")
    ids = {suite_test_id(line.strip()) for line in proc.stdout.splitlines() if "::" in line}
    return tuple(sorted(i for i in ids if i))


def collect(backends: list[str], standard: str) -> list[str]:
    """The test ids this suite version collects for ``backends`` under ``standard``."""
    if standard not in ("e1", "e3"):
        raise ReceiverError(f"standard {standard!r}: expected e1 or e3")
    check_backends(backends)
    return list(_collect(tuple(sorted(backends)), standard))


def target_of(test_id: str) -> str:
    """``conformance/test_x.py::test_y[…]`` as the installed suite's ``--pyargs`` target."""
    path, _, name = test_id.partition("::")
    return f"kvconform.{path.removesuffix('.py').replace('/', '.')}::{name}"


def rerun(directory: str, document: dict, count: int, collected: list[str], *, chooser: random.Random | None = None) -> tuple[list[str], list[str]]:
    """Run ``count`` recorded tests again here; (lines saying what was rerun, problems).

    The tests are drawn from the records whose ids this suite collects (``collected``), with
    the system's randomness unless ``chooser`` is given. They run in one process with the
    bundle's profile, seed, standard, device and devices; the golden-digest comparison is against the
    bundle's own digests.json (the receiver's bytes must equal the bytes the vendor recorded)."""
    environment = document["environment"]
    known = set(collected)
    candidates = [r for r in document["tests"] if r["nodeid"] in known]
    chosen = (chooser or random.SystemRandom()).sample(candidates, min(count, len(candidates)))
    if not chosen:
        return [], ["--rerun: no recorded test of this suite to rerun"]
    backends = sorted({r["backend"] for r in chosen})
    check_backends(backends)
    with tempfile.TemporaryDirectory(prefix="kvconform-rerun-") as tmp:
        out = os.path.join(tmp, "results.json")
        args = ["--kvc-backend", ",".join(backends), "--kvc-seed", str(environment["seed"]), "--kvc-profile", str(environment["profile"]),
                "--kvc-standard", str(environment["standard"]), "--kvc-device", str(environment["device"]), "--kvc-json", out]
        if environment.get("devices"):  # the check between devices is "not applicable" without its pin
            args += ["--kvc-devices", ",".join(map(str, environment["devices"]))]
        digests = os.path.join(directory, "digests.json")
        if _has_entries(digests):
            args += ["--kvc-compare-digests", digests]
        first, *others = [target_of(r["nodeid"]) for r in chosen]
        cmd = suite_command(*args, *others, target=first)  # these tests only, not the whole suite
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        try:
            with open(out, encoding="utf-8") as fh:
                again = {r["nodeid"]: r for r in json.load(fh)["tests"]}
        except (OSError, ValueError, KeyError, TypeError):
            tail = (proc.stderr or proc.stdout).strip()[-800:]
            return [], [f"--rerun: the rerun wrote no results (exit {proc.returncode}): {tail}"]
    lines, problems = [], []
    for record in sorted(chosen, key=lambda r: r["nodeid"]):
        here = again.get(record["nodeid"])
        if here is None:
            problems.append(f"rerun {record['nodeid']}: no result here")
            continue
        differs = [f"{field} recorded {record.get(field)!r}, here {here.get(field)!r}" for field in COMPARED
                   if (field == "outcome" or record.get(field) is not None) and record.get(field) != here.get(field)]
        if differs:
            message = f" ({here.get('message')})" if here.get("message") else ""
            problems.append(f"rerun {record['nodeid']}: {'; '.join(differs)}{message}")
        else:
            lines.append(f"rerun {record['nodeid']}: {record['outcome']} here too")
    return lines, problems


def _has_entries(path: str) -> bool:
    try:
        with open(path, encoding="utf-8") as fh:
            entries = json.load(fh).get("entries")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(entries, list) and bool(entries)
