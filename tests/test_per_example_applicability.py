"""A case that cannot run here is skipped alone: generated examples and block sizes whose code
path is unavailable are counted in the record and the rest of the check still runs; a check is
not applicable only when nothing of it can run (conformance/harness/examples.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hypothesis.errors import UnsatisfiedAssumption

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec, OpUnavailable
from kvconform.conformance.harness.examples import skipping_unavailable_examples
from kvconform.conformance.harness.facts import TestFacts, UnavailableSpecs

from .partial_backends import WHO
from .suite_runs import KV_CHECKS, run_suite

PARTIAL = "tests.partial_backends:UnavailableAtBlockSize32"
NOWHERE = "tests.partial_backends:UnavailableEverywhere"
EVERY_SHAPE = "tests.partial_backends:UnavailableInEveryShape"
WRITE_ONLY = "tests.partial_backends:WriteOnly"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    result = run_suite(tmp_path_factory.mktemp("partial"), "--backend", f"{PARTIAL},{NOWHERE},{EVERY_SHAPE}", "-m", "write", "-k", KV_CHECKS, "-n", "2")
    return result


def records(run, backend, check=None):
    return [r for r in run.records if r["backend"] == backend and (check is None or r["check"] == check)]


def test_fixed_checks_run_at_the_block_sizes_that_are_available(run):
    padding = records(run, PARTIAL, "test_padding_slots_leave_cache_untouched")
    assert padding and all(r["outcome"] == "passed" and 16 in r["block_sizes"] and 32 not in r["block_sizes"] for r in padding)
    assert all(list(r["examples_not_applicable"].values()) == [1] and WHO in next(iter(r["examples_not_applicable"])) for r in padding)


def test_generated_examples_that_cannot_run_are_skipped_alone_and_counted(run):
    written = records(run, PARTIAL, "test_written_elements_land_at_reference_offsets_and_nothing_else_changes")
    assert written and {r["outcome"] for r in written} == {"passed"}
    assert any(r["examples_not_applicable"] for r in written), "no example drew block size 32"


def test_a_check_with_no_runnable_case_is_not_applicable_never_passed(run):
    rows = records(run, NOWHERE)
    assert rows and {r["outcome"] for r in rows} == {"not-applicable"}
    assert all(r["not_applicable"]["kind"] == "machine" and r["not_applicable"]["who"] == WHO for r in rows)


def test_hypothesis_giving_up_on_unrunnable_examples_is_not_applicable_with_their_reasons(run):
    generated = records(run, EVERY_SHAPE, "test_written_elements_land_at_reference_offsets_and_nothing_else_changes")
    assert "internal-error" not in {r["kind"] for r in run.document["completion"]["reasons"]}, run.output
    assert generated and {r["outcome"] for r in generated} == {"not-applicable"}
    assert all(r["not_applicable"]["who"] == WHO and "no generated example could run here" in r["not_applicable"]["what"] for r in generated)


def test_an_expected_failure_that_cannot_run_here_stays_not_applicable(tmp_path):
    listed = tmp_path / "expectations.txt"
    listed.write_text(f"X-1 [ {NOWHERE} ] conformance/test_write.py::test_padding_slots_leave_cache_untouched[*] [ Fail ]\n")
    result = run_suite(tmp_path, "--backend", NOWHERE, "-k", "padding", "--kvc-expectations", str(listed))
    assert {r["outcome"] for r in result.records} == {"not-applicable"}, result.output


def test_a_block_size_class_runs_once_at_its_own_block_size(run):
    rows = [r for r in records(run, PARTIAL, "test_each_declared_size_class_is_written_at_reference_offsets") if r["nodeid"].endswith("-N48]")]
    assert rows and all(r["outcome"] == "passed" and r["block_sizes"] is None for r in rows)


def test_a_backend_without_connector_ops_is_not_judged_on_kvconforms_connector_defaults(tmp_path):
    """The descriptor, the interop row and the transfer between devices would otherwise pass on the
    defaults the contract gives a backend that ships no blocks (its declared layout, the reference's wire)."""
    result = run_suite(tmp_path, "--backend", WRITE_ONLY, "-m", "connector")
    rows = result.records
    assert rows and {r["outcome"] for r in rows} == {"not-applicable"}, result.output
    assert {r["check"] for r in rows if "declares no connector op" in r["not_applicable"]["what"]} == {
        "test_layout_descriptor_describes_the_allocated_cache", "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says",
        "test_resharding_between_devices_lands_every_consumers_heads"}


@pytest.mark.filterwarnings("ignore:Using `reject` outside a property-based test")  # the wrapper is called here without Hypothesis
def test_an_example_whose_input_alone_cannot_run_leaves_its_spec_runnable():
    # FlashInfer has no padding slot: a mapping with -1 cannot run, the next mapping of the same
    # cache spec can (OpUnavailable.this_input); a spec-wide reason would stop that one too.
    case = SimpleNamespace(unavailable=UnavailableSpecs(), facts=TestFacts())
    spec = CacheSpec(layout=R.blocks_first("NHD"), geometry=R.Geometry(num_blocks=4, block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16))

    def example(case, padded):
        case.unavailable.start(spec)  # what case.built(spec) does when the example allocates
        if padded:
            raise OpUnavailable("a slot mapping with -1", who="FlashInfer", this_input=True)
        return "ran"

    check = skipping_unavailable_examples(example, {("spec",)})
    with pytest.raises(UnsatisfiedAssumption):
        check(case=case, padded=True)
    assert check(case=case, padded=False) == "ran"
    assert case.facts.examples_not_applicable == {"FlashInfer: a slot mapping with -1": 1}
