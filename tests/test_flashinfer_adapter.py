"""The FlashInfer adapter's own translation, on the CPU: slot mappings into the page tables of
``append_paged_kv_cache``, block tables into the decode plan's, HND caches into FlashInfer's
physical order. FlashInfer itself runs on CUDA only; here a STAND-IN written from its code
(tests/flashinfer_stand_in.py) takes its place, so these tests check the adapter, never
FlashInfer (docs/REAL_KERNELS.md has the H200 run of the real thing)."""

from __future__ import annotations

import pytest
import torch

from kvconform import reference as R
from kvconform.backends_under_test import flashinfer_backend as fb
from kvconform.backends_under_test.contract import CacheSpec, OpUnavailable
from kvconform.backends_under_test.registry import load

from .flashinfer_stand_in import HND, NHD
from .suite_runs import KV_CHECKS, run_suite

N, H, D = 16, 3, 64  # pairwise distinct: a swapped axis cannot pass
G = R.Geometry(num_blocks=6, block_size=N, num_kv_heads=H, head_size=D, dtype=torch.bfloat16)
ADAPTERS = pytest.mark.parametrize("adapter", [NHD, HND], ids=["NHD", "HND"])


def spec_of(backend) -> CacheSpec:
    return CacheSpec(layout=backend.capabilities.layouts[0], geometry=G, model_dtype=G.dtype)


def rows(count: int, start: int) -> torch.Tensor:
    return (torch.arange(count * H * D).view(count, H, D) % 251 + start).to(torch.bfloat16)  # every element exact in bf16


def written_like_the_reference(backend, slots: torch.Tensor, key_rows: int) -> bool:
    """Write through the adapter and through the reference into two zeroed caches: equal bytes?"""
    spec = spec_of(backend)
    got, want = (torch.zeros(spec.layout.nbytes(G), dtype=torch.uint8) for _ in range(2))
    key, value = rows(key_rows, 1), rows(key_rows, -300)
    backend.write(backend.allocate(got, spec), key, value, slots, spec, k_scale=torch.ones(1), v_scale=torch.ones(1))
    R.reshape_and_cache(key, value, want, spec.layout, G, slots)
    return torch.equal(got, want)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA machine can load FlashInfer")
def test_without_a_cuda_gpu_the_backend_is_unavailable_with_the_reason():
    loaded = load("flashinfer:hnd")
    assert loaded.backend is None and "no CUDA GPU" in loaded.unavailable


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_a_slot_mapping_becomes_one_request_over_the_blocks_it_touches(slot_dtype):
    # Blocks 4, 2, 4 (slots out of order): pages [2, 4]; each token at page·N + its row.
    batch, positions, tables = fb.append_arguments(torch.tensor([4 * N + 7, 2 * N + 1, 4 * N], dtype=slot_dtype), N)
    assert tables.kv_indices.tolist() == [2, 4] and tables.kv_indptr.tolist() == [0, 2] and tables.kv_last_page_len.tolist() == [N]
    assert positions.tolist() == [N + 7, 1, N] and batch.tolist() == [0, 0, 0]
    # The mapping's dtype reaches FlashInfer, whose wrapper converts to int32 itself (page.py:153-157).
    assert {t.dtype for t in (batch, positions, *vars(tables).values())} == {slot_dtype}


@ADAPTERS
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_a_write_through_the_stand_in_lands_where_the_reference_puts_each_slot(adapter, slot_dtype):
    # Two key rows past the mapping: FlashInfer appends every row it gets, so the adapter must cut them.
    slots = torch.tensor([5 * N - 1, 2 * N, 3 * N + 9], dtype=slot_dtype)
    assert written_like_the_reference(adapter(), slots, key_rows=5)


@ADAPTERS
def test_a_page_table_off_by_one_is_caught(adapter, monkeypatch):
    translate = fb.append_arguments

    def off_by_one(slot_mapping, block_size):
        batch, positions, tables = translate(slot_mapping, block_size)
        return batch, positions, fb.PageTables(tables.kv_indptr, tables.kv_indices + 1, tables.kv_last_page_len)

    monkeypatch.setattr(fb, "append_arguments", off_by_one)
    assert not written_like_the_reference(adapter(), torch.tensor([2 * N + 3, 4 * N]), key_rows=2)


