"""AMD AITER's Triton KV writer under the suite on the CPU (TRITON_INTERPRET=1): ``aiter:flash`` and
``aiter:asm`` (backends_under_test/aiter_backend.py) run ``fused_qk_rope_reshape_and_cache`` of
the amd-aiter wheel itself. ``KVCONFORM_AITER`` names the unzipped wheel; without it the pinned
wheel is fetched once per session with ``pip download`` (sha256 checked). When the
registry cannot be reached the tests skip saying so; ``KVCONFORM_REQUIRE_AITER=1`` makes that a
failure. One suite run (write, shuffle and gating families, gated by the expectations file)
answers the verdict tests; docs/REAL_KERNELS.md has the tables.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from kvconform.backends_under_test.aiter_backend import PINNED

from .suite_runs import ROOT, run_suite

WHEEL_SHA256 = "fe139d74438217c35e87e3b961166bac8db2d381eadccb371da2e63615f05a31"
EXPECTATIONS = ROOT / "docs" / "expectations" / "aiter-0.1.7.post2.dev18.txt"
LAYOUTS = {"aiter:flash": ("NHD", "HND"), "aiter:asm": ("legacy",)}  # as results name them, first word
# The fixed write checks every layout passes in fp16 (the first declared dtype under the interpreter).
FP16_WRITES = (
    "test_each_declared_cache_dtype_is_written_at_reference_offsets",
    "test_each_declared_size_class_is_written_at_reference_offsets",
    "test_padding_slots_leave_cache_untouched",
    "test_key_value_rows_are_read_through_their_row_stride",
    "test_single_kv_head_with_degenerate_head_stride_is_written",
    "test_int32_and_int64_slot_mappings_write_the_same_bytes",
)
INTERPRETER = "this machine's Triton interpreter"


def fetch_wheel(into: Path) -> Path:
    """The pinned amd-aiter wheel's Python tree under ``into``; skips (or fails) when pip cannot fetch it."""
    wheels = into / "wheel"
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
                           "-d", str(wheels), PINNED], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        why = f"`pip download {PINNED}` failed: {proc.stderr.strip()[-400:]}"
        if os.environ.get("KVCONFORM_REQUIRE_AITER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    wheel = next(wheels.glob("amd_aiter-*.whl"))
    assert hashlib.sha256(wheel.read_bytes()).hexdigest() == WHEEL_SHA256, f"{wheel.name} is not the wheel docs/REAL_KERNELS.md was measured on"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(into, [n for n in zf.namelist() if n.startswith("aiter/") and n.endswith(".py")])
    wheel.unlink()
    return into


@pytest.fixture(scope="session")
def aiter_tree(tmp_path_factory) -> str:
    if os.environ.get("KVCONFORM_AITER"):
        return os.environ["KVCONFORM_AITER"]
    return str(fetch_wheel(tmp_path_factory.mktemp("aiter-wheel")))


@pytest.fixture(scope="module")
def run(aiter_tree, tmp_path_factory):
    """Both adapters, write + shuffle + gating families, with the expectations file. The prefill-run
    tile check and the golden digests (minutes each under the interpreter) and the cache past 2^31
    elements (gigabytes of lazily mapped pages per worker on a shared CI machine) run on the H200."""
    result = run_suite(tmp_path_factory.mktemp("aiter"), "-q", "--kvc-backend", "aiter:flash,aiter:asm", "-m", "write or shuffle or gating",
                       "-k", "not prefill_run and not 2_31", "-n", "2", "--kvc-expectations", str(EXPECTATIONS),
                       env={"KVCONFORM_AITER": aiter_tree, "TRITON_INTERPRET": "1"}, timeout=1500)
    if result.document is None:
        pytest.fail(f"no results from {' '.join(result.proc.args)}:\n{result.output}")
    return {**result.document, "exit_status": result.returncode}


def records(run, backend, check=None):
    return [r for r in run["tests"] if r["backend"] == backend and (check is None or r["check"] == check)]


def probe(module: str, *args: str, aiter_tree: str) -> str:
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KVCONFORM_AITER": aiter_tree, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("backend", LAYOUTS)
def test_the_adapter_runs_the_kernel_of_the_pinned_aiter_wheel(run, backend):
    versions = run["environment"]["backends"][backend]
    assert versions["aiter"] == PINNED.split("==")[1]
    assert versions["aiter_kernel"] == "aiter.ops.triton.fused_kv_cache.fused_qk_rope_reshape_and_cache"
    assert versions["triton_mode"] == "interpreted (TRITON_INTERPRET=1)"


@pytest.mark.parametrize("backend", LAYOUTS)
def test_fp16_writes_land_at_the_reference_offsets_in_every_layout(run, backend):
    passed = {(r["check"], r["layout"].split()[0]) for r in records(run, backend) if r["outcome"] == "passed"}
    missing = [(check, layout) for layout in LAYOUTS[backend] for check in FP16_WRITES if (check, layout) not in passed]
    assert missing == []


def test_aiter_asm_writes_k_and_v_into_their_legacy_tiles(run):
    tiles = {r["check"]: r["outcome"] for r in records(run, "aiter:asm") if r["family"] == "shuffle" and r["outcome"] == "passed"}
    assert set(tiles) == {"test_shuffled_tiles_stay_inside_their_block_and_side", "test_v_is_written_in_the_v_tile_not_the_k_tile"}


@pytest.mark.parametrize("backend", LAYOUTS)
def test_a_slot_mapping_shorter_than_the_keys_makes_aiter_write_a_slot_beyond_it(run, backend):
    """9 key rows, 3 slots, two query heads per KV head: the kernel reads slot_mapping[3..5] and
    writes token 3's K and V into the stale slot 0 there (docs/expectations/aiter-0.1.7.post2.dev18.txt)."""
    beyond = records(run, backend, "test_key_rows_beyond_slot_mapping_are_ignored")
    assert {r["outcome"] for r in beyond} == {"expected-failure"}
    assert all(r["failure"]["mismatches"][0]["where"].startswith("layer=0 block=0 kv=K slot=0 ") for r in beyond)


@pytest.mark.parametrize("backend", LAYOUTS)
def test_bf16_writes_are_not_applicable_while_the_interpreter_gets_bf16_arithmetic_wrong(run, backend):
    bf16 = [r for r in records(run, backend) if r["model_dtype"] == "torch.bfloat16" and r["family"] == "write"]
    assert bf16 and {r["outcome"] for r in bf16} == {"not-applicable"}
    assert all(r["not_applicable"]["who"] == INTERPRETER and "1.5 * 1.0 in bfloat16 gave" in r["not_applicable"]["what"] for r in bf16)


@pytest.mark.parametrize("backend", LAYOUTS)
def test_fp8_is_not_declared_under_the_interpreter(run, backend):
    assert "rounding carry" in run["environment"]["backends"][backend]["fp8"]
    fp8 = records(run, backend, "test_fp8_codes_equal_the_reference_encoder_for_edge_values")
    assert fp8 and all(r["outcome"] == "not-applicable" and "declares no fp8" in r["not_applicable"]["what"] for r in fp8)


@pytest.mark.parametrize("backend", LAYOUTS)
def test_connector_gating_is_not_applicable_to_a_kernel_library(run, backend):
    gating = [r for r in records(run, backend) if r["family"] == "gating"]
    assert gating and {r["outcome"] for r in gating} == {"not-applicable"}


def test_nothing_fails_beyond_the_expectations_file(run):
    unexpected = [f"{r['backend']} {r['check']}: {r['outcome']}" for r in run["tests"] if r["outcome"] in ("failed", "error", "crashed", "timeout")]
    assert unexpected == [] and run["exit_status"] == 0


def test_aiters_k_path_does_bf16_arithmetic_that_the_interpreter_computes_on_bit_patterns(aiter_tree):
    """The construct: neox RoPE on K in the model dtype, ``x*cos + rot(x)*sin`` with ``rot`` negating half of x."""
    found = json.loads(probe("tests.triton_bf16_ops", "aiter", aiter_tree=aiter_tree))
    assert len(found) == 2 and all(ops == ["binary_op(add)", "binary_op(multiply)", "unary_op(negative)"] for ops in found.values())


def test_an_identity_rope_keeps_fp16_minus_zero_only_where_rot_x_times_zero_is_minus_zero(aiter_tree):
    lines = probe("tests.real_kernels_gpu.aiter_probes", aiter_tree=aiter_tree).splitlines()
    assert "K=-0, partner +1  : K stored   -0.0 (8000)" in lines[0]   # rot(x)[0] = -x[32] = -1: -0 + (-0) = -0
    assert "K=-0, partner -1  : K stored    0.0 (0000)" in lines[1]   # rot(x)[1] = +1: -0 + (+0) = +0
    assert all("K stored    nan" in line and "V stored 3c00" in line for line in lines[2:5])  # 1 + inf*0 = NaN; V untouched
    assert lines[5].endswith("1 query heads per KV head: slots written [33, 79]")
    assert lines[6].endswith("2 query heads per KV head: slots written [5, 33, 79]")
