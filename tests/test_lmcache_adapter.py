"""LMCache 0.5.6's connector transfer under the suite on the CPU: ``lmcache_torch:NAME`` runs LMCache's
own detection, slot mapping and torch baseline of ``multi_layer_kv_transfer``; ``lmcache:NAME`` (its
CUDA op) is not applicable here, naming ``lmcache.cuda_ops``. ``KVCONFORM_LMCACHE`` names a tree
with ``lmcache_native`` built in place; without it the pinned sdist is fetched once per session
with ``pip download`` (sha256 checked) and its ``lmcache_native`` (C++, pybind11, no CUDA) built
with g++. When that cannot be done the tests skip saying so; ``KVCONFORM_REQUIRE_LMCACHE=1`` makes
it a failure. docs/REAL_KERNELS.md has the tables.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from kvconform import reference as R

from .real_kernels_gpu import lmcache_sdist
from .suite_runs import ROOT, run_suite

EXPECTATIONS = ROOT / "docs" / "expectations" / "lmcache-0.5.6.txt"
WIRE_CHECKS = ("test_exported_blocks_import_bit_for_bit", "test_block_size_translation_keeps_every_token")


def unavailable(why: str):
    if os.environ.get("KVCONFORM_REQUIRE_LMCACHE") == "1":
        pytest.fail(why)
    pytest.skip(why)


def pip(*args: str, into: Path) -> Path:
    proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "-d", str(into), *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_CUDA_EXT": "1"})
    if proc.returncode != 0:
        unavailable(f"`pip download {' '.join(args)}` failed: {proc.stderr.strip()[-400:]}")
    return into


def build_tree(into: Path) -> Path:
    """The pinned sdist unpacked, ``lmcache_native`` compiled in place, ``cachetools`` beside it."""
    try:
        sdist = lmcache_sdist.fetch(into / "sdist")  # the pin the GPU recipe (prepare.sh) fetches too
    except lmcache_sdist.FetchError as exc:  # a file that is not the pinned one (WrongFile) fails the test
        unavailable(str(exc))
    with tarfile.open(sdist) as tar:
        tar.extractall(into, filter="data")
    tree = into / "lmcache-0.5.6"
    import torch.utils.cpp_extension  # the include paths of torch's pybind11

    compiler = shutil.which("g++")
    if compiler is None:
        unavailable("no g++ to build LMCache's lmcache_native (C++17, pybind11)")
    native = tree / "csrc" / "lmcache_native"
    includes = [torch.utils.cpp_extension.include_paths()[0], sysconfig.get_paths()["include"], native, tree / "csrc"]
    out = tree / "lmcache" / f"lmcache_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    proc = subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-std=c++17", *(f"-I{i}" for i in includes), *map(str, sorted(native.glob("*.cpp"))),
                           "-o", str(out), "-lpthread"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    wheel = next(pip("--only-binary=:all:", "cachetools", into=into / "deps").glob("cachetools-*.whl"))
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tree)
    return tree


@pytest.fixture(scope="session")
def lmcache_tree(tmp_path_factory) -> str:
    if os.environ.get("KVCONFORM_LMCACHE"):
        return os.environ["KVCONFORM_LMCACHE"]
    return str(build_tree(tmp_path_factory.mktemp("lmcache")))


@pytest.fixture(scope="module")
def lmc(lmcache_tree, monkeypatch_module):
    monkeypatch_module.setenv("KVCONFORM_LMCACHE", lmcache_tree)
    from kvconform.backends_under_test.lmcache_connector import lmcache

    lmcache.cache_clear()
    return lmcache()


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def detected(lmc, tensor: torch.Tensor, kv_layout: str) -> str:
    return lmc.kv_format.detect_format([tensor], lmc.vllm, {"kv_layout": kv_layout})[0].name


def test_lmcache_reads_a_two_block_blocks_first_cache_as_kv_first(lmc):
    # detectors/vllm.py:108 asks "is dim 0 of size 2?" before "is dim 1?": with B = 2 a blocks-first
    # (FlashInfer) cache [B, 2, N, H, D] has the kv-first shape, and LMCache reads K/V as the outer axis.
    three, two = (torch.zeros(b, 2, 16, 3, 64, dtype=torch.float16) for b in (3, 2))
    assert detected(lmc, three, "NHD") == "NL_X_NB_TWO_BS_NH_HS"
    assert detected(lmc, two, "NHD") == "NL_X_TWO_NB_BS_NH_HS"


def test_lmcache_gives_vllms_standard_and_two_slot_specs_one_format_at_two_kv_heads(lmc):
    # LMCache#4467: at H = 2 the per-layer view of vLLM's standard E3 cache [B, H, N, K‖V] and of its
    # 2-slot spec [B, 2 (K, V), N, H·D] are one shape with one set of strides; LMCache reads both as
    # "NH heads of packed K‖V content" — right for the first, K and V of both heads swapped for the second.
    g = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16, num_layers=2)
    views = []
    for layout in (R.standardized("LBHNC"), R.standardized("LBHNC", spec="two_slot")):
        shape, strides = layout.view_shape_strides(g)
        views.append(torch.zeros(layout.numel(g), dtype=g.dtype).as_strided(shape, strides)[0])
    standard, two_slot = views
    assert (standard.shape, standard.stride()) == (two_slot.shape, two_slot.stride())
    assert detected(lmc, standard, "HND") == detected(lmc, two_slot, "HND") == "NL_X_NB_NH_BS_CS"


@pytest.fixture(scope="module")
def run(lmcache_tree, tmp_path_factory):
    """The connector family on LMCache's torch baseline (every layout) and its CUDA op (absent here),
    with the expectations file; the broken variant in a run of its own (as a peer it would fail the others' interop rows)."""
    runs = {"lmcache": "lmcache_torch:NHD,lmcache_torch:HND,lmcache_torch:kv_first_NHD,lmcache_torch:kv_first_HND,lmcache:NHD",
            "broken": "tests.lmcache_variants:KvFirstFormatOnBlocksFirst"}
    tests = []
    for name, backends in runs.items():
        result = run_suite(tmp_path_factory.mktemp(name), "-q", "--kvc-backend", backends, "-m", "connector", "--kvc-expectations", str(EXPECTATIONS),
                           env={"KVCONFORM_LMCACHE": lmcache_tree}, timeout=1200)
        if result.document is None:
            pytest.fail(f"no results from {' '.join(result.proc.args)}:\n{result.output}")
        tests += result.document["tests"]
    return {"tests": tests}


def outcomes(run, backend, check) -> set[str]:
    return {r["outcome"] for r in run["tests"] if r["backend"] == backend and r["check"] == check}


@pytest.mark.parametrize("backend", ["lmcache_torch:NHD", "lmcache_torch:kv_first_NHD"])
@pytest.mark.parametrize("check", WIRE_CHECKS)
def test_lmcaches_torch_transfer_round_trips_and_reblocks_nhd_caches(run, backend, check):
    assert outcomes(run, backend, check) <= {"passed", "not-applicable"} and "passed" in outcomes(run, backend, check)


def test_the_broken_format_fails_the_round_trip(run):
    # kv_cache_dtype "auto" (fp8 kv-first is not applicable on a CPU torch: index_copy_ has no fp8 kernel there)
    auto = [r for r in run["tests"] if r["backend"] == "lmcache_wrong_format" and r["kv_cache_dtype"] == "auto" and r["check"] == WIRE_CHECKS[0]]
    assert [r["outcome"] for r in auto] == ["failed"]
    assert "elements differ" in auto[0]["message"]  # the scatter lands outside the blocks-first cache's blocks


def test_hnd_through_the_torch_baseline_and_the_absent_cuda_op_are_not_applicable_naming_lmcache(run):
    hnd = [r for r in run["tests"] if r["backend"] == "lmcache_torch:HND" and r["check"] in WIRE_CHECKS]
    cuda = [r for r in run["tests"] if r["backend"] == "lmcache:NHD" and r["check"] in WIRE_CHECKS]
    assert hnd and all(r["outcome"] == "not-applicable" and "HND layouts are not supported in the non-CUDA fallback" in r["message"] for r in hnd)
    assert cuda and all(r["outcome"] == "not-applicable" and "lmcache.cuda_ops does not import" in r["message"] for r in cuda)


def test_a_head_slice_is_not_applicable_never_passed(run):
    reshard = [r for r in run["tests"] if r["backend"].startswith("lmcache_torch") and r["check"] == "test_resharding_gives_every_consumer_rank_exactly_its_heads"]
    assert reshard and {r["outcome"] for r in reshard} == {"not-applicable"}


def test_only_the_two_block_detection_fails_and_it_is_expected(run):
    bad = sorted({(r["backend"], r["outcome"]) for r in run["tests"] if r["outcome"] not in ("passed", "not-applicable") and r["backend"] != "lmcache_wrong_format"})
    descriptor = {r["check"] for r in run["tests"] if r["outcome"] == "expected-failure"}
    assert bad == [("lmcache:NHD", "expected-failure"), ("lmcache_torch:HND", "expected-failure"), ("lmcache_torch:NHD", "expected-failure")]
    assert descriptor == {"test_layout_descriptor_describes_the_allocated_cache"}
