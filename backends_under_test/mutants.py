"""Seeded-fault backends: the reference with one realistic kernel bug each.

Every mutant names the check families (pytest markers) that must catch it; the suite's own
tests run each one and fail the build if it survives. Faults are written the way a real
kernel gets them wrong — through the native tensor, with the wrong dim, stride or sign.
"""

from __future__ import annotations

import dataclasses

import torch

import reference as R

from .reference_backend import ReferenceBackend, flat_storage


class Mutant(ReferenceBackend):
    catches: tuple[str, ...] = ()  # check families that must fail


def write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale) -> None:
    """A strided ``(B, N, H, D)`` writer, as kernels do it: ``view[b, n] = row`` per side."""
    slots = slot_mapping.long()
    keep = slots >= 0
    s = slots[keep]
    b, n = s // spec.geometry.block_size, s % spec.geometry.block_size
    T = slots.numel()
    for view, rows, scale in zip(views, (key[:T][keep], value[:T][keep]), (k_scale, v_scale)):
        view[b, n] = R.ops.encode(rows, spec.geometry, scale, head_dim=1)


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


# ----------------------------------------------------------------------------- shape
class KvFirstReportedAsBlocksFirst(Mutant):
    """Allocates kv-first planes ``(2, B, N, H, D)`` and hands out ``transpose(0, 1)``: the
    shape says blocks-first, the strides (and every stride-driven kernel) say kv-first."""

    catches = ("shape", "write", "split")

    def allocate(self, buffer, spec):
        g = spec.geometry
        planes = buffer.view(g.dtype).view(2, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size)
        return planes.transpose(0, 1)

    def split(self, cache, spec):
        return cache.unbind(1)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        write_rows(cache.unbind(1), key, value, slot_mapping, spec, k_scale, v_scale)


# ----------------------------------------------------------------------------- split
class SplitCopies(Mutant):
    """``unbind(1)`` followed by ``.contiguous()``: K/V are copies, writes through them vanish (F.6)."""

    catches = ("split",)

    def split(self, cache, spec):
        return tuple(view.contiguous() for view in super().split(cache, spec))


class SplitOnBlockDim(Mutant):
    """``unbind(0)`` on a blocks-first cache: "K" and "V" are blocks 0 and 1 (F.18)."""

    catches = ("split",)

    def split(self, cache, spec):
        return cache[0], cache[1]


# ----------------------------------------------------------------------------- write
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


class DenseBlockStride(Mutant):
    """Addresses block ``b`` of the K/V views at ``b·N·H·D`` (the dense plane) instead of
    ``stride(0) = 2·N·H·D``: the pre-#43660 assumption on an ``unbind(1)`` view."""

    catches = ("write",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        views = strided_sides(cache, spec, block_stride=g.block_size * g.num_kv_heads * g.head_size)
        write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale)


