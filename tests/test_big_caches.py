"""The large-cache probes compare lazily mapped arenas exactly: a byte changed anywhere is found
by the touched-pages comparison, and the fp8 comparison accepts any NaN code for a NaN
(SPEC FP8-NAN) but nothing else."""

import json
import subprocess
import sys
import types

import pytest
import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.conformance.harness.assertions import ConformanceFailure, assert_bytes_equal
from kvconform.conformance.harness import big_caches
from kvconform.conformance.harness.big_caches import (PAGE, LazyArena, PinnedArena, PinnedArenas, assert_arenas_equal, expected_arena,
                                                      lazy_zeros, nonzero_pages, touched_pages)
from kvconform.conformance.plugin.collection import suite_command
from kvconform.conformance.harness.case import GUARD, Arena
from kvconform.conformance.harness.facts import TestFacts

from .suite_runs import ROOT

CASE = types.SimpleNamespace(layout=None, repro="repro-line", device=None, facts=TestFacts())


def lazy_arena(spec: CacheSpec) -> LazyArena:
    return LazyArena(lazy_zeros(2 * GUARD + spec.layout.nbytes(spec.geometry)), spec)


def spec_of(num_blocks: int, dtype=torch.float8_e4m3fn) -> CacheSpec:
    g = R.Geometry(num_blocks=num_blocks, block_size=16, num_kv_heads=1, head_size=16, dtype=dtype)
    return CacheSpec(layout=R.blocks_first("NHD"), geometry=g, kv_cache_dtype="fp8")


def test_touched_pages_are_the_pages_written_and_only_those():
    buffer = lazy_zeros(64 * PAGE)
    buffer[5 * PAGE + 3] = 1
    buffer[40 * PAGE] = 2
    assert touched_pages(buffer).tolist() == [5, 40]


def test_a_lazy_arena_is_a_private_mapping_whose_read_pages_count_as_touched():
    buffer = lazy_zeros(64 * PAGE)
    assert int(buffer[9 * PAGE : 11 * PAGE].sum()) == 0  # read, never written
    start = buffer.data_ptr()
    with open("/proc/self/maps") as maps:  # "rw-p": private (a shared one is backed by a shmem file)
        perms = next(line.split()[1] for line in maps if int(line.split("-")[0], 16) <= start < int(line.split()[0].split("-")[1], 16))
    assert perms == "rw-p"
    assert touched_pages(buffer).tolist() == [9, 10]


