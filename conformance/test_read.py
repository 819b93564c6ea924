"""Check 7 — the backend's paged decode attention over its own cache equals SDPA on the
dense K/V that the cache holds (read side; tolerance per model dtype; SPEC §8 READ-*)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from .harness.assertions import assert_close
from .harness.big_caches import probe_arena, probe_geometry
from .harness.exercised import note_blocks
from .harness.case import fixed_scales, token_rows
from .harness.strategies import scales, specs

pytestmark = [pytest.mark.read, pytest.mark.kvc_op("decode")]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@pytest.mark.kvc_clause("READ-DECODE", "READ-FP8-DEQUANT", "OP-INPUTS-UNCHANGED")
@given(data=st.data())
def test_paged_decode_equals_sdpa_on_the_dense_kv(case, data):
    spec = data.draw(specs(case, num_blocks=(6, 8)))
    seq_lens = data.draw(st.lists(st.integers(1, 2 * spec.geometry.block_size), min_size=1, max_size=2), label="seq_lens")
    group = data.draw(st.sampled_from([1, 2]), label="query heads per kv head")
    decode_and_compare(case, spec, seq_lens, group, *data.draw(scales(case, spec.geometry)))


@pytest.mark.kvc_clause("READ-DECODE", "READ-FP8-DEQUANT")
def test_decode_of_each_declared_cache_dtype_equals_sdpa(case, cache_dtype):
    # Unequal scales: an fp8 cache must dequantise K with k_scale and V with v_scale.
    spec = case.spec_for(cache_dtype)
    decode_and_compare(case, spec, [spec.geometry.block_size + 3], 1, *fixed_scales())


@pytest.mark.kvc_clause("READ-DECODE", "READ-LAYER")
def test_decode_of_each_declared_size_class_equals_sdpa(case, size_class):
    g = case.geometry(**size_class.kwargs())
    spec = case.spec(g, layer=g.num_layers - 1)  # the last layer of a multi-layer cache
    decode_and_compare(case, spec, [g.block_size + 3], 1, torch.ones(1), torch.ones(1))


@pytest.mark.kvc_clause("READ-DECODE", "ADDR-64BIT", "ADDR-BLOCK-ID")
@pytest.mark.kvc_needs("memory_2_31")
def test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements(case):
    g, kv_cache_dtype = probe_geometry(case)
    spec = case.spec(g, kv_cache_dtype)
    last = g.num_blocks - 1
    table = torch.tensor([[last, last - 1]])
    decode_and_compare(case, spec, [g.block_size + 3], 1, *fixed_scales(), table=table, arena=probe_arena(case, spec))


def decode_and_compare(case, spec, seq_lens, group, k_scale, v_scale, *, table=None, arena=None):
    """Write sequences with the reference (blocks from ``table``: by default 5, 4 | 3, 2), decode
    them with the backend, compare with SDPA on the values the cache holds."""
    g = spec.geometry
    table = torch.arange(2, 6).flip(0).view(2, 2)[: len(seq_lens)] if table is None else table
    arena = arena or case.allocate(spec)
    dense = []
    for s, length in enumerate(seq_lens):
        key, value = token_rows(spec, length, case.seed + s, magnitude=1.0)
        blocks = table[s, torch.arange(length) // g.block_size]
        slots = blocks * g.block_size + torch.arange(length) % g.block_size
        R.reshape_and_cache(key, value, arena.region, spec.layout, g, slots, k_scale=k_scale, v_scale=v_scale, layer=spec.layer)
        note_blocks(case, spec, blocks.unique(), layer=spec.layer)
        dense.append([R.ops.stored_values(t, g, sc, 1) for t, sc in ((key, k_scale), (value, v_scale))])
    query = torch.randn(len(seq_lens), g.num_kv_heads * group, g.head_size, generator=torch.Generator().manual_seed(case.seed)).to(spec.model_dtype)
    got = case.backend.decode(
        arena.cache, query.to(case.device), table.to(case.device), torch.tensor(seq_lens, device=case.device), spec,
        scale=g.head_size ** -0.5, k_scale=k_scale.to(case.device), v_scale=v_scale.to(case.device),
    )
    want = torch.stack([
        F.scaled_dot_product_attention(query[s].float()[:, None], k.transpose(0, 1).repeat_interleave(group, 0), v.transpose(0, 1).repeat_interleave(group, 0))[:, 0]
        for s, (k, v) in enumerate(dense)
    ])
    tol = TOLERANCE[spec.model_dtype]
    assert_close("read", case, want, got, atol=tol, rtol=tol, dims=("seq", "query_head", "dim"))
