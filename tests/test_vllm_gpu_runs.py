"""The committed H200 runs of vLLM 0.33.0 and the GPU expectations file tell one story.

- docs/runs/vllm-gpu-h200/ (ungated): every failure in it is a listed vLLM non-conformance or an
  adapter defect fixed since (named here), and every listed one occurred — so a vendor gating on
  that file gets exit 0 with them as known failures, and any other failure still fails.
- docs/runs/vllm-gpu-h200-gated/ (the same suite with ``--kvc-expectations`` that file): nothing
  failed, every expected failure is a listed one, every entry was seen as an expected failure,
  and CPU_ATTN's swap checks are not applicable (the adapter fix above, seen on the H200).
"""

from __future__ import annotations

import gzip
import json

import pytest

from kvconform.reports import expectations

from .suite_runs import ROOT

RUNS = ROOT / "docs" / "runs"
RUN = RUNS / "vllm-gpu-h200" / "results.json.gz"
GATED = RUNS / "vllm-gpu-h200-gated" / "results.json.gz"
EXPECTATIONS = ROOT / "docs" / "expectations" / "vllm-0.33.0-gpu.txt"
FAILING = ("failed", "error", "crashed", "timeout")
# Ours, fixed after the run: the adapter declared swap for CPU_ATTN, whose CpuPlatform has no block
# swaps (now: not applicable, "CpuPlatform has no swap_out_blocks_to_host / insert_blocks_to_device").
FIXED_SINCE = {("vllm:CPU_ATTN", "swap")}


def records(path):
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["tests"]


def failures():
    return [r for r in records(RUN) if r["outcome"] in FAILING]


def listed(entries, record) -> bool:
    return expectations.first_match(entries, record["nodeid"], {record["platform"], record["arch"], record["backend"]}) is not None


def test_every_h200_failure_is_a_listed_vllm_non_conformance_or_fixed_since():
    known = expectations.parse(str(EXPECTATIONS))
    unexplained = [r["nodeid"] for r in failures() if (r["backend"], r["family"]) not in FIXED_SINCE and not listed(known, r)]
    assert unexplained == []


def test_every_listed_gpu_expectation_occurred_on_the_h200():
    found = failures()
    for entry in expectations.parse(str(EXPECTATIONS)):
        assert any(listed([entry], r) for r in found), entry


def test_the_gated_h200_run_has_no_failure_and_only_listed_expected_failures():
    gated = records(GATED)
    known = expectations.parse(str(EXPECTATIONS))
    assert [r["nodeid"] for r in gated if r["outcome"] in FAILING + ("unexpected-pass",)] == []
    assert [r["nodeid"] for r in gated if r["outcome"] == "expected-failure" and not listed(known, r)] == []


@pytest.mark.parametrize("entry", expectations.parse(str(EXPECTATIONS)), ids=lambda e: f"line{e.line}")
def test_every_listed_gpu_expectation_was_an_expected_failure_in_the_gated_run(entry):
    assert any(r["outcome"] == "expected-failure" and listed([entry], r) for r in records(GATED))


def test_cpu_attn_swap_is_not_applicable_in_the_gated_h200_run():
    swap = [r for r in records(GATED) if r["backend"] == "vllm:CPU_ATTN" and r["family"] == "swap"]
    assert swap and {r["outcome"] for r in swap} == {"not-applicable"}
