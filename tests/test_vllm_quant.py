"""vLLM 0.33.0 TRITON_ATTN's per-token-head caches through the ``vllm:`` adapter on CPU
(backends_under_test/vllm_quant.py): the SPEC §16 checks run against vLLM's own writer, copies and
swaps, and the verdicts are the ones docs/expectations/vllm-0.33.0-pth.txt lists. One forked run of
tests/vllm_cpu/runs.py (PTH, with that file as --expectations); skipped without
``KVCONFORM_VLLM_PYTHON`` unless ``KVCONFORM_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import pytest

from .test_vllm_adapter import forked, needs_vllm, records
from .vllm_cpu.runs import PTH

pytestmark = needs_vllm
BACKEND = "vllm:TRITON_ATTN"


@pytest.fixture(scope="module")
def pth(vllm_runs):
    return forked(vllm_runs, PTH)


def outcomes(run, family):
    return {r["check"] + r["nodeid"][r["nodeid"].index("["):]: r["outcome"] for r in records(run, BACKEND, family)}


def test_per_token_head_verdicts_are_the_expected_ones(pth):
    """Exit 0 with the expectations file: every failure is listed, every entry matched (none stale)."""
    assert pth["exit_status"] == 0, pth["output"][-3000:]
    assert pth["stale_expectations"] == []
    assert {r["outcome"] for r in pth["tests"]} <= {"passed", "not-applicable", "expected-failure", "skipped"}


def test_int8_writes_copies_and_swaps_through_vllm_pass_in_both_orders(pth):
    for family in ("write", "copy", "swap"):
        passed = [name for name, outcome in outcomes(pth, family).items() if outcome == "passed" and "int8_per_token_head" in name]
        assert {o for o in ("HND", "NHD") if any(f"-{o}-" in n for n in passed)} == {"HND", "NHD"}, (family, outcomes(pth, family))


def test_the_writer_that_reads_slot_mapping_past_its_end_is_not_run_on_cpu(pth):
    writes = outcomes(pth, "write")
    over_read = [n for n in writes if n.startswith("test_codes_and_scales_land_at_reference_offsets")]
    assert over_read and all(writes[n] == "skipped" for n in over_read)


def test_modes_and_ops_it_does_not_declare_here_say_why(pth):
    why = pth["environment"]["backends"][BACKEND]["vllm_quant_not_declared"]
    assert "fp8_per_token_head" in why and "rounding carry" in why  # the interpreter's fp8 cast
    assert "int4_per_token_head" in why and "quant_decode" in why
    assert {r["outcome"] for r in records(pth, BACKEND, "read")} == {"not-applicable"}
