"""Byte regions read off the tensors a backend hands its kernels — what a connector such as
NIXL registers: each tensor's base pointer and strides, never kvconform's offset map.

A backend names, per tensor, the dimension that indexes blocks and the one that indexes KV
heads; the regions holding some blocks (and a head range) are the maximal runs of the element
addresses those tensors reach with the other indices free.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform.reference.connector import byte_runs


@dataclasses.dataclass(frozen=True)
class IndexedView:
    """A tensor the kernels address, with the dims that index blocks and KV heads."""

    tensor: torch.Tensor
    block_dim: int
    head_dim: int


def element_addresses(view: IndexedView, block_ids, heads) -> torch.Tensor:
    """Element offsets (from the tensor's storage start) of every element of the chosen blocks
    and heads, computed from the tensor's shape and strides."""
    t = view.tensor
    total = torch.tensor(t.storage_offset(), dtype=torch.int64)
    for dim, size in enumerate(t.shape):
        if dim == view.block_dim:
            index = torch.as_tensor(block_ids, dtype=torch.int64).flatten().cpu()
        elif dim == view.head_dim and heads is not None:
            index = torch.as_tensor(heads, dtype=torch.int64).flatten()
        else:
            index = torch.arange(size, dtype=torch.int64)
        shape = [1] * t.dim()
        shape[dim] = index.numel()
        total = total + (index * t.stride(dim)).view(shape)
    return total.flatten()


def regions_of(views: list[IndexedView], origin: torch.Tensor, block_ids, heads=None) -> list[tuple[int, int]]:
    """Maximal byte runs ``(offset, length)``, from ``origin``'s first byte, covering the chosen
    blocks and heads of every view (all views share ``origin``'s storage and element size)."""
    addresses = torch.cat([element_addresses(v, block_ids, heads) for v in views]) - origin.storage_offset()
    return byte_runs(addresses, origin.element_size())
