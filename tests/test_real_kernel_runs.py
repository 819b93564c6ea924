"""The committed H200 runs of docs/REAL_KERNELS.md (docs/runs/real-kernels-h200/) and their
expectations files tell one story: every check that did not pass there is a listed finding, nothing
that passed is listed, every entry failed there; and the probes' logs say what the document says.
"""

from __future__ import annotations

import ast
import gzip
import importlib
import importlib.util
import json
import re

import pytest

from kvconform.reports import expectations

from .suite_runs import ROOT

RUN = ROOT / "docs" / "runs" / "real-kernels-h200"
FILES = {  # run directory -> the expectations file for it
    "aiter": ROOT / "docs" / "expectations" / "aiter-0.1.7.post2.dev18.txt",
    "vllm-cuda-ops": ROOT / "docs" / "expectations" / "vllm-0.33.0-gpu-cuda-ops.txt",
}
DID_NOT_PASS = ("failed", "error", "crashed", "timeout", "expected-failure")


def records(run: str) -> list[dict]:
    with gzip.open(RUN / run / "results.json.gz", "rt") as fh:
        return json.load(fh)["tests"]


def listed(entries, record) -> bool:
    return expectations.first_match(entries, record["nodeid"], {record["platform"], record["arch"], record["backend"]}) is not None


@pytest.mark.parametrize("run", FILES)
def test_every_check_that_did_not_pass_on_the_h200_is_listed(run):
    entries = expectations.parse(str(FILES[run]))
    assert [r["nodeid"] for r in records(run) if r["outcome"] in DID_NOT_PASS and not listed(entries, r)] == []


@pytest.mark.parametrize("run", FILES)
def test_no_check_that_passed_on_the_h200_is_listed(run):
    entries = expectations.parse(str(FILES[run]))
    assert [r["nodeid"] for r in records(run) if r["outcome"] in ("passed", "unexpected-pass") and listed(entries, r)] == []


@pytest.mark.parametrize("run", FILES)
def test_every_listed_entry_failed_on_the_h200(run):
    entries = expectations.parse(str(FILES[run]))
    assert [e.line for e in entries if not any(r["outcome"] in DID_NOT_PASS and listed([e], r) for r in records(run))] == []


def test_the_compiled_writers_ran_for_every_member_that_had_no_write_verdict_before():
    """FLASH_ATTN, FLASHINFER, FLEX_ATTENTION: every layout has passing write checks; ROCM_ATTN's
    LHBNC fixed write checks ran at 16 and 32 (the compiled reshape_and_cache) as well as 48."""
    runs = records("vllm-cuda-ops")
    for backend in ("vllm:FLASH_ATTN", "vllm:FLASHINFER", "vllm:FLEX_ATTENTION"):
        layouts = {r["layout"] for r in runs if r["backend"] == backend and r["family"] == "shape"}
        written = {r["layout"] for r in runs if r["backend"] == backend and r["family"] == "write" and r["outcome"] == "passed"}
        assert layouts and layouts <= written, backend
    lhbnc = [r for r in runs if r["backend"] == "vllm:ROCM_ATTN" and r["family"] == "write" and r["outcome"] == "passed" and r["layout"].startswith("LHBNC")]
    assert any(r["block_sizes"] == [16, 32, 48] for r in lhbnc)


def agreement() -> list[str]:
    return (RUN / "agreement.txt").read_text().splitlines()


def test_cuda_and_triton_flash_writers_agree_bit_for_bit_except_fp8_e5m2():
    lines = [line for line in agreement() if re.match(r"\s*(bfloat16|float16) ", line)]
    # 2 model dtypes × (auto: 2 orders × 2 scale pairs × K, V + 3 fp8 dtypes × 2 orders × 2 row kinds × 2 scale pairs × K, V)
    assert len(lines) == 2 * (2 * 2 * 2 + 3 * 2 * 2 * 2 * 2)
    for line in lines:
        kv_cache_dtype = line.split()[1]
        if kv_cache_dtype == "fp8_e5m2":
            differ, cuda_right, triton_right = map(int, re.search(r"(\d+) elements differ \(CUDA = reference on (\d+), Triton = reference on (\d+)\)", line).groups())
            assert cuda_right == differ and triton_right == 0, line
        else:
            assert line.endswith("identical (= reference)"), line


def test_vllms_compiled_swap_blocks_moves_whole_blocks_like_torch_indexing():
    assert agreement()[-1].endswith("identical to torch indexing")


def test_flashinfers_append_paged_kv_cache_lands_where_the_reference_puts_each_token():
    lines = [line for line in (RUN / "flashinfer-page.txt").read_text().splitlines() if line.startswith("append_paged_kv_cache")]
    assert len(lines) == 8 and all(line.endswith("identical to the reference") for line in lines)


