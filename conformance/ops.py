"""Run one op on the backend and the same op on the reference, on twin arenas."""

from __future__ import annotations

import torch

from kvconform import reference as R

from .harness import Arena, Case


def run_write(case: Case, arena: Arena, key, value, slot_mapping, k_scale, v_scale, *, on_device: bool = False) -> Arena:
    """Backend ``write`` into ``arena``; returns the reference's expected arena."""
    spec = arena.spec
    expected = arena.snapshot(on_device)
    R.reshape_and_cache(key.cpu(), value.cpu(), expected.region, spec.layout, spec.geometry, slot_mapping.cpu(), k_scale=k_scale, v_scale=v_scale)
    dev = case.device
    case.backend.write(
        arena.cache, key.to(dev), value.to(dev), slot_mapping.to(dev), spec,
        k_scale=k_scale.to(dev, torch.float32), v_scale=v_scale.to(dev, torch.float32),
    )
    return expected


def write_and_compare(case: Case, prop: str, spec, key, value, slot_mapping, k_scale, v_scale, note: str = "") -> None:
    """Backend write into a fresh arena; the whole arena must equal the reference's."""
    from .assertions import assert_bytes_equal

    arena = case.allocate(spec)
    expected = run_write(case, arena, key, value, slot_mapping, k_scale, v_scale)
    synchronize(case)
    assert_bytes_equal(prop, case, expected, arena, note)


def synchronize(case: Case) -> None:
    if case.device.startswith("cuda"):
        torch.cuda.synchronize()
