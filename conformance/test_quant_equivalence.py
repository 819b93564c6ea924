"""Quantised caches (SPEC §16, §16.1) — equivalence: fixed inputs written into a zeroed cache of each
declared mode and order hash to the golden digest of that label, whatever the machine (one digest
per label: for fp8_per_token_head the e4m3 variant, and so the bound, follow the platform)."""

import pytest
import torch

from kvconform.reference import quant_layouts as QL

from .harness import quant as Q
from .harness.applicability import undeclared
from .harness.case import GUARD
from .harness.latent import assert_facts_equal
from .harness.quant_digests import BLOCK_SIZE, HEAD_SIZE, HEADS, digest, golden_inputs, golden_spec, label, load, reference_bytes, written_pages

pytestmark = [pytest.mark.equivalence, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize(("mode", "v_scales"), Q.VARIANTS, ids=Q.VARIANT_IDS)]


@pytest.mark.kvc_clause("EQUIV-CROSS-MACHINE", "PTH-EQUIV", "PTH-LAYOUT", "PTH-SCALE-PLACE", "PTH-ENCODE-INT8", "PTH-ENCODE-FP8",
                        "NVFP4-PAGE", "NVFP4-SWIZZLE", "NVFP4-SCALE-PLACEMENT", "NVFP4-E2M1", "NVFP4-SCALE")
def test_golden_pages_hash_to_the_stored_digest_of_their_mode(case, mode, v_scales, order):
    caps, backend, platform = Q.declared(case, "quant_write", mode, order, v_scales), case.backend, Q.platform_of(case)
    name, golden = label(mode, order, **platform, v_scales=v_scales), load()
    if name not in golden or BLOCK_SIZE not in caps.block_sizes or HEAD_SIZE not in caps.head_sizes or HEADS not in caps.num_kv_heads:
        raise undeclared(backend, f"declares block sizes {caps.block_sizes}, head sizes {caps.head_sizes}, {caps.num_kv_heads} KV heads: "
                                  f"no golden digest of {name} at N{BLOCK_SIZE} D{HEAD_SIZE} H{HEADS}")
    spec = golden_spec(mode, order, v_scales)
    arena = Q.QuantArena(torch.zeros(2 * GUARD + spec.geometry.nbytes(), dtype=torch.uint8, device=case.device), spec)
    arena.cache = backend.quant_allocate(arena.region, spec)
    key, value, slots = golden_inputs(mode)
    backend.quant_write(arena.cache, key.to(case.device), value.to(case.device), slots.to(case.device), spec)
    got = digest(written_pages(arena.region, spec.geometry))
    if got != golden[name]:  # name the differing bytes against the reference's golden pages
        expected = arena.snapshot()
        reference = written_pages(reference_bytes(mode, order, **platform, v_scales=v_scales), spec.geometry)
        written_pages(Q.region_of(expected, spec.geometry), spec.geometry).copy_(reference)
        assert_facts_equal("equivalence", case, golden[name], digest(reference), f"the reference's own golden digest of {name} (a suite fault)")
        Q.assert_arena_equal("equivalence", case, expected, arena, f"golden write of {name}, blocks 2-4: sha256 {got[:16]}…, golden {golden[name][:16]}…")
    assert_facts_equal("equivalence", case, golden[name], got, f"sha256 of the golden {name} pages")
