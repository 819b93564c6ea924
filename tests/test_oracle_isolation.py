"""The code under test can bend neither the oracle nor the inputs it is computed from (issue #37
items 1-2; conformance/harness/oracle_guard.py, docs/ARCHITECTURE.md "Oracle isolation").

Before the guard (6831dc8) a backend that replaced ``kvconform.reference.copy_blocks`` with its own
bug passed every copy check, and a decode that scaled the caller's ``query`` in place passed the
read checks: every test here that runs a backend fails there."""

from __future__ import annotations

import pytest
import torch

from kvconform import reference as R
from kvconform.backends_under_test.reference_backend import ReferenceBackend
from kvconform.conformance.harness import oracle_guard
from kvconform.conformance.harness.assertions import ConformanceFailure
from kvconform.conformance.plugin import verdict

from .suite_runs import run_suite


@pytest.fixture
def pristine():
    """The oracle recorded now; put back whatever a test changed, even when it fails."""
    record = oracle_guard.take()
    yield record
    record.restore()


def _drop_the_last_pair(storage, layout, g, block_mapping):
    return None


def _replace_copy_blocks():
    R.copy_blocks = _drop_the_last_pair


def _replace_a_padding_helper():
    R.ops._checked_slots = lambda slots, g: slots.clamp(min=0)


def _replace_a_layout_method():
    R.layouts.Layout.nbytes = lambda self, g: 0


def _replace_code_in_place():
    R.ops.copy_blocks.__code__ = _drop_the_last_pair.__code__


def _edit_a_table_in_place():
    R.fp8.FORMATS.popitem()


PATCHES = {
    "kvconform.reference.copy_blocks was replaced": _replace_copy_blocks,
    "kvconform.reference.ops._checked_slots was replaced": _replace_a_padding_helper,
    "kvconform.reference.layouts.Layout.nbytes was replaced": _replace_a_layout_method,
    "kvconform.reference.ops.copy_blocks: its code was replaced": _replace_code_in_place,
    "kvconform.reference.fp8.FORMATS was modified in place": _edit_a_table_in_place,
}


@pytest.mark.parametrize("said", PATCHES, ids=[f.__name__.strip("_") for f in PATCHES.values()])
def test_a_changed_oracle_is_named_and_restored(pristine, said):
    PATCHES[said]()
    found = pristine.changes()
    assert not pristine.intact() and any(line.startswith(said) for line in found), found
    assert any("test_oracle_isolation.py" in line for line in found) or "in place" in said  # where the replacement came from
    pristine.restore()
    assert pristine.intact() and pristine.changes() == []


def test_an_oracle_change_is_an_error_no_expectation_waives():
    planned = type("Planned", (), {"expected": "expected Fail (known.txt:1: vendor rounding)", "reason": None, "skip": None, "backend": "b"})()
    v = verdict.decide("call", oracle_guard.OracleChanged("the oracle changed during backend b's copy_blocks()"), False, planned)
    assert v.outcome == "error" and "the oracle changed" in v.message


class DestroysOneInput(ReferenceBackend):
    """Writes correctly, then scribbles on the input named ``victim`` (a careless kernel using it as scratch)."""

    def __init__(self, victim: str):
        super().__init__()
        self.victim = victim

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        inputs = {"key": key, "value": value, "slot_mapping": slot_mapping, "k_scale": k_scale}
        inputs[self.victim][-1:] = 0 if self.victim != "slot_mapping" else -1  # its last row (or element)


