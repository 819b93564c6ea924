"""Per-token-head quantised caches, read side: the backend's paged decode over its own quantised
cache equals SDPA on the K/V that reference/quant_codecs.py dequantises from the same bytes
(``code · scale`` of each (token, head) and side; SPEC §16 PTH-READ; nvfp4: e2m1 · block scale ·
k_scale, NVFP4-READ)."""

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from .harness import quant as Q
from .harness.assertions import assert_close

pytestmark = [pytest.mark.read, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize(("mode", "v_scales"), Q.VARIANTS, ids=Q.VARIANT_IDS)]
TOLERANCE = 2e-2  # bf16 output


@pytest.mark.kvc_clause("PTH-READ", "NVFP4-READ")
@pytest.mark.parametrize("group", [1, 2], ids=["mha", "gqa"])
def test_decode_equals_sdpa_on_the_reference_dequantised_kv(case, mode, v_scales, order, group):
    spec = Q.quant_spec(case, "quant_decode", mode, order, v_scales, num_blocks=6)
    g, N = spec.geometry, spec.geometry.block_size
    block_table = torch.tensor([[4, 1, 5], [2, 0, 3]])
    seq_lens = torch.tensor([2 * N + 3, N - 1])
    slots = torch.cat([block_table[s, torch.arange(n) // N] * N + torch.arange(n) % N for s, n in enumerate(seq_lens.tolist())])
    key, value = Q.token_rows(spec, len(slots), case.seed)
    value = value * torch.linspace(0.1, 4.0, g.num_kv_heads)[:, None].to(value.dtype)  # V's scales differ from K's
    arena, expected = Q.write_and_compare(case, spec, key, value, slots)
    query = torch.randn(2, g.num_kv_heads * group, g.head_size, generator=torch.Generator().manual_seed(case.seed)).to(spec.model_dtype)
    scale = g.head_size ** -0.5
    want = QC.paged_decode(query, Q.region_of(expected, g), g, block_table, seq_lens, scale=scale, k_scale=spec.k_scale, v_scale=spec.v_scale,
                           **Q.platform_of(case))
    got = case.backend.quant_decode(arena.cache, query.to(case.device), block_table.to(case.device), seq_lens.to(case.device), spec, scale=scale)
    assert_close("quant decode", case, want.float(), got.float().cpu(), atol=TOLERANCE, rtol=TOLERANCE, dims=("seq", "qhead", "dim"))
