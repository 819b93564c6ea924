"""How the ``kvconform`` command starts the installed suite: ``kvconform test`` (one pytest
process), ``kvconform run`` (one process per backend, results merged) and ``kvconform certify``.

**The caller's pytest setup stays out.** The command is typed inside a vendor's repository, whose
``pyproject.toml``/``pytest.ini`` pytest would take as its rootdir and ini file (with their
``addopts``) and whose ``conftest.py`` may own ``--backend``. So each child pytest starts in a
scratch directory outside the caller's tree holding an empty ``pytest.ini``, named as its ini file
(``-c``) and rootdir (``--rootdir``), with ``--noconftest`` (the suite has no conftest; without it a
vendor's root ``conftest.py`` still loads when kvconform is installed in a ``.venv`` inside the
repository, since it sits above the suite's directory), and ``-p no:cacheprovider`` keeps
``.pytest_cache`` out. The command prints one line saying so. ``--caller-pytest-config`` runs
pytest in the caller's directory with its setup instead.

**Paths mean what they mean where the command was typed.** Every path option — ``--out`` and,
after ``--``, the suite's path options (``--kvc-expectations``, ``--kvc-json`` … in either
spelling) and pytest's own (``--junitxml`` …) — is made absolute against the caller's directory
before the child starts (:func:`resolve_paths`).

**Why one process per backend** (``kvconform run``): a backend can abort its process (a
segfaulting extension), hang in a kernel that never returns, or leave a sticky device error that
poisons every later call in its CUDA/HIP context. One process per backend confines all three to
that backend's cells. Inside each process pytest-xdist (``-n 1``) restarts a crashed worker and
carries on with the next test, and ``--kvc-timeout`` ends a hung test (reported ``timeout``). A
backend whose process dies before writing results gets one ``crashed`` record carrying the tail of
its stderr. xdist's own ``--dist loadgroup`` would be lighter, but it raises INTERNALERROR when a
worker restarts (xdist 3.8), so each backend gets its own pytest instead. pytest failing to
*start* — a usage error, an internal error — is kvconform's problem, not the backend's:
``kvconform run`` stops with a harness error naming the cause.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

from kvconform.conformance.plugin.collection import suite_command
from kvconform.reports.lines import fold

HARNESS_ERROR = 3  # exit status of `kvconform run` when the suite itself could not start
STARTUP_FAILURES = {2: "interrupted", 3: "internal error", 4: "usage error"}  # pytest exit codes

# ----------------------------------------------------------------------------- the caller's paths
# Every spelling of an option whose value is a path: the suite's (each of conformance/plugin/options.py
# OPTIONS with metavar PATH, FILE or DIR, as --kvc-NAME and its short alias; tests/test_vendor_repository.py
# holds the two lists equal) and pytest's own. Spelled out, not derived: the command starts without
# importing the suite's options (they import torch).
PATH_OPTIONS = frozenset({
    "--kvc-json", "--kvc-html", "--kvc-certify", "--kvc-expectations", "--expectations", "--kvc-update-expectations",
    "--update-expectations", "--kvc-export-digests", "--export-digests", "--kvc-compare-digests", "--compare-digests",
    "--junitxml", "--junit-xml", "--basetemp", "--log-file", "--confcutdir", "--rootdir", "-c", "--config-file",
})


def resolve_paths(args: list[str], cwd: str) -> list[str]:
    """``args`` with the value of every path option made absolute against ``cwd`` (``--opt PATH``
    and ``--opt=PATH``); every other argument unchanged."""
    names = PATH_OPTIONS
    resolved, pending = [], False
    for arg in args:
        if pending:
            resolved.append(os.path.join(cwd, arg))
            pending = False
            continue
        name, eq, value = arg.partition("=")
        if name in names and eq and value:
            resolved.append(f"{name}={os.path.join(cwd, value)}")
        else:
            resolved.append(arg)
            pending = arg in names
    return resolved


# ----------------------------------------------------------------------------- the scratch directory
@contextlib.contextmanager
def scratch_setup(own: bool = True):
    """``(cwd, flags)`` for a child pytest: a scratch directory outside the caller's tree with an
    empty ini file named as ini and rootdir, and no conftest (``own``); or the caller's directory
    and nothing."""
    if not own:
        yield os.getcwd(), []
        return
    with tempfile.TemporaryDirectory(prefix="kvconform-pytest-") as work:
        ini = os.path.join(work, "pytest.ini")
        with open(ini, "w") as fh:
            fh.write("[pytest]\n# kvconform's own (empty) pytest configuration: the caller's does not apply\n")
        yield work, ["-c", ini, "--rootdir", work, "--noconftest"]


def say_where(own: bool) -> None:
    """The one line that tells the caller how pytest is started."""
    here = os.getcwd()
    if own:
        line = (f"kvconform: pytest runs in a scratch directory with kvconform's own empty pytest.ini as rootdir and ini, and no conftest "
                f"(no pytest.ini, pyproject.toml or conftest.py of {here} applies; paths are relative to it)")
    else:
        line = f"kvconform: pytest runs in {here} with its pytest configuration and conftests (--caller-pytest-config)"
    print("\n".join(fold(line)), flush=True)


# ----------------------------------------------------------------------------- kvconform test / certify
def test(backends: list[str] | None, pytest_args: list[str], out_dir: str, own: bool = True) -> int:
    """The installed suite in one pytest process; results under ``out_dir`` unless the arguments
    name other paths; returns pytest's exit status."""
    cwd = os.getcwd()
    named = ["--kvc-backend", ",".join(backends)] if backends is not None else []
    out_dir = os.path.abspath(out_dir)
    say_where(own)
    with scratch_setup(own) as (work, flags):
        cmd = suite_command(*flags, *named, "--kvc-json", os.path.join(out_dir, "results.json"), *resolve_paths(pytest_args, cwd))
        return subprocess.run(cmd, cwd=work).returncode


