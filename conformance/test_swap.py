"""Check 5 — ``swap_out_blocks_to_host`` / ``insert_blocks_to_device`` copy whole blocks along
the block dim: each block lands at its host slot (checked per block, not just by round trip:
pitfall F.1), comes back into other device blocks, and nothing else moves (SPEC §7 SWAP-*)."""

import pytest
import torch

from kvconform import reference as R

from .harness.assertions import assert_bytes_equal, assert_true
from .harness.big_caches import assert_arenas_equal, expected_arena, probe_arena, probe_geometry
from .harness.exercised import note_blocks
from .harness.case import block_ids, token_rows
from .harness.ops import synchronize

pytestmark = [pytest.mark.swap, pytest.mark.kvc_op("swap")]


def swap_out(case, spec, src_ids, dst_ids):
    device = case.allocate(spec)
    host = case.allocate(spec, host=True, seed_offset=1)
    before, expected = host.snapshot(), host.snapshot()
    R.swap_out_blocks_to_host(device.region.cpu(), expected.region, spec.layout, spec.geometry, src_ids, dst_ids)
    note_blocks(case, spec, torch.cat([src_ids, dst_ids]))
    case.backend.swap_out(device.cache, host.cache, src_ids.to(case.device), dst_ids, spec)
    return device, host, expected, before


@pytest.mark.kvc_clause("SWAP-DIM0", "SWAP-INTACT", "OP-INPUTS-UNCHANGED")
def test_swap_out_places_each_block_at_its_host_slot(case, cache_dtype):
    spec = case.spec_for(cache_dtype, num_blocks=7)
    src, dst = block_ids(spec.geometry, 3, case.seed), block_ids(spec.geometry, 3, case.seed + 1)
    _, host, expected, before = swap_out(case, spec, src, dst)
    assert_bytes_equal("swap", case, expected, host, f"swap_out {src.tolist()} -> host {dst.tolist()}, {cache_dtype.label}", initial=before)


@pytest.mark.kvc_clause("SWAP-INTACT", "SWAP-DIM0")
def test_swap_in_restores_blocks_into_other_device_blocks(case):
    spec = case.spec(case.geometry(num_blocks=8))
    src = block_ids(spec.geometry, 3, case.seed)
    parked = block_ids(spec.geometry, 3, case.seed + 1)
    back = torch.tensor([b for b in range(2, 8) if b not in src.tolist()][:3])
    device, host, _, _ = swap_out(case, spec, src, parked)
    before, expected = device.snapshot(), device.snapshot()
    R.insert_blocks_to_device(host.region.cpu(), expected.region, spec.layout, spec.geometry, parked, back)
    case.backend.swap_in(host.cache, device.cache, parked, back.to(case.device), spec)
    assert_bytes_equal("swap", case, expected, device, f"insert host {parked.tolist()} -> device {back.tolist()}", initial=before)


@pytest.mark.kvc_clause("SWAP-DIM0")
def test_swap_of_blocks_0_and_1_moves_blocks_not_planes(case):
    spec = case.spec(case.geometry(num_blocks=5))
    src, dst = torch.tensor([1, 0]), torch.tensor([0, 1])
    _, host, expected, before = swap_out(case, spec, src, dst)
    # Block ids 0 and 1 because, on a kv-first cache, an index into dim 0 picks the K or V plane.
    # The note says what the backend was asked to do; the diagnosis, what it did (#23 item 7).
    assert_bytes_equal("swap", case, expected, host, f"swap_out {src.tolist()} -> host {dst.tolist()}", initial=before)


@pytest.mark.kvc_clause("BLOCK-ALL-LAYERS", "SWAP-DIM0", "LAYOUT-E3-LAYERS")
@pytest.mark.kvc_needs("multi_layer")
def test_swap_out_moves_every_layer_of_a_block(case):
    spec = case.spec(case.geometry(num_blocks=6, num_layers=3))
    src, dst = torch.tensor([2, 5]), torch.tensor([4, 3])
    _, host, expected, before = swap_out(case, spec, src, dst)
    assert_bytes_equal("swap", case, expected, host, f"3 layers: swap_out {src.tolist()} -> host {dst.tolist()}", initial=before)


@pytest.mark.kvc_clause("ADDR-64BIT", "ADDR-BLOCK-ID", "SWAP-DIM0", "SWAP-INTACT")
@pytest.mark.kvc_needs("memory_2_31")
def test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements(case):
    g, kv_cache_dtype = probe_geometry(case)
    spec = case.spec(g, kv_cache_dtype)
    last = g.num_blocks - 1
    device, host = probe_arena(case, spec), probe_arena(case, spec, host=True)
    device_expected, host_expected = expected_arena(device), expected_arena(host)
    key, value = token_rows(spec, 3, case.seed)
    slots = torch.tensor([last * g.block_size, last * g.block_size + g.block_size - 1, 2 * g.block_size])
    for arena in (device, device_expected):  # the blocks to move hold data (the rest of a lazy arena is zeros)
        R.reshape_and_cache(key, value, arena.region, spec.layout, g, slots, k_scale=torch.ones(1), v_scale=torch.ones(1))
    out_src, out_dst, in_dst = torch.tensor([last, 2]), torch.tensor([last - 1, last]), torch.tensor([last - 2, 3])
    note_blocks(case, spec, torch.cat([out_src, out_dst, in_dst]))
    R.swap_out_blocks_to_host(device_expected.region, host_expected.region, spec.layout, g, out_src, out_dst)
    case.backend.swap_out(device.cache, host.cache, out_src.to(case.device), out_dst, spec)
    synchronize(case)
    assert_arenas_equal("swap", case, host_expected, host, f"swap_out {out_src.tolist()} -> host {out_dst.tolist()} of {g.num_blocks} blocks")
    R.insert_blocks_to_device(host_expected.region, device_expected.region, spec.layout, g, out_dst, in_dst)
    case.backend.swap_in(host.cache, device.cache, out_dst, in_dst.to(case.device), spec)
    synchronize(case)
    assert_arenas_equal("swap", case, device_expected, device, f"insert host {out_dst.tolist()} -> device {in_dst.tolist()} of {g.num_blocks} blocks")


@pytest.mark.kvc_clause("SWAP-PINNED")
@pytest.mark.kvc_needs("gpu")
def test_host_cache_is_pinned_when_a_gpu_exists(case):
    spec = case.spec(case.geometry())
    host = case.allocate(spec, host=True)
    assert_true("swap", case, host.cache.is_pinned(), "host cache is not in pinned memory")
    assert_true("swap", case, host.cache.data_ptr() == host.region.data_ptr(), "host cache is not a view of the pinned buffer")
