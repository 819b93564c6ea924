"""The canary (conformance/harness/canary.py): a certified run recomputes a fixed set of the
reference's ops in a process that never imported a backend, and refuses certification when the
run's process gives other bytes — a line of defence that does not rely on the in-process guard
(issue #37; docs/RELIABILITY.md "Oracle isolation and one verdict")."""

from __future__ import annotations

import hashlib
import importlib
import os
import subprocess
import sys
import time

import pytest

from kvconform import reference as R
from kvconform.conformance.harness import canary, oracle_guard

from .hostile_backends import drop_last_pair
from .suite_runs import run_suite

HOSTILE = "tests.fools_the_oracle_guard"
REFUSAL = "reference.copy_blocks gives other bytes in the run's process than in a clean one"


@pytest.fixture
def patched_oracle_and_guard():
    """The hostile module imported here, and everything it changed put back afterwards."""
    record, pristine = oracle_guard.take(), oracle_guard._PRISTINE
    sys.modules.pop(HOSTILE, None)
    importlib.import_module(HOSTILE)
    yield
    record.restore()
    oracle_guard._PRISTINE = pristine
    sys.modules.pop(HOSTILE, None)


def test_an_intact_oracle_gives_the_clean_processs_canary_within_two_seconds():
    started = time.perf_counter()
    here = canary.digests()
    assert time.perf_counter() - started < 2
    assert canary.differences(here, canary.clean_digests((HOSTILE,))) == []
    assert set(here) == {*canary.CANARIES, canary.CODE, canary.PYTHON} and not any(d.startswith("raised") for d in here.values())


def test_a_backend_that_patches_the_reference_and_the_guards_record_is_caught_by_the_canary(patched_oracle_and_guard):
    oracle_guard.verify("the import of the hostile backend")  # the guard is fooled: no OracleChanged
    found = canary.differences(canary.digests(), canary.clean_digests((HOSTILE,)))
    assert len(found) == 1 and found[0].startswith(REFUSAL), found
    assert found[0].endswith("the oracle was changed after the backend loaded")


def test_a_backend_that_disables_the_guard_is_caught_by_the_canary_naming_the_op_and_the_code():
    record = oracle_guard.take()
    try:
        R.copy_blocks = drop_last_pair(R.copy_blocks)
        oracle_guard.verify = lambda who: None  # the guard, switched off
        found = canary.differences(canary.digests(), canary.clean_digests((HOSTILE,)))
    finally:
        record.restore()
    assert [line.startswith(("reference.copy_blocks gives other bytes", "the oracle's code (a digest of every function) is other")) for line in found] == [True, True]


def test_a_bundles_code_digest_is_compared_only_when_both_ran_the_same_python():
    clean = canary.clean_digests()
    other_code = {**clean, canary.CODE: "0" * 64}
    assert canary.bundle_problems(clean) == []
    assert canary.bundle_problems({**other_code, canary.PYTHON: "3.99"}) == []  # another Python compiles other bytecode
    assert [p.split(" gave")[0] for p in canary.bundle_problems(other_code)] == [canary.CODE]
    assert [p.split(" gave")[0] for p in canary.bundle_problems({**clean, "reference.copy_blocks": "x", canary.PYTHON: "3.99"})] == ["reference.copy_blocks"]


def test_the_code_digest_does_not_follow_the_hash_seed():
    """Python 3.12 compiles a frozen dataclass's field names into a frozenset constant, whose repr
    follows the hash seed: every certified run on 3.12 was refused (found on the H200, 2026-12-05)."""
    code = (lambda x: x).__code__
    same_members_other_order = [code.replace(co_consts=(frozenset(order), (frozenset(order), "a"))) for order in ([1, 9], [9, 1])]
    assert repr(frozenset([1, 9])) != repr(frozenset([9, 1]))  # the two orders are really two reprs
    digests = []
    for c in same_members_other_order:
        h = hashlib.sha256()
        oracle_guard._hash_code(h, c)
        digests.append(h.hexdigest())
    assert digests[0] == digests[1], "the oracle's code digest differs for equal constants stored in another order"
    seeds = [subprocess.run([sys.executable, "-c", "from kvconform.conformance.harness import oracle_guard; print(oracle_guard.code_digest())"],
                            capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert seeds[0] == seeds[1], f"the oracle's code digest under PYTHONHASHSEED 1 and 2: {seeds}"


REWRITES_KVCONFORM = """
import pytest

pytest.register_assert_rewrite("kvconform")  # what pytest does to every module of an installed plugin's wheel


def pytest_collection_finish(session):
    from kvconform.conformance.harness import oracle_guard
    print("DIGEST", oracle_guard.code_digest())
"""


def test_the_code_digest_is_the_same_in_a_pytest_run_that_rewrites_kvconforms_asserts(tmp_path):
    """pytest rewrites the asserts of every module of a pytest11 plugin's distribution: installed
    from its wheel, the oracle's code in a run differed from the clean process's, and every
    certified run was refused (found on 2026-12-05; the source checkout's editable install hid it)."""
    (tmp_path / "conftest.py").write_text(REWRITES_KVCONFORM)
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:kvconform", "-p", "no:cacheprovider", "--co", "-q", "-s"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)
    in_pytest = [line.split()[1] for line in run.stdout.splitlines() if line.startswith("DIGEST")]
    assert in_pytest == [canary.clean_digests()[canary.CODE]], run.stdout[-2000:] + run.stderr[-2000:]


def test_the_oracle_holds_no_assert_statement():
    """The reason the digest above can agree: pytest rewrites assert statements (only those)."""
    import ast
    from pathlib import Path

    found = [f"{path}:{node.lineno}" for package in oracle_guard.ORACLE_PACKAGES
             for path in Path(importlib.import_module(package).__path__[0]).glob("*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Assert)]
    assert found == [], f"assert statements in the oracle (raise instead: pytest rewrites them in a run, not in the canary's clean process): {found}"


def test_the_clean_process_refuses_to_answer_once_a_backend_module_is_imported_there():
    proc = subprocess.run([sys.executable, "-m", canary.MODULE, "kvconform.reference.ops"], capture_output=True, text=True)
    assert proc.returncode == 1 and "backend module(s) kvconform.reference.ops are imported in the clean process" in proc.stderr
    with pytest.raises(canary.CanaryError, match="imported in the clean process"):
        canary.clean_digests(("kvconform.reference.ops",))


def test_a_certified_run_whose_backend_fooled_the_guard_conforms_but_is_not_certified(tmp_path):
    backend = f"{HOSTILE}:PatchesTheReferenceAndTheGuard"
    result = run_suite(tmp_path, "-n", "2", "--kvc-backend", backend, "--kvc-certify", str(tmp_path / "bundle"))
    assert {r["outcome"] for r in result.records} == {"passed", "not-applicable"}  # the copy bug passes its patched oracle
    refusals = [line.strip() for line in result.proc.stdout.splitlines() if REFUSAL in line]
    assert [line.partition(":")[0] for line in refusals] == ["canary (this process)", "canary (xdist worker gw0)", "canary (xdist worker gw1)"]
    assert result.returncode == 1 and "kvconform: NOT CERTIFIED (3 problems); no bundle written" in result.proc.stdout
    assert not (tmp_path / "bundle").exists()
