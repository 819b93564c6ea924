"""Check 5 — ``swap_out_blocks_to_host`` / ``insert_blocks_to_device`` copy whole blocks along
the block dim: each block lands at its host slot (checked per block, not just by round trip:
pitfall F.1), comes back into other device blocks, and nothing else moves (LAYOUT_SPEC §B.7)."""

import pytest
import torch

from kvconform import reference as R

from .assertions import assert_bytes_equal, assert_true
from .harness import block_ids

pytestmark = [pytest.mark.swap, pytest.mark.kvc_op("swap")]


def swap_out(case, spec, src_ids, dst_ids):
    device = case.allocate(spec)
    host = case.allocate(spec, host=True, seed_offset=1)
    expected = host.snapshot()
    R.swap_out_blocks_to_host(device.region.cpu(), expected.region, spec.layout, spec.geometry, src_ids, dst_ids)
    case.backend.swap_out(device.cache, host.cache, src_ids.to(case.device), dst_ids, spec)
    return device, host, expected


def test_swap_out_places_each_block_at_its_host_slot(case):
    spec = case.spec(case.geometry(num_blocks=7))
    src, dst = block_ids(spec.geometry, 3, case.seed), block_ids(spec.geometry, 3, case.seed + 1)
    _, host, expected = swap_out(case, spec, src, dst)
    assert_bytes_equal("swap", case, expected, host, f"swap_out {src.tolist()} -> host {dst.tolist()}")


def test_swap_in_restores_blocks_into_other_device_blocks(case):
    spec = case.spec(case.geometry(num_blocks=8))
    src = block_ids(spec.geometry, 3, case.seed)
    parked = block_ids(spec.geometry, 3, case.seed + 1)
    back = torch.tensor([b for b in range(2, 8) if b not in src.tolist()][:3])
    device, host, _ = swap_out(case, spec, src, parked)
    expected = device.snapshot()
    R.insert_blocks_to_device(host.region.cpu(), expected.region, spec.layout, spec.geometry, parked, back)
    case.backend.swap_in(host.cache, device.cache, parked, back.to(case.device), spec)
    assert_bytes_equal("swap", case, expected, device, f"insert host {parked.tolist()} -> device {back.tolist()}")


def test_swap_of_blocks_0_and_1_moves_blocks_not_planes(case):
    spec = case.spec(case.geometry(num_blocks=5))
    src, dst = torch.tensor([1, 0]), torch.tensor([0, 1])
    _, host, expected = swap_out(case, spec, src, dst)
    assert_bytes_equal("swap", case, expected, host, "ids 0/1: a dim-0 copy on a kv-first cache moves whole K/V planes")


@pytest.mark.kvc_needs("gpu")
def test_host_cache_is_pinned_when_a_gpu_exists(case):
    spec = case.spec(case.geometry())
    host = case.allocate(spec, host=True)
    assert_true("swap", case, host.cache.is_pinned(), "host cache is not in pinned memory")
    assert_true("swap", case, host.cache.data_ptr() == host.region.data_ptr(), "host cache is not a view of the pinned buffer")
