"""What the K/V mutants share: the ``Mutant`` base (the reference backend, one thing broken by each
subclass) and the row writers a mutant uses to misplace rows the way a kernel does.
"""

from __future__ import annotations

import torch

from kvconform import reference as R

from ..reference_backend import ReferenceBackend, flat_storage


class Mutant(ReferenceBackend):
    catches: tuple[str, ...] = ()  # check families that must fail
    kills: tuple[str, ...] = ()  # checks that must fail, at least one of each family in catches (tests/mutant_focus.py)
    suite_args: tuple[str, ...] = ()  # pytest options the catching check needs (CPU runs)


def encoded_rows(key, value, spec, k_scale, v_scale) -> list[torch.Tensor]:
    """K and V rows in the cache dtype (the correct quantisation), for mutants that misplace them."""
    return [R.ops.encode(x, spec.geometry, scale, head_dim=1) for x, scale in ((key, k_scale), (value, v_scale))]


def write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale, block_size=None) -> None:
    """A strided ``(B, N, H, D)`` writer, as kernels do it: ``view[b, n] = row`` per side.

    ``block_size`` is the N the kernel believes in (default: the cache's).
    """
    N = block_size or spec.geometry.block_size
    slots = slot_mapping.long()
    keep = slots >= 0
    s = slots[keep]
    T = slots.numel()
    for view, rows in zip(views, encoded_rows(key, value, spec, k_scale, v_scale)):
        view[s // N, s % N] = rows[:T][keep]


def place_rows(cache, spec, slot_mapping, rows, offsets=None) -> None:
    """Store already-encoded K and V rows (``rows = (k, v)``, cache dtype) at ``offsets(kv, b, n)``
    element offsets — the reference's by default; mutants pass a wrong address function."""
    g = spec.geometry
    slots = slot_mapping.long().cpu()
    keep = slots >= 0
    s = slots[keep]
    b, n = (s // g.block_size)[:, None, None], (s % g.block_size)[:, None, None]
    heads, dims = torch.arange(g.num_kv_heads)[:, None], torch.arange(g.head_size)
    bits = R.storage_bits(flat_storage(cache, spec), g)
    for kv, data in enumerate(rows):
        where = offsets(kv, b, n, heads, dims) if offsets else spec.layout.offsets(g, block=b, kv=kv, slot=n, head=heads, dim=dims)
        bits[where.to(bits.device)] = data[: len(slots)][keep.to(data.device)].contiguous().view(bits.dtype)


def strided_sides(cache, spec, block_stride=None, head_stride=None):
    """K/V ``(B, N, H, D)`` views of ``cache`` from the layout, optionally with a wrong stride."""
    views = []
    for kv in (0, 1):
        shape, strides, offset = spec.layout.side_view(spec.geometry, kv)
        strides = list(strides)
        if block_stride is not None:
            strides[0] = block_stride
            offset = kv * block_stride * spec.geometry.num_blocks if spec.layout.k_dims[0] == "2" else offset
        if head_stride is not None:
            strides[2] = head_stride
        views.append(cache.as_strided(shape, strides, cache.storage_offset() + offset))
    return views


class Gfx942Mutant(Mutant):
    """Claims an MI300 (gfx942): its fp8 cache is float8_e4m3fnuz."""

    platform = "rocm"

    def arch(self):
        return "gfx942"


def e3_layouts():
    return (R.standardized("LBHNC"), R.standardized("BLHNC"))
