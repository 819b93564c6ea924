"""Run one op on the backend and the same op on the reference, on twin arenas."""

from __future__ import annotations

import torch

from kvconform import reference as R

from .assertions import a_finding, assert_bytes_equal
from .exercised import note_write
from .case import Arena, Case
from .diagnosis import WriteInputs

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)


def declared_slots(case: Case, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The mapping a check's write gives the backend and the reference alike: as written where
    the backend declares padding slots, else without its ``-1`` entries. The key rows those stood
    for then lie past the mapping or pair with the next slot (rows past the mapping must be
    ignored, WRITE-TOKENS), so the key and value tensors keep the strides a check is about."""
    if case.backend.capabilities.padding_slots:
        return slot_mapping
    return slot_mapping[slot_mapping >= 0]


def run_write(case: Case, arena: Arena, key, value, slot_mapping, k_scale, v_scale, *, on_device: bool = False) -> Arena:
    """Backend ``write`` into ``arena``; returns the reference's expected arena."""
    expected = arena.snapshot(on_device)
    reference_write(case, expected, key, value, slot_mapping, k_scale, v_scale)
    backend_write(case, arena, key, value, slot_mapping, k_scale, v_scale)
    return expected


def backend_write(case: Case, arena: Arena, key, value, slot_mapping, k_scale, v_scale) -> None:
    dev = case.device
    case.backend.write(
        arena.cache, key.to(dev), value.to(dev), slot_mapping.to(dev), arena.spec,
        k_scale=k_scale.to(dev, torch.float32), v_scale=v_scale.to(dev, torch.float32),
    )


def reference_write(case: Case, expected: Arena, key, value, slot_mapping, k_scale, v_scale) -> None:
    """The reference's write into ``expected`` (on its layer), noted as what the case exercised."""
    spec = expected.spec
    R.reshape_and_cache(key.cpu(), value.cpu(), expected.region, spec.layout, spec.geometry, slot_mapping.cpu(),
                        k_scale=k_scale, v_scale=v_scale, layer=spec.layer)
    note_write(case, spec, key, value, slot_mapping, k_scale, v_scale)


def write_and_compare(case: Case, prop: str, spec, key, value, slot_mapping, k_scale, v_scale, note: str = "") -> None:
    """Backend write into a fresh arena; the whole arena must equal the reference's. A failure
    is diagnosed against the arena before the write and the write's inputs."""
    arena = case.allocate(spec)
    initial = arena.snapshot()
    slot_mapping = declared_slots(case, slot_mapping)
    expected = run_write(case, arena, key, value, slot_mapping, k_scale, v_scale)
    synchronize(case)
    assert_bytes_equal(prop, case, expected, arena, note, initial=initial,
                       writes=WriteInputs(key, value, slot_mapping, k_scale, v_scale))


def synchronize(case: Case) -> None:
    if case.device.startswith("cuda"):
        torch.cuda.synchronize()
