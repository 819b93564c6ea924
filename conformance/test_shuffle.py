"""Check 4 — the AITER shuffled writer puts K in ``[H, D/x, N, x]`` and V in ``[H, N/x, D, x]``
tiles at each side's block base, honouring the K and V block strides of a blocks-first cache
(2× the plane), with x from the *cache* dtype (16 for fp8), touching nothing else
(SPEC §6 SHUFFLE-*, LAYOUT-SHUFFLE*; pitfalls F.5, F.7)."""

import pytest
import torch

from .harness.case import FP8_KV_CACHE_DTYPES, fixed_scales, token_rows
from .harness.ops import write_and_compare
from .harness.strategies import geometry_choices

pytestmark = [pytest.mark.shuffle, pytest.mark.kvc_op("write"), pytest.mark.kvc_layouts("tiled")]


def shuffled_write(case, spec, key, value, slots, note):
    write_and_compare(case, "shuffle", spec, key, value, slots, *fixed_scales(), note)


def last_rows_of_every_block(g):
    """Slot N-1 of every block ≥ 2 and slot 0 of block 2: the tile's corners."""
    return torch.tensor([b * g.block_size + g.block_size - 1 for b in range(2, g.num_blocks)] + [2 * g.block_size])


@pytest.mark.kvc_clause("SHUFFLE-TILES", "LAYOUT-SHUFFLE", "LAYOUT-SHUFFLE-BASE", "LAYOUT-SHUFFLE-X", "LAYOUT-LEGACY")
def test_shuffled_tiles_stay_inside_their_block_and_side(case, cache_dtype):
    spec = case.spec_for(cache_dtype)
    slots = last_rows_of_every_block(spec.geometry)
    key, value = token_rows(spec, len(slots), case.seed)
    shuffled_write(case, spec, key, value, slots, "last row of every block")


@pytest.mark.kvc_clause("SHUFFLE-TILES", "LAYOUT-SHUFFLE")
def test_v_is_written_in_the_v_tile_not_the_k_tile(case):
    spec = case.spec(case.geometry())
    key, _ = token_rows(spec, 7, case.seed)
    slots = torch.arange(7) * 3 + 2 * spec.geometry.block_size + 1
    shuffled_write(case, spec, key, key.clone(), slots, "identical K and V data")


@pytest.mark.kvc_clause("LAYOUT-SHUFFLE-X", "SHUFFLE-TILES")
@pytest.mark.kvc_needs("fp8")
def test_fp8_tiles_use_x_from_the_cache_dtype(case):
    choices = geometry_choices(case, FP8_KV_CACHE_DTYPES)
    if not choices:
        pytest.fail("backend declares fp8 but no fp8 geometry its tiled layout can hold")
    model_dtype, kv_cache_dtype, g = choices[0]
    spec = case.spec(g, kv_cache_dtype, model_dtype)
    key, value = token_rows(spec, 6, case.seed)
    slots = torch.arange(6) * 5 + 2 * g.block_size
    shuffled_write(case, spec, key, value, slots, f"fp8 cache: x = 16 // {g.element_size} = {g.x}")


def prefill_run(case, kv_cache_dtype):
    spec = case.spec(case.geometry(kv_cache_dtype=kv_cache_dtype, num_blocks=8), kv_cache_dtype)
    N = spec.geometry.block_size
    aligned = torch.arange(2 * N, 5 * N)  # whole x-groups of three blocks
    unaligned = torch.arange(5 * N + 3, 7 * N - 1)  # a run that starts and ends mid-group
    slots = torch.cat([aligned, unaligned])
    key, value = token_rows(spec, len(slots), case.seed)
    shuffled_write(case, spec, key, value, slots, f"consecutive (prefill) slots, {kv_cache_dtype}")


@pytest.mark.kvc_clause("SHUFFLE-PREFILL")
def test_a_prefill_run_of_consecutive_slots_is_written_like_scattered_ones(case):
    prefill_run(case, "auto")


@pytest.mark.kvc_clause("SHUFFLE-PREFILL", "LAYOUT-SHUFFLE-X")
@pytest.mark.kvc_needs("fp8")
def test_an_fp8_prefill_run_is_written_like_scattered_ones(case):
    prefill_run(case, next(d for d in case.backend.capabilities.kv_cache_dtypes if d in FP8_KV_CACHE_DTYPES))