def write_inputs():
    g = R.Geometry(num_blocks=4, block_size=16, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
    qkv = torch.randn(3, 3, 2, 16, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    return g, qkv, qkv[:, 1], qkv[:, 2], torch.tensor([17, 40, 3]), torch.tensor([0.5])


def guarded_write(backend, key, value, slots, k_scale, g):
    from kvconform.backends_under_test.contract import CacheSpec

    spec = CacheSpec(layout=R.blocks_first("NHD"), geometry=g, kv_cache_dtype="auto", model_dtype=torch.bfloat16)
    cache = backend.allocate(torch.zeros(R.blocks_first("NHD").nbytes(g), dtype=torch.uint8), spec)
    oracle_guard.guard_ops(backend)
    backend.write(cache, key, value, slots, spec, k_scale=k_scale, v_scale=torch.ones(1))


@pytest.mark.parametrize("victim", ["key", "value", "slot_mapping", "k_scale"])
def test_an_op_that_changes_an_input_fails_naming_it_and_its_first_changed_element(victim):
    g, qkv, key, value, slots, k_scale = write_inputs()
    before = {"qkv": qkv.clone(), "slots": slots.clone(), "k_scale": k_scale.clone()}
    with pytest.raises(ConformanceFailure, match=rf"OP-INPUTS-UNCHANGED: .*modified its input {victim}: {victim}\[[0-9, ]+\] changed: was") as failure:
        guarded_write(DestroysOneInput(victim), key, value, slots, k_scale, g)
    assert failure.value.details["clause"] == "OP-INPUTS-UNCHANGED"
    # the caller's tensors, from which the reference computes, were never the ones the backend got
    assert torch.equal(qkv, before["qkv"]) and torch.equal(slots, before["slots"]) and torch.equal(k_scale, before["k_scale"])


class WritesTheQueryRows(ReferenceBackend):
    """Writes correctly, then clobbers the query third of the ``qkv`` tensor key and value are views of."""

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        key.as_strided((1,), (1,), key.storage_offset() + key.stride(0) - key.stride(1) * key.shape[1]).fill_(7)  # q of row 1


def test_memory_around_an_input_view_is_an_input_too():
    g, _, key, value, slots, k_scale = write_inputs()
    with pytest.raises(ConformanceFailure, match="the memory key and value share changed outside them"):
        guarded_write(WritesTheQueryRows(), key, value, slots, k_scale, g)


def test_copies_keep_size_strides_offset_and_storage_sharing():
    _, qkv, key, value, slots, _ = write_inputs()
    handed = oracle_guard.hand_over({"key": key, "value": value, "slots": slots}).copies
    k, v = handed["key"], handed["value"]
    assert (k.shape, k.stride(), k.storage_offset(), v.storage_offset()) == (key.shape, key.stride(), key.storage_offset(), value.storage_offset())
    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()
    assert torch.equal(k, key) and torch.equal(v, value) and torch.equal(handed["slots"], slots)


BACKENDS = {
    "at_import": "tests.patches_reference_at_import:PatchesTheReferenceAtImport",
    "in_its_op": "tests.hostile_backends:PatchesTheReferenceInItsOp",
    "bug_alone": "tests.hostile_backends:CopyBlocksDropsTheLastPair",
    "reference": "reference",
}


@pytest.fixture(scope="module")
def hostile_copy_run(tmp_path_factory):
    return run_suite(tmp_path_factory.mktemp("hostile"), "-p", "no:randomly", "--kvc-backend", ",".join(BACKENDS.values()),
                     "-k", "test_copy_blocks_moves_only_the_mapped_blocks", target="kvconform.conformance.test_copy_blocks")


def test_a_backend_that_patches_the_reference_at_import_errs_in_every_check(hostile_copy_run):
    records = [r for r in hostile_copy_run.records if r["backend"] == BACKENDS["at_import"]]
    assert records and {r["outcome"] for r in records} == {"error"}
    assert all("kvconform.reference.copy_blocks was replaced" in r["message"] for r in records)
    assert hostile_copy_run.returncode == 1


def test_a_backend_that_patches_the_reference_in_its_op_errs_in_every_check(hostile_copy_run):
    records = [r for r in hostile_copy_run.records if r["backend"] == BACKENDS["in_its_op"]]
    assert records and {r["outcome"] for r in records} == {"error"}
    assert all("the oracle changed during backend" in r["message"] and "copy_blocks()" in r["message"] for r in records)


def test_the_oracle_is_restored_for_the_other_backends_of_the_run(hostile_copy_run):
    assert hostile_copy_run.outcomes(BACKENDS["bug_alone"]) == {"failed"}
    assert hostile_copy_run.outcomes("reference") == {"passed"}


def test_a_backend_that_rewrites_the_expected_values_in_the_harness_frames_passes_beyond_an_in_process_suite(tmp_path):
    """It writes nothing and, through sys._getframe, makes the harness's expected arena equal the
    cache: docs/RELIABILITY.md "Beyond an in-process suite" says what answers it. If this fails,
    the suite has learned to catch it, and that section must say so."""
    backend = "tests.hostile_backends:RewritesTheExpectedArena"
    result = run_suite(tmp_path, "-p", "no:randomly", "--kvc-backend", backend, "-k", "padding_slots", target="kvconform.conformance.test_write")
    assert result.outcomes(backend) == {"passed"}, result.output


class PatchesTheReferenceInItsArch(ReferenceBackend):
    """Counts the questions its declarations are asked; its first ``arch()`` replaces a reference function."""

    def __init__(self):
        super().__init__()
        self.asked = []

    def arch(self):
        self.asked.append("arch")
        if self.asked.count("arch") == 1:
            R.copy_blocks = _replace_copy_blocks
        return ""

    def cache_dtype(self, kv_cache_dtype, model_dtype):
        self.asked.append((kv_cache_dtype, model_dtype))
        return super().cache_dtype(kv_cache_dtype, model_dtype)


def test_a_declaration_is_asked_each_question_once_and_its_first_answer_is_still_checked(pristine, monkeypatch):
    monkeypatch.setattr(oracle_guard, "_PRISTINE", pristine)  # as the plugin installs it
    backend = PatchesTheReferenceInItsArch()
    oracle_guard.guard_ops(backend)
    with pytest.raises(oracle_guard.OracleChanged, match="backend reference's arch()"):
        backend.arch()
    assert R.copy_blocks is not _replace_copy_blocks  # restored
    answers = [backend.cache_dtype(kind, torch.bfloat16) for kind in ("auto", "fp8", "auto", "fp8", "auto")]
    assert answers == [torch.bfloat16, torch.float8_e4m3fn] * 2 + [torch.bfloat16]
    assert backend.asked == ["arch", ("auto", torch.bfloat16), "arch", ("fp8", torch.bfloat16)]  # arch asked again: its first call raised
