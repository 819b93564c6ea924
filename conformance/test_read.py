"""Check 7 — the backend's paged decode attention over its own cache equals SDPA on the
dense K/V that the cache holds (read side; tolerance per model dtype)."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from .assertions import assert_close
from .harness import FP8_KV_CACHE_DTYPES, token_rows
from .strategies import scales, specs

pytestmark = [pytest.mark.read, pytest.mark.kvc_op("decode")]

TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}


@given(data=st.data())
def test_paged_decode_equals_sdpa_on_the_dense_kv(case, data):
    spec = data.draw(specs(case, num_blocks=(6, 8)))
    seq_lens = data.draw(st.lists(st.integers(1, 2 * spec.geometry.block_size), min_size=1, max_size=2), label="seq_lens")
    group = data.draw(st.sampled_from([1, 2]), label="query heads per kv head")
    decode_and_compare(case, spec, seq_lens, group, *data.draw(scales(case, spec.geometry)))


@pytest.mark.kvc_needs("fp8")
@given(data=st.data())
def test_fp8_decode_dequantizes_k_and_v_with_their_own_scales(case, data):
    spec = data.draw(specs(case, FP8_KV_CACHE_DTYPES, num_blocks=(6, 8)))
    decode_and_compare(case, spec, [spec.geometry.block_size + 3, 5], 2, torch.tensor([0.5]), torch.tensor([2.0]))


def decode_and_compare(case, spec, seq_lens, group, k_scale, v_scale):
    g = spec.geometry
    table = torch.arange(2, 6).flip(0).view(2, 2)[: len(seq_lens)]  # blocks ≥ 2, reversed
    arena = case.allocate(spec)
    dense = []
    for s, length in enumerate(seq_lens):
        key, value = token_rows(spec, length, case.seed + s, magnitude=1.0)
        slots = table[s, torch.arange(length) // g.block_size] * g.block_size + torch.arange(length) % g.block_size
        R.reshape_and_cache(key, value, arena.region, spec.layout, g, slots, k_scale=k_scale, v_scale=v_scale)
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
