"""Seeded-fault backends: the reference with one realistic kernel bug each.

Every mutant names the check family (pytest marker) that must catch it; the suite's own
tests run each one and fail the build if it survives. Faults are written the way a real
kernel gets them wrong — through the native tensor, with the wrong dim, stride or sign.
"""

from __future__ import annotations

import torch

import reference as R

from .reference_backend import ReferenceBackend, flat_storage, view_over


class Mutant(ReferenceBackend):
    catches: tuple[str, ...] = ()  # check families that must fail


class WritesPaddingSlots(Mutant):
    """Python-style negative indexing: slot -1 writes the cache's last slot instead of nothing."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        padding = (slot_mapping < 0).nonzero().flatten()
        if padding.numel():  # cache.view(-1, ...)[-1] = row: the last padded token wins
            last_slot = torch.full_like(slot_mapping, -1)
            last_slot[padding[-1]] = spec.geometry.num_blocks * spec.geometry.block_size - 1
            super().write(cache, key, value, last_slot, spec, k_scale=k_scale, v_scale=v_scale)


MUTANTS = {
    "write_padding_slots": WritesPaddingSlots,
}
