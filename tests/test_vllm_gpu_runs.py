"""The committed H200 runs of vLLM 0.33.0 and the GPU expectations file tell one story.

- docs/runs/vllm-gpu-h200-all/: every in-scope member that imports, one process each, with the
  expectations file of its day. Every check that failed there (failed, or expected failure) is a
  listed vLLM non-conformance; every check that passed against an older, broader entry is not
  listed any more; every listed entry failed there; every process completed except the one the
  runner's deadline ended, which the gated run below completes.
- docs/runs/vllm-gpu-h200-gated/: the members the file names (and that one) with
  ``--kvc-expectations`` this file: nothing failed, every expected failure is a listed one,
  and every entry was seen as an expected failure.
"""

from __future__ import annotations

import gzip
import json

import pytest

from kvconform.reports import expectations

from .suite_runs import ROOT

RUNS = ROOT / "docs" / "runs"
ALL = RUNS / "vllm-gpu-h200-all"
GATED = RUNS / "vllm-gpu-h200-gated"
EXPECTATIONS = ROOT / "docs" / "expectations" / "vllm-0.33.0-gpu.txt"
FAILED_ON_THE_H200 = ("failed", "error", "crashed", "timeout", "expected-failure")
ENDED_AT_THE_DEADLINE = {"TRITON_FLASH_ATTN-e3"}


def records(run):
    with gzip.open(run / "results.json.gz", "rt") as fh:
        return json.load(fh)["tests"]


def listed(entries, record) -> bool:
    return expectations.first_match(entries, record["nodeid"], {record["platform"], record["arch"], record["backend"]}) is not None


KNOWN = expectations.parse(str(EXPECTATIONS))


def test_every_check_that_failed_on_the_h200_is_a_listed_vllm_non_conformance():
    assert [r["nodeid"] for r in records(ALL) if r["outcome"] in FAILED_ON_THE_H200 and not listed(KNOWN, r)] == []


def test_no_check_that_passed_on_the_h200_is_listed():
    assert [r["nodeid"] for r in records(ALL) if r["outcome"] in ("passed", "unexpected-pass") and listed(KNOWN, r)] == []


@pytest.mark.parametrize("entry", KNOWN, ids=lambda e: f"line{e.line}")
def test_every_listed_gpu_expectation_failed_on_the_h200(entry):
    assert any(r["outcome"] in FAILED_ON_THE_H200 and listed([entry], r) for r in records(ALL))


def test_every_process_of_the_all_members_run_completed_but_the_one_the_deadline_ended():
    status = dict(line.split(None, 1) for line in (ALL / "runs.txt").read_text().splitlines())
    assert {stem for stem, how in status.items() if "complete" not in how.split()} == ENDED_AT_THE_DEADLINE
    gated = dict(line.split(None, 1) for line in (GATED / "runs.txt").read_text().splitlines())
    assert all(gated[stem].split()[2] == "complete" for stem in ENDED_AT_THE_DEADLINE)


def test_the_gated_h200_run_has_no_failure_and_only_listed_expected_failures():
    gated = records(GATED)
    assert [r["nodeid"] for r in gated if r["outcome"] in ("failed", "error", "crashed", "timeout", "unexpected-pass")] == []
    assert [r["nodeid"] for r in gated if r["outcome"] == "expected-failure" and not listed(KNOWN, r)] == []


@pytest.mark.parametrize("entry", KNOWN, ids=lambda e: f"line{e.line}")
def test_every_listed_gpu_expectation_was_an_expected_failure_in_the_gated_run(entry):
    assert any(r["outcome"] == "expected-failure" and listed([entry], r) for r in records(GATED))


def test_cpu_attn_swap_is_not_applicable_on_the_h200():
    swap = [r for r in records(ALL) if r["backend"] == "vllm:CPU_ATTN" and r["family"] == "swap"]
    assert swap and {r["outcome"] for r in swap} == {"not-applicable"}