FLASHINFER_RERUN = "flashinfer/rerun-2026-12-01-padding"  # after the adapter declared padding_slots=False
# The write checks that were n/a before that only because their slot mapping also held a -1.
WRITES_NO_LONGER_PADDED = {
    "test_each_declared_cache_dtype_is_written_at_reference_offsets": 2,
    "test_each_declared_size_class_is_written_at_reference_offsets": 4,
    "test_key_rows_beyond_slot_mapping_are_ignored": 1,
    "test_single_kv_head_with_degenerate_head_stride_is_written": 1,
    "test_last_block_of_a_cache_past_2_31_elements_is_written": 1,
}


def flashinfer_rows(run: str) -> list[dict]:
    """``DIR`` is DIR/results.json.gz, ``DIR/full`` DIR/full-results.json.gz."""
    directory, _, prefix = run.rpartition("/") if run.endswith("/full") else (run, "", "")
    with gzip.open(RUN / directory / f"{prefix + '-' if prefix else ''}results.json.gz", "rt") as fh:
        return json.load(fh)["tests"]


@pytest.mark.parametrize("run", [FLASHINFER_RERUN, f"{FLASHINFER_RERUN}/full"])
def test_flashinfers_own_append_and_decode_pass_every_check_that_applies(run):
    # No expectations file: docs/REAL_KERNELS.md says FlashInfer got nothing wrong under the suite.
    rows = flashinfer_rows(run)
    assert {r["outcome"] for r in rows} == {"passed", "not-applicable"}
    for backend in ("flashinfer:nhd", "flashinfer:hnd"):
        writes = [r for r in rows if r["backend"] == backend and r["family"] == "write"]
        # Every write check that applies passes; the three that do not are n/a by declaration:
        # the padding check (no padding slot) and the two fp8 edge-value checks (no fp8 cache).
        skipped = sorted(r["check"] for r in writes if r["outcome"] == "not-applicable")
        assert skipped == ["test_fp8_codes_equal_the_reference_encoder_for_edge_values"] * 2 + ["test_padding_slots_leave_cache_untouched"]
        assert all(r["not_applicable"]["kind"] == "declaration" for r in writes if r["outcome"] == "not-applicable")
        padding = next(r for r in writes if r["check"] == "test_padding_slots_leave_cache_untouched")
        assert "declares no padding slot" in padding["not_applicable"]["what"]
        passed = [r["check"] for r in writes if r["outcome"] == "passed"]
        assert {check: passed.count(check) for check in WRITES_NO_LONGER_PADDED} == WRITES_NO_LONGER_PADDED
        generated = next(r for r in writes if r["check"] == "test_written_elements_land_at_reference_offsets_and_nothing_else_changes")
        assert generated["outcome"] == "passed" and not generated["examples_not_applicable"]  # no padding drawn
        assert {r["outcome"] for r in rows if r["backend"] == backend and r["family"] == "read"} == {"passed"}
    if not run.endswith("/full"):  # the bf16 and fp16 golden digests write without their padding rows now
        goldens = [r for r in rows if r["check"] == "test_canonical_bytes_equal_the_committed_reference_digests"]
        assert sorted(r["nodeid"].split("-")[-4] for r in goldens if r["outcome"] == "passed") == ["bf16", "bf16", "fp16", "fp16"]


@pytest.mark.parametrize("run", ["flashinfer", "flashinfer/full"])
def test_flashinfers_runs_before_the_padding_declaration_lost_their_write_checks_to_padding(run):
    # The committed runs before ccf09d1: no failure, and every write n/a was a -1 or an fp8 cache.
    rows = flashinfer_rows(run)
    assert {r["outcome"] for r in rows} == {"passed", "not-applicable"}
    writes = [r for r in rows if r["family"] == "write" and r["outcome"] == "not-applicable"]
    assert writes and all("padding" in r["not_applicable"]["what"] or "fp8" in r["not_applicable"]["what"] for r in writes)
    assert {r["backend"] for r in rows if r["family"] == "read" and r["outcome"] == "passed"} == {"flashinfer:nhd", "flashinfer:hnd"}


def test_flashinfers_append_takes_a_key_of_another_dtype_silently():
    lines = (RUN / "flashinfer" / "dtype-probe.txt").read_text().splitlines()
    assert len(lines) == 4 and all("accepted silently; stores the key's raw bytes" in line for line in lines)


def test_aiters_fp8_codes_differ_only_where_an_identity_rope_changes_k():
    fp8 = [line for line in (RUN / "aiter" / "probes.txt").read_text().splitlines() if "ties:" in line]
    assert len(fp8) == 8 and all(line.endswith("V 0, K: other 0") for line in fp8)


GPU_ONLY_SCRIPTS = sorted((ROOT / "tests").glob("*_gpu/*.py"))


@pytest.mark.parametrize("script", GPU_ONLY_SCRIPTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_kvconform_name_a_gpu_only_script_imports_exists(script):
    """The device recipes only run on the H200, so a renamed helper would first break there:
    every ``from kvconform.X import name`` they hold must resolve on this machine."""
    missing = []
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("kvconform"):
            module = importlib.import_module(node.module)
            missing += [f"{node.module}.{a.name}" for a in node.names
                        if not hasattr(module, a.name) and importlib.util.find_spec(f"{node.module}.{a.name}") is None]
    assert missing == []