class HeadStrideIgnored(Mutant):
    """Takes the head stride as ``D`` (NHD) whatever the cache says: HND caches are scrambled."""

    catches = ("write",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        views = strided_sides(cache, spec, head_stride=spec.geometry.head_size)
        write_rows(views, key, value, slot_mapping, spec, k_scale, v_scale)


class Fp8ScaleMultiplied(Mutant):
    """Quantises ``x · scale`` instead of ``x / scale``."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        if spec.geometry.dtype in R.fp8.FP8_DTYPES:
            k_scale, v_scale = 1 / k_scale, 1 / v_scale
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)


# ----------------------------------------------------------------------------- shuffle
class ShuffleVInKForm(Mutant):
    """Writes V with K's ``[H, D/x, N, x]`` tile instead of ``[H, N/x, D, x]``."""

    catches = ("shuffle", "write")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        layout = spec.layout
        if layout.is_tiled:
            layout = dataclasses.replace(layout, v_dims=layout.v_dims[:-4] + layout.k_dims[-4:])
        R.reshape_and_cache(key, value, flat_storage(cache, spec), layout, spec.geometry, slot_mapping, k_scale=k_scale, v_scale=v_scale)


class ShuffleXFromModelDtype(Mutant):
    """Computes ``x = 16 // element_size`` of the *model* dtype (8 for bf16) on an fp8 cache (F.7)."""

    catches = ("shuffle",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if not (spec.layout.is_tiled and g.dtype in R.fp8.FP8_DTYPES):
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        wrong_x = dataclasses.replace(g, dtype=key.dtype)  # same sizes, x from the model dtype
        slots = slot_mapping.long()
        keep = slots >= 0
        s = slots[keep]
        bits = R.storage_bits(flat_storage(cache, spec), g)
        for kv, (rows, scale) in enumerate(((key, k_scale), (value, v_scale))):
            codes = R.ops.encode(rows[: slots.numel()][keep], g, scale, head_dim=1).view(torch.uint8)
            offs = spec.layout.offsets(
                wrong_x, block=(s // g.block_size)[:, None, None], kv=kv, slot=(s % g.block_size)[:, None, None],
                head=torch.arange(g.num_kv_heads)[:, None], dim=torch.arange(g.head_size),
            )
            bits[offs] = codes


# ----------------------------------------------------------------------------- swap / copy
class SwapIndexesDim1(Mutant):
    """``dst[:, dst_ids] = src[:, src_ids]``: the kv-first indexing applied to a blocks-first cache (#41056)."""

    catches = ("swap",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        host_cache[:, dst_ids.to(host_cache.device)] = cache[:, src_ids.to(cache.device)].to(host_cache.device)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        cache[:, dst_ids.to(cache.device)] = host_cache[:, src_ids.to(host_cache.device)].to(cache.device)


class SwapDim0OnKvFirst(Mutant):
    """A kv-first ``(2, B, N, H, D)`` cache swapped with ``dst[ids] = src[ids]`` on dim 0: ids ≥ 2
    raise, ids 0/1 silently copy whole K or V planes (F.1)."""

    catches = ("swap",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        host_cache[dst_ids.to(host_cache.device)] = cache[src_ids.to(cache.device)].to(host_cache.device)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        cache[dst_ids.to(cache.device)] = host_cache[src_ids.to(host_cache.device)].to(cache.device)


class CopyBlocksOnePlane(Mutant):
    """``copy_blocks`` that copies the K plane of each block and forgets V."""

    catches = ("copy",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def copy_blocks(self, cache, block_mapping, spec):
        src, dst = block_mapping[:, 0], block_mapping[:, 1]
        cache[dst, 0] = cache[src, 0]


# ----------------------------------------------------------------------------- read
class DecodeUsesKScaleForV(Mutant):
    """Dequantises V with ``k_scale`` in the decode kernel."""

    catches = ("read",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        return super().decode(cache, query, block_table, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=k_scale)


# ----------------------------------------------------------------------------- gating
class KvFirstClaimsConnector(Mutant):
    """ROCM_ATTN-style kv-first cache that still says ``supports_kv_connector() = True`` (F.17)."""

    catches = ("gating",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def supports_kv_connector(self):
        return True


class BlocksFirstDeniesConnector(Mutant):
    """A blocks-first backend that declares no connector support: selection loses it for nothing."""

    catches = ("gating",)

    def supports_kv_connector(self):
        return False


MUTANTS = {
    "kv_first_reported_as_blocks_first": KvFirstReportedAsBlocksFirst,
    "split_copies": SplitCopies,
    "split_on_block_dim": SplitOnBlockDim,
    "write_padding_slots": WritesPaddingSlots,
    "write_dense_block_stride": DenseBlockStride,
    "write_head_stride_ignored": HeadStrideIgnored,
    "fp8_scale_multiplied": Fp8ScaleMultiplied,
    "shuffle_v_in_k_form": ShuffleVInKForm,
    "shuffle_x_from_model_dtype": ShuffleXFromModelDtype,
    "swap_indexes_dim1": SwapIndexesDim1,
    "swap_dim0_on_kv_first": SwapDim0OnKvFirst,
    "copy_blocks_one_plane": CopyBlocksOnePlane,
    "decode_k_scale_for_v": DecodeUsesKScaleForV,
    "kv_first_claims_connector": KvFirstClaimsConnector,
    "blocks_first_denies_connector": BlocksFirstDeniesConnector,
}