def test_a_padding_slot_is_not_applicable_for_that_input_and_writes_nothing():
    backend, spec = NHD(), spec_of(NHD())
    cache = torch.zeros(spec.layout.nbytes(G), dtype=torch.uint8)
    with pytest.raises(OpUnavailable, match="padding") as raised:
        backend.write(backend.allocate(cache, spec), rows(2, 1), rows(2, 1), torch.tensor([2 * N, -1]), spec, k_scale=torch.ones(1), v_scale=torch.ones(1))
    assert raised.value.this_input and not cache.any()


def test_a_block_table_becomes_vllms_flashinfer_page_tables():
    # A sequence of exactly 2N tokens has a full last page (N), not 0 (vllm flashinfer.py:1544-1549).
    tables = fb.decode_tables(torch.tensor([[5, 4, 7], [3, 2, 7]]), torch.tensor([N + 3, 2 * N]), N)
    assert tables.kv_indptr.tolist() == [0, 2, 4] and tables.kv_indices.tolist() == [5, 4, 3, 2]
    assert tables.kv_last_page_len.tolist() == [3, N]


def test_an_hnd_cache_reaches_flashinfer_as_pages_2_heads_rows_dims():
    spec = spec_of(HND())
    cache = HND().allocate(torch.zeros(spec.layout.nbytes(G), dtype=torch.uint8), spec)
    physical = fb.kernel_cache(cache, "HND")
    assert physical.shape == (6, 2, H, N, D) and physical.is_contiguous()


def decode_error(backend, seq_lens: list[int]) -> float:
    """Largest difference between the adapter's decode (through the stand-in) and the reference
    attention, over sequences written by the reference into blocks 5, 4 | 3, 2."""
    spec = spec_of(backend)
    storage = torch.zeros(spec.layout.nbytes(G), dtype=torch.uint8)
    table = torch.tensor([[5, 4], [3, 2]])
    for s, length in enumerate(seq_lens):
        slots = table[s, torch.arange(length) // N] * N + torch.arange(length) % N
        R.reshape_and_cache(rows(length, s) / 64, rows(length, 7 * s) / 64, storage, spec.layout, G, slots)
    query = (torch.arange(2 * 2 * H * D).view(2, 2 * H, D) % 97 / 256).to(torch.bfloat16)  # two query heads per KV head
    kwargs = dict(scale=D ** -0.5, k_scale=torch.ones(1), v_scale=torch.ones(1))
    got = backend.decode(backend.allocate(storage, spec), query, table, torch.tensor(seq_lens), spec, **kwargs)
    want = R.paged_decode_attention(query, storage, spec.layout, G, table, torch.tensor(seq_lens), **kwargs)
    return float((got.float() - want.float()).abs().max())


@ADAPTERS
def test_a_decode_through_the_stand_in_equals_the_reference_attention(adapter):
    # One sequence fills its last page exactly (2N), one does not (N + 5).
    assert decode_error(adapter(), [2 * N, N + 5]) < 2e-2


def test_a_last_page_length_of_zero_for_a_full_page_is_caught(monkeypatch):
    translate = fb.decode_tables

    def without_vllms_full_page_rule(block_table, seq_lens, block_size):
        tables = translate(block_table, seq_lens, block_size)
        return fb.PageTables(tables.kv_indptr, tables.kv_indices, (seq_lens % block_size).to(torch.int32))

    monkeypatch.setattr(fb, "decode_tables", without_vllms_full_page_rule)
    assert decode_error(NHD(), [2 * N, N + 5]) > 0.1


def test_the_suite_sends_a_backend_without_padding_slots_every_write_check_but_the_padding_one(tmp_path):
    """FlashInfer declares no padding slot: the padding check is not applicable by declaration,
    and every other write check, and the bf16/fp16 golden digests, run with mappings free of -1
    instead of being lost to an incidental one (conformance/harness/ops.py declared_slots)."""
    backend = "tests.flashinfer_stand_in:NHD"
    result = run_suite(tmp_path, "--kvc-backend", backend, "-m", "write or equivalence", "-k", f"not exported_run and not fp8 and {KV_CHECKS}")
    outcomes = {(r["check"], r["outcome"]) for r in result.records}
    assert ("test_padding_slots_leave_cache_untouched", "not-applicable") in outcomes
    assert {o for c, o in outcomes if c != "test_padding_slots_leave_cache_untouched"} == {"passed"}, result.output
    assert len({c for c, _ in outcomes}) >= 9
