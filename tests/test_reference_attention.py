"""Paged decode attention read through a block table equals SDPA on the dense K/V."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

LAYOUTS = {k: v for k, v in R.named_layouts().items() if "L" not in v.k_dims}


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=st.data())
def test_paged_decode_attention_equals_sdpa(key, data):
    layout = LAYOUTS[key]
    g = R.Geometry(num_blocks=8, block_size=16, num_kv_heads=data.draw(st.sampled_from([1, 2])), head_size=32, dtype=torch.float32)
    seq_lens = data.draw(st.lists(st.integers(1, 40), min_size=1, max_size=3), label="seq_lens")
    group = data.draw(st.sampled_from([1, 3]), label="gqa group")
    blocks = torch.randperm(g.num_blocks, generator=torch.Generator().manual_seed(len(seq_lens)))
    table = torch.zeros(len(seq_lens), 3, dtype=torch.int64)
    # Random bytes: positions past a sequence must not leak NaN garbage into the output.
    storage = torch.randint(0, 256, (layout.nbytes(g),), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    dense, used = [], 0
    for s, length in enumerate(seq_lens):
        k, v = torch.randn(2, length, g.num_kv_heads, g.head_size).unbind(0)
        need = -(-length // g.block_size)
        table[s, :need] = blocks[used : used + need]
        used += need
        slots = table[s, torch.arange(length) // g.block_size] * g.block_size + torch.arange(length) % g.block_size
        R.reshape_and_cache(k, v, storage, layout, g, slots)
        dense.append((k, v))
    if used > g.num_blocks:
        return
    query = torch.randn(len(seq_lens), g.num_kv_heads * group, g.head_size)
    got = R.paged_decode_attention(query, storage, layout, g, table, seq_lens)
    for s, (k, v) in enumerate(dense):
        want = F.scaled_dot_product_attention(
            query[s][:, None], k.transpose(0, 1).repeat_interleave(group, 0), v.transpose(0, 1).repeat_interleave(group, 0)
        )[:, 0]
        torch.testing.assert_close(got[s], want, rtol=1e-5, atol=1e-5)
