"""Latent caches (SPEC §17) — equivalence: fixed inputs written into a zeroed cache of each declared
record format hash to the golden digest of that format, whatever the machine (one digest per label:
the e4m3 variant and, for fp8_ds_mla and the indexer, the scale divisor follow the platform)."""

import pytest
import torch
from kvconform.backends_under_test.latent_contract import LatentSpec

from .harness.applicability import undeclared
from .harness.latent import (
    LatentArena,
    allocate,
    assert_facts_equal,
    assert_latent_bytes_equal,
    default_scale,
    run_write,
)
from .harness.latent_digests import (
    BLOCK_SIZE,
    BLOCKS,
    digest,
    golden_geometry,
    golden_inputs,
    load,
    reference_bytes,
)

pytestmark = [pytest.mark.equivalence, pytest.mark.kvc_layouts("latent")]


@pytest.mark.kvc_clause("EQUIV-CROSS-MACHINE", "DSMLA-RECORD", "DSMLA-SCALE", "MLA-WRITE-FP8", "IDX-WRITE")
def test_golden_records_hash_to_the_stored_digest_of_their_format(case, latent_format):
    fmt, golden = latent_format.fmt, load()
    if fmt.label() not in golden or BLOCK_SIZE not in case.backend.capabilities.latent.block_sizes:
        raise undeclared(case.backend, f"declares {fmt.label()} at block sizes {case.backend.capabilities.latent.block_sizes}: no golden digest of it at N={BLOCK_SIZE}")
    spec = LatentSpec(geometry=golden_geometry(fmt))
    arena = allocate(case, spec, zero=True)
    rows, slots = golden_inputs(fmt)
    run_write(case, arena, rows, slots, default_scale(fmt))
    got = digest(arena.region)
    if got != golden[fmt.label()]:  # name the differing bytes against the reference's golden cache
        expected = LatentArena(torch.zeros_like(arena.buffer.cpu()), spec)
        expected.region.copy_(reference_bytes(fmt))
        assert_facts_equal("equivalence", case, golden[fmt.label()], digest(expected.region), f"the reference's own golden digest of {fmt.label()} (a suite fault)")
        assert_latent_bytes_equal("equivalence", case, expected, arena, f"golden write of {fmt.label()}, B{BLOCKS} N{BLOCK_SIZE}: sha256 {got[:16]}…, golden {golden[fmt.label()][:16]}…")
    assert_facts_equal("equivalence", case, golden[fmt.label()], got, f"sha256 of the golden {fmt.label()} cache")
