"""Latent caches (SPEC §17) — shape: each cache is rows of its own record (the plain MLA entry, the
656-byte fp8_ds_mla record, the indexer's values-then-scales block), layers first in a multi-layer
allocation, and every block size the backend declares is one its ops accept (a configuration the
cache binding rejects is refused at declaration, never at run time)."""

import pytest
import torch

from .harness.latent import (
    allocate,
    assert_facts_equal,
    assert_latent_bytes_equal,
    attempt,
    declared_op,
    default_scale,
    latent_rows,
    latent_spec,
    run_write,
    slots_of,
)

pytestmark = [pytest.mark.shape, pytest.mark.kvc_layouts("latent")]


def assert_cache_is_rows_of_its_record(case, arena):
    spec, cache = arena.spec, arena.cache
    fmt = spec.fmt
    assert_facts_equal("shape", case, spec.geometry.shape(), tuple(cache.shape), f"cache.shape of {spec.geometry.short()}")
    assert_facts_equal("shape", case, fmt.storage_dtype(), cache.dtype, "cache.dtype")
    assert_facts_equal("shape", case, fmt.entry_bytes(), cache.shape[-1] * cache.element_size(), "bytes per row (the record width)")
    assert_facts_equal("shape", case, torch.empty(cache.shape).stride(), cache.stride(), "cache.stride() (rows packed, blocks contiguous)")
    assert_facts_equal("shape", case, 0, cache.data_ptr() - arena.region.data_ptr(), "cache.data_ptr() - buffer start, bytes")


@pytest.mark.kvc_clause("MLA-SHAPE", "DSMLA-RECORD", "IDX-LAYOUT")
def test_latent_cache_rows_are_as_wide_as_their_own_record(case, latent_format):
    arena = allocate(case, latent_spec(case, latent_format.fmt))
    assert_cache_is_rows_of_its_record(case, arena)


@pytest.mark.kvc_clause("MLA-SHAPE", "LATENT-LAYERS")
@pytest.mark.kvc_needs("latent_multi_layer")
def test_a_multi_layer_allocation_puts_the_layer_dim_first(case, latent_format):
    layers = max(case.backend.capabilities.latent.num_layers)
    arena = allocate(case, latent_spec(case, latent_format.fmt, num_blocks=4, num_layers=layers))
    assert_cache_is_rows_of_its_record(case, arena)


@pytest.mark.kvc_clause("LATENT-DECLARE", "MLA-WRITE-SLOT")
def test_every_declared_block_size_is_accepted_by_the_writer(case, latent_format):
    fmt = latent_format.fmt
    declared_op(case, fmt, "write")
    for block_size in case.backend.capabilities.latent.block_sizes:
        spec = latent_spec(case, fmt, num_blocks=3, block_size=block_size)
        rows = latent_rows(fmt, 2, case.seed)
        slots = slots_of(spec, [(2, block_size - 1), (0, 0)])
        arena = allocate(case, spec)
        initial = arena.snapshot()
        expected, refused = attempt(lambda: run_write(case, arena, rows, slots, default_scale(fmt)))  # noqa: B023 - called at once
        assert_facts_equal("shape", case, None, refused and f"{type(refused).__name__}: {refused}",
                           f"the writer on declared block size {block_size} ({fmt.label()}): a declared configuration must not be rejected at run time")
        assert_latent_bytes_equal("shape", case, expected, arena, f"block size {block_size}", initial=initial)