def certify(backend: str, out: str, workers: str, pytest_args: list[str], results_dir: str, own: bool = True) -> int:
    """A certified run (``--kvc-certify``) in one pytest process, its results (besides the bundle)
    under ``results_dir``; returns pytest's exit status."""
    cwd = os.getcwd()
    say_where(own)
    with scratch_setup(own) as (work, flags):
        cmd = suite_command(*flags, "--kvc-backend", backend, "--kvc-certify", os.path.abspath(out), "-n", workers,
                            "--kvc-json", os.path.join(os.path.abspath(results_dir), "results.json"), *resolve_paths(pytest_args, cwd))
        return subprocess.run(cmd, cwd=work).returncode


# ----------------------------------------------------------------------------- kvconform run
class HarnessError(RuntimeError):
    """The suite could not be started for a backend (nothing the backend did)."""


def _file_name(backend: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in backend)


def _run_one(backend: str, out_dir: str, timeout: float, pytest_args: list[str], own: bool) -> tuple[int, dict]:
    path = os.path.join(out_dir, _file_name(backend) + ".json")
    for earlier in (path, os.path.splitext(path)[0] + ".html"):  # a process that dies early must not leave an earlier run's results
        if os.path.isfile(earlier):
            os.unlink(earlier)
    with scratch_setup(own) as (work, flags):
        cmd = suite_command(
            *flags, "-q", "--kvc-backend", backend, "-n", "1", "--max-worker-restart", "1000",
            "--kvc-timeout", str(timeout), "--kvc-json", path, "--kvc-html", os.path.join(out_dir, _file_name(backend) + ".html"),
            *pytest_args,
        )
        proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if os.path.exists(path):
        with open(path, encoding="utf-8") as fh:
            return proc.returncode, json.load(fh)
    tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
    if proc.returncode in STARTUP_FAILURES:
        raise HarnessError(f"the suite could not start for backend {backend}: pytest exited {proc.returncode} "
                           f"({STARTUP_FAILURES[proc.returncode]}):\n{tail}\ncommand: {' '.join(cmd)}")
    from kvconform.conformance.plugin.verdict import crashed
    from kvconform.reports.results import SCHEMA, TestRecord

    seed = next((int(b) for a, b in zip(pytest_args, pytest_args[1:]) if a in ("--kvc-seed", "--seed") and b.isdigit()), 0)
    record = TestRecord(nodeid=f"conformance::{backend}", backend=backend, platform="?", arch="", family="other", check="backend process",
                        repro=" ".join(cmd), clauses=[], seed=seed, run_platform=None,
                        **crashed(None, False, f"pytest exited {proc.returncode} without results:\n{tail}").record_fields())
    died = {"complete": False, "reasons": [{"kind": "crashed", "what": f"the suite process for {backend} exited {proc.returncode} without results"}]}
    return proc.returncode or 1, {"schema": SCHEMA, "environment": {"device": "?", "device_name": "?", "backends": {backend: {}}},
                             "completion": died, "tests": [record.as_json()]}


