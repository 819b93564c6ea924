"""The vLLM adapter against the REAL vLLM 0.33.0 on CPU (Triton interpreter, stand-ins in
tests/vllm_cpu/). Runs when ``KVCONFORM_VLLM_PYTHON`` names a Python with vLLM installed
(.ci/run builds one with tests/vllm_cpu/make_venv.sh); ``KVCONFORM_REQUIRE_VLLM=1`` makes its
absence a failure. Each module fixture is one suite run; the tests read its results JSON.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from .suite_runs import ROOT, run_suite
from .vllm_cpu.runs import GFX942, ROCM_GFX942, SEGMENTED, UNIFIED_SHUFFLE

VLLM_PYTHON = os.environ.get("KVCONFORM_VLLM_PYTHON")
PLUGIN = ["-p", "tests.vllm_cpu.plugin"]
FAILING = ("failed", "error", "crashed", "timeout")

needs_vllm = pytest.mark.skipif(
    not VLLM_PYTHON and os.environ.get("KVCONFORM_REQUIRE_VLLM") != "1",
    reason="KVCONFORM_VLLM_PYTHON not set (tests/vllm_cpu/make_venv.sh builds a vLLM venv)",
)


def suite(python, tmp_path, *args):
    run = run_suite(tmp_path, "-q", *args, python=python)
    if run.document is None:
        pytest.fail(f"no results from {' '.join(run.proc.args)}:\n{run.output}")
    return {**run.document, "exit_status": run.returncode}


def forked(vllm_runs, name):
    """One of the single-backend runs forked from one set-up (tests/vllm_cpu/runs.py)."""
    run = vllm_runs[name]
    assert run is not None, f"{name}: the suite wrote no results"
    return run


def records(run, backend, family=None):
    return [r for r in run["tests"] if r["backend"] == backend and (family is None or r["family"] == family)]


def outcomes(run, backend, family=None):
    return {r["outcome"] for r in records(run, backend, family)}


def problems(run, backend):
    return [f"{r['check']} [{r['layout']}]: {r['outcome']}: {r['message'][:300]}" for r in records(run, backend) if r["outcome"] in FAILING]


@pytest.fixture(scope="module")
def gfx942(vllm_runs):
    """Every in-scope backend on a simulated MI300X (gfx942), the E3 they declare (tests/vllm_cpu/runs.py)."""
    return forked(vllm_runs, GFX942)


@needs_vllm
@pytest.mark.parametrize("backend", ROCM_GFX942)
def test_conforming_vllm_code_raises_no_false_alarm(gfx942, backend):
    assert records(gfx942, f"vllm:{backend}"), f"no checks ran for vllm:{backend}"
    assert problems(gfx942, f"vllm:{backend}") == []


@needs_vllm
@pytest.mark.parametrize("backend, families", [
    ("TRITON_ATTN", ("shape", "write", "swap", "copy", "gating", "equivalence")),
    ("ROCM_AITER_FA+shuffle", ("shape", "split", "write", "shuffle", "swap", "copy", "gating")),
    ("ROCM_ATTN", ("shape", "split", "write", "swap", "copy", "gating")),
    ("ROCM_AITER_FA", ("shape", "split", "swap", "copy", "gating")),
])
def test_vllm_code_paths_that_run_on_cpu_are_checked(gfx942, backend, families):
    for family in families:
        assert "passed" in outcomes(gfx942, f"vllm:{backend}", family), f"vllm:{backend}: no {family} check passed"


@needs_vllm
@pytest.mark.parametrize("backend", ["ROCM_AITER_FA", "ROCM_AITER_UNIFIED_ATTN", "FLASH_ATTN"])
def test_writes_through_compiled_ops_are_not_applicable_with_the_op_named(gfx942, backend):
    writes = records(gfx942, f"vllm:{backend}", "write")
    assert writes and all(r["outcome"] == "not-applicable" for r in writes)
    assert any("reshape_and_cache_flash" in r["message"] for r in writes)


@needs_vllm
def test_rocm_attn_declares_no_connector_is_rejected_and_never_selected_with_one(gfx942):
    gating = {r["check"]: r["outcome"] for r in records(gfx942, "vllm:ROCM_ATTN", "gating")}
    assert set(gating.values()) == {"passed"}
    assert {"test_connector_configuration_is_rejected_iff_unsupported", "test_selector_offers_a_connector_configuration_only_backends_that_support_one"} <= set(gating)


@needs_vllm
def test_vllm_backends_are_checked_against_the_standard_they_declare(gfx942):
    assert gfx942["environment"]["standard"] == "e3"


@needs_vllm
def test_rocm_attn_lhbnc_writes_at_block_size_48_through_vllms_triton_fallback(gfx942):
    """16 and 32 take the compiled reshape_and_cache (absent here); 48 takes Triton and is checked."""
    writes = [r for r in records(gfx942, "vllm:ROCM_ATTN") if r["family"] in ("write", "shuffle") and (r["layout"] or "").startswith("LHBNC")
              and r["outcome"] != "not-applicable"]
    at_48 = [r for r in writes if r["nodeid"].endswith("-N48]")]  # the block-size class: written at 48 only
    fixed = [r for r in writes if r["block_sizes"] is not None]
    assert fixed and all(r["outcome"] == "passed" and r["block_sizes"] == [48] for r in fixed)
    assert at_48 and all(r["outcome"] == "passed" and r["block_sizes"] is None for r in at_48)
    assert all("reshape_and_cache" in " ".join(r["examples_not_applicable"] or {}) for r in writes if r not in at_48)


@needs_vllm
def test_not_applicable_reasons_name_who_lacks_what(gfx942):
    def who(backend, check):
        return {r["not_applicable"]["who"] for r in records(gfx942, backend) if r["check"] == check and r["not_applicable"]}

    assert who("vllm:TRITON_ATTN", "test_paged_decode_equals_sdpa_on_the_dense_kv") == {"kvconform's vLLM adapter (backend vllm:TRITON_ATTN)"}
    assert who("vllm:TRITON_ATTN", "test_split_views_share_the_cache_storage") == {"vLLM 0.33.0 TRITON_ATTN"}
    assert who("vllm:FLASH_ATTN", "test_padding_slots_leave_cache_untouched") == {"this machine's vLLM build"}


@needs_vllm
def test_every_check_that_passes_on_vllm_fails_on_some_vllm_regression(gfx942):
    """No check passes whatever vLLM does: each one passing here is named by a regression in
    tests/vllm_cpu/regressions.py, which test_vllm_regressions.py proves fails it."""
    from .vllm_cpu.regressions import REGRESSIONS

    passing = {r["check"] for r in gfx942["tests"] if r["outcome"] == "passed"}
    covered = set().union(*(regression.fails for regression in REGRESSIONS.values()))
    assert passing - covered == set()


@needs_vllm
def test_fp8_under_the_interpreter_is_not_applicable_with_the_reason(gfx942):
    fp8 = [r for r in records(gfx942, "vllm:TRITON_ATTN") if "fp8" in r["check"]]
    assert fp8 and all(r["outcome"] == "not-applicable" for r in fp8)
    assert "rounding carry" in gfx942["environment"]["backends"]["vllm:TRITON_ATTN"]["fp8"]


@needs_vllm
def test_unified_shuffle_on_gfx1250_fails_f18_and_a_vendor_can_gate_on_it(vllm_runs):
    """SPEC F.18: on gfx1250 with the shuffled cache, ROCM_AITER_UNIFIED_ATTN unbinds dim 0
    of the [B, H, N, C] view — vLLM's own non-conformance. Without expectations the run fails;
    with docs/expectations/vllm-0.33.0.txt it is known (exit 0) and nothing else failed."""
    backend = UNIFIED_SHUFFLE
    plain = forked(vllm_runs, "unified-shuffle")
    splits = [r for r in records(plain, backend, "split") if r["outcome"] != "not-applicable"]
    assert plain["exit_status"] == 1 and splits and all(r["outcome"] == "failed" and "F.18" in r["message"] for r in splits)
    gated = forked(vllm_runs, "unified-shuffle-gated")  # with --expectations docs/expectations/vllm-0.33.0.txt
    assert gated["exit_status"] == 0 and gated["stale_expectations"] == []
    assert {r["outcome"] for r in records(gated, backend)} == {"passed", "not-applicable", "expected-failure"}


@needs_vllm
def test_a_backend_for_other_hardware_is_not_applicable_there_and_checked_where_vllm_selects_it(vllm_runs):
    """ROCM_SEGMENTED_ATTN is RDNA-only: on a simulated CDNA gfx942 vLLM rejects the device ("requires
    AMD RDNA GPUs"), so every check is not applicable naming that (before: 45 errors, its impl raises);
    on a simulated RDNA gfx1201 its checks run."""
    cdna, rdna = forked(vllm_runs, "segmented-gfx942"), forked(vllm_runs, "segmented-gfx1201")
    on_its_layouts = [r for r in records(cdna, SEGMENTED) if r["layout"]]  # the others: no latent/quant cache declared
    assert on_its_layouts and {r["outcome"] for r in on_its_layouts} == {"not-applicable"}
    assert all(r["not_applicable"]["kind"] == "machine" and "requires AMD RDNA GPUs" in r["not_applicable"]["what"] for r in on_its_layouts)
    assert problems(rdna, SEGMENTED) == [] and "passed" in outcomes(rdna, SEGMENTED, "split")


@needs_vllm
def test_e1_era_blocks_first_declaration_passes(vllm_runs):
    run = forked(vllm_runs, "e1-era:blocks_first_hnd")
    backend = "tests.vllm_cpu.e1_era:blocks_first_hnd"
    assert problems(run, backend) == [] and "passed" in outcomes(run, backend, "shape") and "passed" in outcomes(run, backend, "swap")


@needs_vllm
def test_e1_era_kv_first_cache_breaks_vllms_platform_block_copies(vllm_runs):
    """SPEC F.1: RocmPlatform.insert_blocks_to_device / swap_out_blocks_to_host index dim 0;
    on ROCM_ATTN's E1-era (2, B, N, H, D) cache ids >= 2 raise and ids {0, 1} move whole planes."""
    backend = "tests.vllm_cpu.e1_era:kv_first_rocm_attn"
    run = forked(vllm_runs, "e1-era:kv_first_rocm_attn")
    swaps = {r["check"]: r for r in records(run, backend, "swap") if r["outcome"] != "not-applicable"}
    out = swaps["test_swap_out_places_each_block_at_its_host_slot"]
    assert out["raised"] == "IndexError" and "out of bounds for dimension 0" in out["message"]
    planes = swaps["test_swap_of_blocks_0_and_1_moves_blocks_not_planes"]
    # (nearly) every element of the (2, B, N, H, D) cache differs, and K holds V's bytes: the planes
    # moved. Nearly: the cache is random-filled, so a K element can equal its V twin by chance (one
    # in 65536 for 2-byte elements); a swap that moved blocks would differ in none.
    layers, blocks, slots, heads, dims = map(int, re.match(r"L(\d+)-B(\d+)-N(\d+)-H(\d+)-D(\d+)", planes["geometry"]).groups())
    whole = 2 * layers * blocks * slots * heads * dims
    differ = re.match(r"swap: (\d+) elements differ", planes["message"])
    assert planes["outcome"] == "failed" and differ and int(differ[1]) > 0.99 * whole, planes["message"][:300]
    assert "other-element: K[b=0, s=0..15, h=0..2] holds V[b=1, s=0..15]'s bytes" in planes["message"], planes["message"][:600]
    assert outcomes(run, backend, "gating") == {"passed"}


@needs_vllm
def test_a_backend_with_neither_layout_api_is_an_unsupported_version_error(vllm_runs):
    backend = "tests.vllm_cpu.e1_era:neither_api"
    run = forked(vllm_runs, "e1-era:neither_api")
    rows = records(run, backend)
    assert rows and all(r["outcome"] == "error" and "unsupported vLLM version" in r["message"] for r in rows)


@needs_vllm
def test_vllm_kernels_under_test_are_real_triton_functions():
    """Without the stand-ins' environment, vLLM swaps Triton for placeholders and a pass would
    mean nothing (shared/vllm-cpu README): the kernels must be Triton JIT functions."""
    probe = (
        "import tests.vllm_cpu.plugin, triton\n"
        "from vllm.v1.attention.ops.triton_reshape_and_cache_flash import reshape_and_cache_kernel_flash as a\n"
        "from vllm.v1.attention.backends.rocm_aiter_fa import reshape_and_cache_shuffle_kernel as b\n"
        "kinds = (triton.runtime.JITFunction, triton.runtime.interpreter.InterpretedFunction)\n"
        "assert all(isinstance(k, kinds) for k in (a, b)), (type(a), type(b))\n"
    )
    proc = subprocess.run([VLLM_PYTHON, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_absent_vllm_makes_every_check_not_applicable(tmp_path):
    """kvconform's own venv has no vLLM: vllm:NAME must be not-applicable, never a failure."""
    if subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0:
        pytest.skip("vLLM is installed in this environment")
    run = suite(sys.executable, tmp_path, "--backend", "vllm:ROCM_AITER_FA", "-k", "shape or gating")
    rows = records(run, "vllm:ROCM_AITER_FA")
    assert rows and all(r["outcome"] == "not-applicable" and "vLLM is not installed" in r["message"] for r in rows)


@pytest.mark.parametrize("release, module, takes_layout", [
    ("0.31.0", "vllm.v1.core.kv_cache_utils", False), ("0.32.0", "vllm.v1.core.kv_cache_utils", True),
    ("0.33.0", "vllm.v1.core.kv_cache_planning", True),
])
def test_blocks_are_sized_as_each_releases_worker_sizes_them(monkeypatch, release, module, takes_layout):
    """0.30.0-0.31.0's worker sizes a block without the layout (kv_cache_utils.py:1768 in 0.31.0), later
    ones with it: the adapter calls the planner as that release's worker does (it refused 0.31.0 before)."""
    import types

    from kvconform.backends_under_test import vllm_base

    calls = []
    sizing = (lambda groups, layout: calls.append((groups, layout)) or 96) if takes_layout else (lambda groups: calls.append((groups,)) or 64)
    for name in ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"):
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**({"_get_kv_cache_bytes_per_block": sizing} if name == module else {})))
    assert vllm_base.cache_bytes_per_block(["group"], "LBHNC") == (96 if takes_layout else 64)
    assert calls == [(["group"], "LBHNC") if takes_layout else (["group"],)]
