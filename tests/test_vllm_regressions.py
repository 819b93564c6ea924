"""Every check that runs against vLLM fails when vLLM's own code regresses (tests/vllm_cpu/
regressions.py: realistic bugs edited into vLLM 0.33.0's source in the CPU test venv). Together
with test_vllm_adapter.py's coverage test this is the proof that no vLLM check passes whatever
vLLM does — the class of bug where the selector check compared ``vllm:ROCM_ATTN`` with
``ROCM_ATTN`` and could never fail.
"""

from __future__ import annotations

import pytest

from .test_vllm_adapter import FAILING, needs_vllm
from .vllm_cpu.regressions import REGRESSIONS
from .vllm_cpu.runs import regression as run_name

BLOCK_OUTERMOST = ("BLHNC", "BLNHC", "BHLNC")


def regression_run(vllm_runs, name):
    """The suite run of one regression (tests/vllm_cpu/runs.py: forked with the other vLLM runs)."""
    run = vllm_runs[run_name(name)]
    assert run is not None, f"regression {name}: the suite wrote no results"
    return run


def by_check(run, backend):
    checks = {}
    for record in run["tests"]:
        if record["backend"] == backend and record["outcome"] != "not-applicable":
            checks.setdefault(record["check"], []).append(record)
    return checks


@needs_vllm
@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_each_vllm_regression_fails_the_checks_it_names(vllm_runs, name):
    regression = REGRESSIONS[name]
    checks = by_check(regression_run(vllm_runs, name), regression.backend)
    for check in regression.fails:
        outcomes = [r["outcome"] for r in checks.get(check, [])]
        assert any(o in ("failed", "error") for o in outcomes), f"{name}: {check} did not fail ({outcomes or 'did not run'})"
        assert not set(outcomes) & {"crashed", "timeout"}, f"{name}: {check} {outcomes}: a regression must fail checks, not kill them"
    for check in regression.passes:
        assert {r["outcome"] for r in checks[check]} == {"passed"}, f"{name}: {check} should be untouched by this regression"


@needs_vllm
def test_copy_checks_take_vllms_whole_storage_path_on_block_outermost_layouts(vllm_runs):
    """With the guard bytes outside the storage vLLM sees, copy_kv_cache_blocks_inplace takes
    the path a worker's exact allocation takes: a raise in its whole-storage branch fails every
    block-outermost layout, and LHBNC with three heads (its block stride does not tile the
    storage; with one head it does) still takes the per-view branch and passes."""
    run = regression_run(vllm_runs, "copy_fast_path_raises")
    copies = [r for r in run["tests"] if r["family"] == "copy" and r["outcome"] != "not-applicable"]
    failed = {r["layout"].split()[0] for r in copies if r["outcome"] in FAILING}
    assert set(BLOCK_OUTERMOST) <= failed and "whole-storage copy path" in " ".join(r["message"] for r in copies)
    fixed = [r for r in copies if r["check"] == "test_copy_blocks_copies_both_planes_of_every_slot" and r["layout"].startswith("LHBNC")]
    assert fixed and "-H3-" in fixed[0]["geometry"] and fixed[0]["outcome"] == "passed"