PER_BACKEND = ("--kvc-json", "--kvc-html")  # `kvconform run` names these per backend under --out


def run(backends: list[str], pytest_args: list[str], out_dir: str, timeout: float, jobs: int, own: bool = True) -> int:
    """Run each backend in its own process; write merged JSON + HTML; print the matrix."""
    from kvconform.conformance.plugin.outputs import OutputError, ResultsLock

    given = [arg.partition("=")[0] for arg in pytest_args if arg.partition("=")[0] in PER_BACKEND]
    if given:
        print(f"kvconform run: {', '.join(given)}: each backend's results go to --out DIR (BACKEND.json, BACKEND.html, "
              "and the merged results.json, results.html); give --out instead", file=sys.stderr)
        return 4
    pytest_args = resolve_paths(pytest_args, os.getcwd())
    out_dir = os.path.abspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)
    json_path, html_path = os.path.join(out_dir, "results.json"), os.path.join(out_dir, "results.html")
    try:  # the lock a suite run takes on its results: two runs into one --out DIR would each write over the other
        lock = ResultsLock.acquire(json_path, "--out")
    except OutputError as exc:
        print(f"kvconform run: {exc}", file=sys.stderr)
        return 4
    try:
        return _run_locked(backends, pytest_args, out_dir, json_path, html_path, timeout, jobs, own)
    finally:
        lock.release()


def _run_locked(backends, pytest_args, out_dir, json_path, html_path, timeout, jobs, own) -> int:
    from kvconform.conformance.plugin.outputs import set_aside, settle_previous
    from kvconform.reports import results
    from kvconform.reports.cli import merged_document
    from kvconform.reports.html import render_runs
    from kvconform.reports.results import document_text, write_atomically
    from kvconform.reports.terminal import render

    say_where(own)
    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            outcomes = list(pool.map(lambda b: _run_one(b, out_dir, timeout, pytest_args, own), backends))
    except HarnessError as exc:
        print(f"kvconform run: HARNESS ERROR: {exc}", file=sys.stderr)
        return HARNESS_ERROR
    documents = [document for _, document in outcomes]
    merged = merged_document(documents)
    set_aside(json_path, html_path)
    write_atomically(json_path, document_text(merged))
    write_atomically(html_path, render_runs(documents))
    kept = settle_previous(json_path, html_path, complete=results.is_complete(merged))  # a partial run never replaces a complete one
    print(render(documents, color=sys.stdout.isatty(), failures=True))  # the children's pytest output is not shown
    if kept:
        print(f"kvconform: {json_path} held a complete run; kept it as {kept}")
    print(f"kvconform: results {json_path}\nkvconform: HTML report {html_path}")
    codes = {code for code, _ in outcomes}
    if any(r["outcome"] in results.FAILING for r in merged["tests"]):
        return 1  # the merged verdict, whatever a process said
    return 0 if codes == {0} else 5 if codes == {5} else 1  # 5: pytest's "no tests collected" (a filter that selects nothing)
