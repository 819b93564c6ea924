"""vLLM 0.33.0's MLA members through the ``vllm:`` adapter on CPU (backends_under_test/vllm_mla.py):
each gets a verdict or a named reason, and the verdicts are the ones docs/expectations/vllm-0.33.0-mla.txt
lists. One forked run of tests/vllm_cpu/runs.py (MLA_MEMBERS, with that file as --expectations);
skipped without ``KVCONFORM_VLLM_PYTHON`` unless ``KVCONFORM_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import pytest

from .test_vllm_adapter import forked, needs_vllm, records
from .vllm_cpu.runs import MLA, MLA_MEMBERS

pytestmark = needs_vllm


@pytest.fixture(scope="module")
def mla(vllm_runs):
    return forked(vllm_runs, MLA)


def reasons(run, backend):
    return {r["message"] for r in records(run, f"vllm:{backend}") if r["outcome"] == "not-applicable"}


def test_mla_verdicts_are_the_expected_ones(mla):
    """Exit 0 with the expectations file: every failure is listed, every entry failed (none stale)."""
    assert mla["exit_status"] == 0, mla["output"][-3000:]
    assert mla["stale_expectations"] == []
    assert {r["outcome"] for r in mla["tests"]} <= {"passed", "not-applicable", "expected-failure"}


@pytest.mark.parametrize("member", MLA_MEMBERS)
def test_every_mla_member_has_a_verdict_or_a_named_reason(mla, member):
    rows = records(mla, f"vllm:{member}")
    assert rows, f"no latent checks ran for vllm:{member}"
    assert not any("out of scope" in (r["message"] or "") for r in rows)
    assert all(r["message"] for r in rows if r["outcome"] == "not-applicable")


def test_cpu_mla_writes_through_its_own_torch_path_and_misses_the_token_count(mla):
    writes = {r["check"]: r["outcome"] for r in records(mla, "vllm:CPU_MLA", "write")}
    assert writes["test_latent_records_land_in_their_slots_and_nothing_else_changes"] == "passed"
    assert writes["test_padding_slots_leave_the_latent_cache_untouched"] == "passed"
    assert writes["test_rows_past_the_slot_mapping_are_not_written"] == "expected-failure"


def test_compiled_cache_ops_are_not_applicable_with_the_op_named(mla):
    assert any("concat_and_cache_mla" in m for m in reasons(mla, "TRITON_MLA"))
    assert any("gather_and_maybe_dequant_cache" in m for m in reasons(mla, "TRITON_MLA"))


def test_members_without_an_impl_or_an_import_say_why(mla):
    assert any("no attention impl" in m and "compress_ratio" in m for m in reasons(mla, "FLASHMLA_SPARSE_DSV4"))
    assert any("cannot be imported" in m for m in reasons(mla, "CUTLASS_MLA"))


def test_every_write_check_that_passes_on_cpu_mla_fails_on_a_cpu_mla_regression(mla):
    """CPU_MLA's writer is the one MLA writer that runs here: each write or golden-digest check it
    passes is failed by a bug edited into cpu_mla.py (tests/vllm_cpu/regressions.py)."""
    from .vllm_cpu.regressions import REGRESSIONS

    passing = {r["check"] for r in records(mla, "vllm:CPU_MLA") if r["outcome"] == "passed" and r["family"] in ("write", "equivalence")}
    covered = set().union(*(r.fails for r in REGRESSIONS.values() if r.backend == "vllm:CPU_MLA"))
    assert passing and passing - covered == set()