def test_a_stray_byte_far_from_every_written_row_is_found():
    spec = spec_of(num_blocks=1 << 14)  # 8 MiB: many pages nobody writes
    actual, expected = lazy_arena(spec), lazy_arena(spec)
    for arena in (actual, expected):
        arena.region[100] = 7
    actual.region[spec.layout.nbytes(spec.geometry) // 2 + 11] = 9
    with pytest.raises(ConformanceFailure) as failure:
        assert_arenas_equal("write", CASE, expected, actual, "stray byte")
    assert failure.value.details["differing_elements"] == 1
    assert "block=8192" in failure.value.details["mismatches"][0]["where"]


def test_identical_lazy_arenas_compare_equal():
    spec = spec_of(num_blocks=1 << 12)
    actual, expected = lazy_arena(spec), lazy_arena(spec)
    for arena in (actual, expected):
        arena.region[-1] = 5
    assert_arenas_equal("write", CASE, expected, actual)


@pytest.mark.parametrize("code, equal", [(0xFF, True), (0x7F, True), (0x7E, False)], ids=["negative-nan", "same-nan", "max-for-nan"])
def test_any_nan_code_stands_for_a_nan_and_a_finite_code_does_not(code, equal):
    spec = spec_of(num_blocks=4)
    buffer = torch.zeros(2 * GUARD + spec.layout.nbytes(spec.geometry), dtype=torch.uint8)
    expected, actual = Arena(buffer, spec), Arena(buffer.clone(), spec)
    expected.region[33] = 0x7F
    actual.region[33] = code
    if equal:
        assert_bytes_equal("write", CASE, expected, actual)
    else:
        with pytest.raises(ConformanceFailure):
            assert_bytes_equal("write", CASE, expected, actual)


def test_a_failed_probe_costs_no_more_memory_than_a_passing_one(tmp_path):
    """pytest renders a failure's frames with their arguments; a multi-GiB cache among them cost
    8.7 GiB of RSS for this mutant's two failing copy probes before the frames were cleared."""
    out = tmp_path / "results.json"
    cmd = suite_command("--kvc-json", str(out), "--kvc-backend", "mutant:copy_blocks_one_plane", "-k", "copy_blocks_of_the_last", "-p", "no:cacheprovider")
    measure = "import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True); print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    peak_kib = int(subprocess.run([sys.executable, "-c", measure, *cmd], cwd=ROOT, capture_output=True, text=True, timeout=600).stdout)
    assert {r["outcome"] for r in json.loads(out.read_text())["tests"]} == {"failed"}
    assert peak_kib < 2 << 20, f"peak RSS {peak_kib >> 10} MiB"


# ----------------------------------------------------------------------------- the pinned host arena (GPU machines)
class FakeCudart:
    """Stands in for torch.cuda.cudart() on a machine without CUDA: registers nothing, says so."""

    def __init__(self):
        self.registered = []

    def cudaHostRegister(self, ptr, size, flags):  # noqa: N802 - CUDA's name
        self.registered.append((ptr, size, flags))
        return 0

    def cudaHostUnregister(self, ptr):  # noqa: N802
        self.registered = [r for r in self.registered if r[0] != ptr]
        return 0


@pytest.fixture
def cudart(monkeypatch):
    fake = FakeCudart()
    monkeypatch.setattr(torch.cuda, "cudart", lambda: fake)
    return fake


def test_nonzero_pages_are_the_pages_holding_a_byte_other_than_zero():
    buffer = torch.zeros(9 * PAGE + 5, dtype=torch.uint8)  # a last page shorter than the others
    buffer[2 * PAGE + 7] = 1
    buffer[9 * PAGE + 4] = 3
    big_caches.SCAN_BYTES, saved = 4 * PAGE, big_caches.SCAN_BYTES  # several pieces
    try:
        assert nonzero_pages(buffer, None).tolist() == [2, 9]
    finally:
        big_caches.SCAN_BYTES = saved


def test_the_pinned_arena_is_registered_once_and_zero_again_for_every_probe(cudart):
    arenas = PinnedArenas()
    first = arenas.take(6 * PAGE, None)
    assert len(cudart.registered) == 1 and cudart.registered[0][1:] == (6 * PAGE, PinnedArenas.PORTABLE_AND_MAPPED)
    first[PAGE + 3] = 9
    first[5 * PAGE] = 4
    again = arenas.take(4 * PAGE, None)  # smaller: the same buffer, zero again everywhere
    assert again.data_ptr() == first.data_ptr() and len(cudart.registered) == 1
    assert int(arenas.buffer.count_nonzero()) == 0
    grown = arenas.take(8 * PAGE, None)  # larger: registered anew, the old one unregistered
    assert len(cudart.registered) == 1 and cudart.registered[0][1] == 8 * PAGE and int(grown.count_nonzero()) == 0


def test_a_stray_byte_in_the_pinned_arena_is_found_wherever_it_is(cudart):
    spec = spec_of(num_blocks=1 << 14)
    nbytes = 2 * GUARD + spec.layout.nbytes(spec.geometry)
    actual = PinnedArena(PinnedArenas().take(nbytes, None), spec)
    expected = expected_arena(actual)
    assert isinstance(expected, LazyArena)
    for arena in (actual, expected):
        arena.region[100] = 7
    assert_arenas_equal("swap", CASE, expected, actual)
    actual.region[spec.layout.nbytes(spec.geometry) - 1] = 2  # the last byte of the cache: no page of the reference's
    with pytest.raises(ConformanceFailure) as failure:
        assert_arenas_equal("swap", CASE, expected, actual, "stray byte")
    assert failure.value.details["differing_elements"] == 1
    assert f"block={spec.geometry.num_blocks - 1}" in failure.value.details["mismatches"][0]["where"]
