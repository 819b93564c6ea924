"""Latent caches (SPEC §17) — block copies and swaps move whole blocks of every layer: every record
(the fp8_ds_mla scales and raw RoPE with the codes) and, in an indexer cache, the block's scales
region with its values region; nothing else changes on either side."""

import pytest
import torch

from kvconform import reference as R

from .harness.latent import (
    allocate,
    assert_inputs_unchanged,
    assert_latent_bytes_equal,
    filled,
    inputs_of,
    latent_spec,
    synchronize,
)

pytestmark = [pytest.mark.kvc_layouts("latent")]
MAPPING = [[1, 4], [5, 0], [3, 2]]  # the first and last blocks both ways; sources before and after destinations


def multi_layer_spec(case, fmt):
    return latent_spec(case, fmt, num_layers=max(case.backend.capabilities.latent.num_layers))


@pytest.mark.copy
@pytest.mark.kvc_clause("LATENT-BLOCK", "IDX-LAYOUT", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_op("latent_copy")
def test_copy_moves_whole_records_and_indexer_pages_of_every_layer(case, latent_format):
    spec = multi_layer_spec(case, latent_format.fmt)
    arena, _ = filled(case, spec, case.seed)
    expected = arena.snapshot()
    (mapping,), (pristine,) = inputs_of(case, torch.tensor(MAPPING))
    R.latent.copy_latent_blocks(expected.region, spec.geometry, pristine.clone())
    case.backend.latent_copy(arena.cache, mapping, spec)
    synchronize(case)
    assert_inputs_unchanged("copy", case, {"block_mapping": (pristine, mapping)})
    assert_latent_bytes_equal("copy", case, expected, arena, f"block mapping {MAPPING}, {spec.geometry.num_layers} layers")


@pytest.mark.swap
@pytest.mark.kvc_clause("LATENT-BLOCK", "IDX-LAYOUT", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_op("latent_swap")
@pytest.mark.parametrize("direction", ["out", "in"])
def test_swap_moves_whole_blocks_of_every_layer_between_device_and_host(case, latent_format, direction):
    spec = multi_layer_spec(case, latent_format.fmt)
    device, _ = filled(case, spec, case.seed)
    host = allocate(case, spec, host=True, seed_offset=1)
    src, dst = (device, host) if direction == "out" else (host, device)
    src_ids, dst_ids = torch.tensor([1, 5, 3]), torch.tensor([4, 0, 2])
    expected_src, expected_dst = src.snapshot(), dst.snapshot()
    R.latent.swap_latent_blocks(expected_src.region, spec.geometry, expected_dst.region, spec.geometry, src_ids, dst_ids)
    on = lambda arena, ids: ids.to(arena.buffer.device)
    handed = on(src, src_ids), on(dst, dst_ids)
    case.backend.latent_swap(src.cache, spec, dst.cache, spec, *handed)
    synchronize(case)
    assert_inputs_unchanged("swap", case, {"src_ids": (torch.tensor([1, 5, 3]), handed[0]), "dst_ids": (torch.tensor([4, 0, 2]), handed[1])})
    assert_latent_bytes_equal("swap", case, expected_dst, dst, f"swap {direction}: blocks {src_ids.tolist()} -> {dst_ids.tolist()}")
    assert_latent_bytes_equal("swap", case, expected_src, src, f"swap {direction}: the source must not change")
