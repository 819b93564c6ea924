"""Seeded-fault backends: the reference with one realistic kernel bug each.

Every mutant names the check families (pytest markers) that must catch it; the suite's own
tests run each one and fail the build if it survives. Faults are written the way a real
kernel gets them wrong — through the native tensor, with the wrong dim, stride or sign.
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from kvconform.reference import compat
from kvconform import reference as R

from .input_mutants import INPUT_MUTANTS
from .latent_mutants import LATENT_MUTANTS
from .quant_mutants import QUANT_MUTANTS
from .reference_backend import ReferenceBackend, flat_storage, view_over


class Mutant(ReferenceBackend):
    catches: tuple[str, ...] = ()  # check families that must fail
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


class KvFirstShapeDeclaredBlocksFirst(Mutant):
    """Declares the blocks-first standard but hands out its kv-first ``(2, B, N, H, D)`` tensor."""

    catches = ("shape",)

    def allocate(self, buffer, spec):
        g = spec.geometry
        return buffer.view(g.dtype).view(2, g.num_blocks, g.block_size, g.num_kv_heads, g.head_size)


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
        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows, lambda kv, b, n, h, d: spec.layout.offsets(wrong_x, block=b, kv=kv, slot=n, head=h, dim=d))


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


class SelectorIgnoresConnector(Mutant):
    """ROCM_ATTN-style kv-first backend that declares no connector support, but the platform's
    priority list still offers it when a connector is configured (GATE-SELECTOR, F.1)."""

    catches = ("gating",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def selection_order(self, *, use_kv_connector):
        return [self.name]


class ValidateDropsConnectorFlag(Mutant):
    """A ``validate_configuration`` override on a kv-first backend that does not forward
    ``use_kv_connector`` to the base class: it declares no connector support, yet a connector
    configuration validates clean (GATE-REJECT; ROCM_AITER_MLA must forward it)."""

    catches = ("gating",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def validate_configuration(self, *, head_size, dtype, kv_cache_dtype, block_size, use_kv_connector):
        return super().validate_configuration(head_size=head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, use_kv_connector=False)


class ValidateRejectsDeclaredHeadSize(Mutant):
    """``validate_configuration`` tests ``head_size > min`` instead of membership: the smallest
    declared head size is rejected, so selection skips a backend that supports it."""

    catches = ("gating",)

    def validate_configuration(self, *, head_size, **kwargs):
        reasons = super().validate_configuration(head_size=head_size, **kwargs)
        if head_size <= min(self.capabilities.head_sizes):
            reasons.append("head_size not supported")
        return reasons


class BlocksFirstDeniesConnector(Mutant):
    """A blocks-first backend that declares no connector support: selection loses it for nothing."""

    catches = ("gating",)

    def supports_kv_connector(self):
        return False


class BlockSizeFromWrongDim(Mutant):
    """Reads ``block_size`` from ``key_cache.shape[2]`` (H) instead of ``shape[1]`` (N)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        wrong_n = spec.geometry.num_kv_heads  # shape[2] of (B, N, H, D), taken as N
        write_rows(strided_sides(cache, spec), key, value, slot_mapping, spec, k_scale, v_scale, block_size=wrong_n)


class TokensFromKeyRows(Mutant):
    """Launches one program per *key row*: rows past ``len(slot_mapping)`` read slot_mapping out
    of bounds (here: wrapping) and overwrite real tokens."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        T, rows = len(slot_mapping), key.shape[0]
        if rows > T and T:
            extra = torch.arange(T, rows)
            stray = torch.full((rows,), -1, dtype=slot_mapping.dtype)
            stray[extra] = slot_mapping.cpu()[extra % T]
            stray = torch.where(torch.arange(rows) >= T, stray, -1)
            super().write(cache, key, value, stray.to(slot_mapping.device), spec, k_scale=k_scale, v_scale=v_scale)


class KScaleForVOnWrite(Mutant):
    """Quantises V with ``k_scale``."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=k_scale)


class TruncatingFp8(Mutant):
    """Rounds toward zero instead of to nearest-even when quantising to fp8."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        rows = []
        for x, scale in ((key, k_scale), (value, v_scale)):
            exact = (x.float() / R.fp8._scale_like(scale, x, 1)).abs()
            codes = R.ops.encode(x, g, scale, head_dim=1).view(torch.uint8).to(torch.int16)
            magnitude = R.fp8.decode_codes(codes.to(torch.uint8), g.dtype).abs()
            codes = torch.where((magnitude > exact) & (codes & 0x7F != 0), codes - 1, codes)  # one code toward zero
            rows.append(codes.to(torch.uint8).view(g.dtype))
        place_rows(cache, spec, slot_mapping, rows)


class Gfx942Mutant(Mutant):
    """Claims an MI300 (gfx942): its fp8 cache is float8_e4m3fnuz."""

    platform = "rocm"

    def arch(self):
        return "gfx942"


class FnToFnuzWithoutNegativeZeroFix(Gfx942Mutant):
    """Stores e4m3fn codes of ``2·x/scale`` as fnuz bits: −0 (0x80) becomes fnuz NaN and
    saturation lands on 448/2 instead of 240."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        if spec.geometry.dtype != torch.float8_e4m3fnuz:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        rows = [R.fp8.quantize(x, scale / 2, "float8_e4m3fn", head_dim=1).view(torch.float8_e4m3fnuz) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)


class FnuzReadAsFn(Gfx942Mutant):
    """Decode kernel reads the gfx942 cache's e4m3fnuz bytes as e4m3fn (values doubled)."""

    catches = ("read",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        if spec.geometry.dtype != torch.float8_e4m3fnuz:
            return super().decode(cache, query, block_table, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)
        as_fn = dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, dtype=torch.float8_e4m3fn))
        return R.paged_decode_attention(query, flat_storage(cache, spec), spec.layout, as_fn.geometry, block_table, seq_lens,
                                        scale=scale, k_scale=k_scale, v_scale=v_scale)


class OneByteFlipped(Mutant):
    """A write that is right except for one flipped bit in one written element."""

    catches = ("write", "equivalence")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        first = slot_mapping[slot_mapping >= 0][:1].long().cpu()
        if first.numel():
            g = spec.geometry
            offset = int(spec.layout.offsets(g, block=first // g.block_size, kv=1, slot=first % g.block_size, head=0, dim=0))
            R.storage_bits(flat_storage(cache, spec), g)[offset] ^= 1


class Int32OffsetWraparound(Mutant):
    """Element offsets computed in 32-bit arithmetic: past 2^31 they wrap (here: lose bit 31)
    and the last blocks of a large cache are written over its first ones (F.2)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows,
                   lambda kv, b, n, h, d: spec.layout.offsets(g, block=b, kv=kv, slot=n, head=h, dim=d) & 0x7FFFFFFF)


class ScribblesPastTheEnd(Mutant):
    """A correct write that also stores one element past the end of the cache."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        g = spec.geometry
        end = spec.layout.numel(g) * g.element_size
        past_the_end(cache, end, g.element_size).zero_()


class _RawMemory:
    """``__array_interface__`` / ``__cuda_array_interface__`` over a raw address range."""

    def __init__(self, address: int, nbytes: int, cuda: bool):
        interface = {"data": (address, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}
        setattr(self, "__cuda_array_interface__" if cuda else "__array_interface__", interface)


def past_the_end(cache: torch.Tensor, offset: int, nbytes: int) -> torch.Tensor:
    """``nbytes`` at byte ``offset`` from the cache's start, as a kernel's pointer reaches them: past
    the cache's storage when ``offset`` is its size (torch views stop at the storage; memory does not)."""
    import numpy as np

    start = cache.data_ptr() + offset
    if cache.is_cuda:
        return torch.as_tensor(_RawMemory(start, nbytes, cuda=True), device=cache.device)
    return torch.from_numpy(np.asarray(_RawMemory(start, nbytes, cuda=False)))


class DecodeIgnoresBlockTable(Mutant):
    """Decode reads sequence s's j-th block from block ``j`` (as if the table were the identity)."""

    catches = ("read",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        identity = torch.arange(block_table.numel(), device=block_table.device).view_as(block_table)
        return super().decode(cache, query, identity, seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)


class CopyBlocksDensePlaneStride(Mutant):
    """Legacy ``copy_blocks`` on ``unbind(1)`` views: block ``b`` at ``b·N·H·D`` of each plane (F.10)."""

    catches = ("copy",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def copy_blocks(self, cache, block_mapping, spec):
        g = spec.geometry
        for view in strided_sides(cache, spec, block_stride=g.block_size * g.num_kv_heads * g.head_size):
            rows = view[block_mapping[:, 0]].clone()
            view[block_mapping[:, 1]] = rows


class SwapKViewBlockBytes(Mutant):
    """``swap_blocks`` run once per split view with ``S = stride(0)·e``: the V view's copy takes
    ``[V_b, K_{b+1}]`` and overwrites the neighbour block's K (F.9)."""

    catches = ("swap",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def _swap(self, src, dst, src_ids, dst_ids, spec):
        g = spec.geometry
        plane = g.block_size * g.num_kv_heads * g.head_size
        span = 2 * plane  # stride(0) of the K/V views, taken as "the block"
        flat_src, flat_dst = (torch.as_strided(t, (g.num_blocks * span,), (1,), t.storage_offset()) for t in (src, dst))
        for base in (0, plane):  # K view, then V view
            for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
                length = min(span, flat_src.numel() - base - s * span, flat_dst.numel() - base - d * span)
                flat_dst[base + d * span: base + d * span + length] = flat_src[base + s * span: base + s * span + length].to(flat_dst.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._swap(cache, host_cache, src_ids.cpu(), dst_ids.cpu(), spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._swap(host_cache, cache, src_ids.cpu(), dst_ids.cpu(), spec)


class SwapOnlyBelowTwo(Mutant):
    """A swap that indexes with ``ids & 1`` (written and tested with blocks 0 and 1 only)."""

    catches = ("swap",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        super().swap_out(cache, host_cache, src_ids & 1, dst_ids & 1, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        super().swap_in(host_cache, cache, src_ids & 1, dst_ids & 1, spec)


class ShuffleDenseBlockStride(Mutant):
    """Pre-#43660 shuffle writer on ``unbind(1)`` views: side base ``b·H·D·N`` from each view's
    pointer (dense planes) instead of ``stride(0) = 2·H·D·N``."""

    catches = ("shuffle", "write")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        layout, g = spec.layout, spec.geometry
        if not (layout.is_tiled and layout.k_dims[0] == "B"):
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        plane = g.num_kv_heads * g.head_size * g.block_size

        def dense_base(kv, b, n, h, d):  # the tile offset is right; only the block base is dense
            tile = layout.offsets(g, block=0, kv=kv, slot=n, head=h, dim=d) - layout.offsets(g, block=0, kv=kv)
            return kv * plane + b * plane + tile

        rows = encoded_rows(key, value, spec, k_scale, v_scale)
        place_rows(cache, spec, slot_mapping, rows, dense_base)


class CrossLayerPackedLayerOutermost(Mutant):
    """Block-outermost E3 (BLHNC) allocated with layer-outermost strides (``layer_stride = B·page``,
    the LBHNC planner branch): a one-layer cache is right; layer 1 sits where block 1 belongs."""

    catches = ("shape",)
    suite_args = ("--standard", "e3", "-k", "permutation_puts")

    def __init__(self):
        super().__init__(layouts=(R.standardized("BLHNC"),), standards=frozenset({"e3"}))

    def allocate(self, buffer, spec):
        return view_over(buffer, spec, R.standardized("LBHNC").view_shape_strides(spec.geometry))



# ----------------------------------------------------------------------------- coverage (#14)
def scaled(x: torch.Tensor, scale) -> torch.Tensor:
    """``x / scale`` in fp32, a scale per tensor or per KV head (dim 1 of ``[T, H, D]``)."""
    return x.float() / R.fp8._scale_like(scale, x, 1)


class Fp8NanSaturatesToMax(Mutant):
    """Saturates with ``fmaxf(fminf(y, max), -max)``: IEEE fmin/fmax return the non-NaN operand,
    so a NaN is stored as +max, a finite value (FP8-NAN)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        top = R.fp8.fp8_format(g.dtype).max_finite
        rows = [R.fp8.quantize(torch.nan_to_num(scaled(x, scale), nan=top), 1.0, g.dtype) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)


class Fp8NearTiesRoundedAsTies(Mutant):
    """A software round-to-nearest-even that calls a value a tie when it is within 2^-19 of one
    (a tolerance "for division error"): values a hair off a tie go to the even code instead of
    the nearer one (FP8-ENCODE near-ties)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype not in R.fp8.FP8_DTYPES:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        fmt = R.fp8.fp8_format(g.dtype)
        grid = R.fp8.decode_codes(torch.arange(256, dtype=torch.uint8), fmt)
        grid = torch.unique(grid[torch.isfinite(grid) & (grid >= 0)])  # index i holds code i: its parity is the code's
        rows = []
        for x, scale in ((key, k_scale), (value, v_scale)):
            y = scaled(x, scale).cpu()
            a = y.abs()
            upper = torch.searchsorted(grid, a.nan_to_num(0.0).clamp(max=fmt.max_finite)).clamp(1, grid.numel() - 1)
            tie = (grid[upper - 1] + grid[upper]) / 2
            near = (a != tie) & ((a - tie).abs() <= tie * 2.0**-19)
            even = torch.where(upper % 2 == 0, grid[upper], grid[upper - 1])
            rows.append(R.fp8.quantize(torch.where(near, torch.copysign(even, y), y), 1.0, g.dtype).to(x.device))
        place_rows(cache, spec, slot_mapping, rows)


class BlockIndexByShift(Mutant):
    """Splits the slot with ``s >> log2(N)`` and ``s & (N - 1)``, right only when the block size
    is a power of two (WRITE-SLOT with N = 48)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        shift = g.block_size.bit_length() - 1
        wrong = lambda kv, b, n, h, d: spec.layout.offsets(  # noqa: E731
            g, block=(b * g.block_size + n) >> shift, kv=kv, slot=(b * g.block_size + n) & ((1 << shift) - 1), head=h, dim=d)
        place_rows(cache, spec, slot_mapping, encoded_rows(key, value, spec, k_scale, v_scale), wrong)


class HeadStridePowerOfTwo(Mutant):
    """Reads head ``h`` of a source row at ``h·BLOCK_D`` with ``BLOCK_D`` the next power of two
    of D (the Triton ``arange`` width) instead of the row's head stride: right only for
    power-of-two head sizes (WRITE-SOURCE-STRIDE with D = 80)."""

    catches = ("write",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        width = 1 << (g.head_size - 1).bit_length()
        at = (torch.arange(g.num_kv_heads)[:, None] * width + torch.arange(g.head_size)).flatten()

        def misread(x):  # elements past the row's H·D read as zeros
            flat = torch.cat([x.reshape(x.shape[0], -1), torch.zeros(x.shape[0], g.num_kv_heads * width, dtype=x.dtype, device=x.device)], 1)
            return flat[:, at.to(x.device)].view(x.shape)

        super().write(cache, misread(key), misread(value), slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)


class BlocksFirstByteCopy(Mutant):
    """Block copies as raw bytes of each blocks-first page (``page`` bytes per block id)."""

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def block_offset(self, block: int, page: int) -> int:
        return block * page

    def block_bytes(self, spec) -> int:
        return spec.layout.strides(spec.geometry)["B"] * spec.geometry.element_size

    def _swap(self, src, dst, src_ids, dst_ids, spec):
        page = self.block_bytes(spec)
        true_page = spec.layout.strides(spec.geometry)["B"] * spec.geometry.element_size
        src_bytes, dst_bytes = (flat_storage(t, spec).view(torch.uint8) for t in (src, dst))
        for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
            start, to = self.block_offset(s, true_page), self.block_offset(d, true_page)
            length = min(page, src_bytes.numel() - start, dst_bytes.numel() - to)
            dst_bytes[to:to + length] = src_bytes[start:start + length].to(dst_bytes.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._swap(cache, host_cache, src_ids.cpu(), dst_ids.cpu(), spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._swap(host_cache, cache, src_ids.cpu(), dst_ids.cpu(), spec)


class SwapBlockBytesForTwoByteElements(BlocksFirstByteCopy):
    """Swaps ``stride(0)·2`` bytes per block, the element size of bf16/fp16 hard-coded: an fp8
    cache copies two blocks (overwriting the neighbour), an fp32 cache half of one."""

    catches = ("swap",)

    def block_bytes(self, spec):
        return spec.layout.strides(spec.geometry)["B"] * 2


class SwapByteOffsetsInt32(BlocksFirstByteCopy):
    """Computes a block's byte offset ``id·page`` in 32-bit arithmetic: past 2^31 it wraps
    (here: loses bit 31) and the swap reads and writes blocks near the start (ADDR-64BIT)."""

    catches = ("swap",)

    def block_offset(self, block, page):
        return (block * page) & 0x7FFFFFFF


class CopyBlocks16BitIds(Mutant):
    """Narrows the block mapping to 16-bit ids: block ``b`` past 2^16 is block ``b mod 2^16`` (ADDR-BLOCK-ID)."""

    catches = ("copy",)

    def copy_blocks(self, cache, block_mapping, spec):
        super().copy_blocks(cache, block_mapping & 0xFFFF, spec)


class Swap16BitIds(Mutant):
    """Swaps with block ids truncated to 16 bits (an int16 id field): block ``b`` past 2^16 is
    block ``b mod 2^16`` on both sides of the copy (ADDR-BLOCK-ID)."""

    catches = ("swap",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        super().swap_out(cache, host_cache, src_ids & 0xFFFF, dst_ids & 0xFFFF, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        super().swap_in(host_cache, cache, src_ids & 0xFFFF, dst_ids & 0xFFFF, spec)


class DecodeInt32Offsets(Mutant):
    """Decode computes the element offset of block ``b`` (``b·page``) in 32-bit arithmetic: past
    2^31 it wraps and reads another block (emulated by remapping the table; exact for the
    power-of-two pages of the probe geometry; ADDR-64BIT)."""

    catches = ("read",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        page = spec.layout.strides(spec.geometry)["B"]
        wrapped = ((block_table.long() * page) & 0x7FFFFFFF) // page
        return super().decode(cache, query, wrapped.to(block_table.dtype), seq_lens, spec, scale=scale, k_scale=k_scale, v_scale=v_scale)


def e3_layouts():
    return (R.standardized("LBHNC"), R.standardized("BLHNC"))


class WriteIgnoresLayer(Mutant):
    """A per-layer writer handed layer ``l`` of a multi-layer allocation writes layer 0 (WRITE-LAYER)."""

    catches = ("write",)

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, dataclasses.replace(spec, layer=0), k_scale=k_scale, v_scale=v_scale)


class DecodeReadsFirstLayer(Mutant):
    """Decode of layer ``l`` of a multi-layer allocation reads layer 0's pages (READ-LAYER)."""

    catches = ("read",)

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        return super().decode(cache, query, block_table, seq_lens, dataclasses.replace(spec, layer=0), scale=scale, k_scale=k_scale, v_scale=v_scale)


class BlockCopiesFirstLayerOnly(Mutant):
    """Swaps and copies one page per block id — layer 0's — on a multi-layer allocation, as if
    every layer had its own tensor (BLOCK-ALL-LAYERS)."""

    catches = ("swap", "copy")

    def __init__(self):
        super().__init__(layouts=e3_layouts(), standards=frozenset({"e3"}))

    def _first_layer(self, src, dst, src_ids, dst_ids, spec):
        g = spec.geometry
        src_bits, dst_bits = (R.storage_bits(flat_storage(t, spec), g) for t in (src, dst))
        values = src_bits[R.offset_map(spec.layout, g, src_ids.cpu())[0].to(src_bits.device)]
        dst_bits[R.offset_map(spec.layout, g, dst_ids.cpu())[0].to(dst_bits.device)] = values.to(dst_bits.device)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._first_layer(cache, host_cache, src_ids, dst_ids, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._first_layer(host_cache, cache, src_ids, dst_ids, spec)

    def copy_blocks(self, cache, block_mapping, spec):
        self._first_layer(cache, cache, block_mapping[:, 0], block_mapping[:, 1], spec)


class SplitVOffsetForTwoByteElements(Mutant):
    """Puts V ``N·H·D·2`` bytes after K (``sizeof(half)`` hard-coded): right for bf16/fp16,
    wrong for fp8 and fp32 caches (SPLIT-ZERO-COPY, SPLIT-E1-BLOCK-STRIDE)."""

    catches = ("split",)

    def __init__(self):
        super().__init__(layouts=(R.blocks_first("NHD"), R.blocks_first("HND")))

    def split(self, cache, spec):
        g = spec.geometry
        k, _ = super().split(cache, spec)
        plane_bytes = g.block_size * g.num_kv_heads * g.head_size * 2
        return k, cache.as_strided(k.shape, k.stride(), k.storage_offset() + plane_bytes // g.element_size)

# ----------------------------------------------------------------------------- connector
def _proper_slice(heads, spec) -> bool:
    return heads is not None and len(heads) < spec.geometry.num_kv_heads


class ConnectorHeadSliceOffByOne(Mutant):
    """Hetero-TP slices start one head late (wrapping): rank r's slice is taken at the head
    offset of the next head, as an off-by-one in the rank → head arithmetic does (vllm#52516)."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_requested_heads", "test_resharding_gives_every_consumer_rank_exactly_its_heads",
             "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says")

    def _heads(self, heads, spec):
        return [(h + 1) % spec.geometry.num_kv_heads for h in heads] if _proper_slice(heads, spec) else heads

    def block_regions(self, cache, spec, block_ids, heads=None):
        return super().block_regions(cache, spec, block_ids, self._heads(heads, spec))

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, spec, block_ids, self._heads(heads, spec))

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, spec, block_ids, wire, self._heads(heads, spec), num_tokens)


def _as_if_head_major(layout):
    """The layout with N and H swapped wherever N is outside H: what an HND-minded connector sees."""
    def swap(dims):
        dims = list(dims)
        if "N" in dims and "H" in dims and dims.index("N") < dims.index("H"):
            i, j = dims.index("N"), dims.index("H")
            dims[i], dims[j] = dims[j], dims[i]
        return tuple(dims)
    return dataclasses.replace(layout, k_dims=swap(layout.k_dims), v_dims=swap(layout.v_dims), native=tuple((s,) for s in swap(layout.k_dims)), container=None)


class ConnectorNhdSliceAsHnd(Mutant):
    """Takes a head slice of an NHD (token-major) cache as if it were HND: one run per block
    side at ``h0·N·D`` — the hetero-TP corruption NIXL forces HND against (F.11, vllm#46204)."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_requested_heads", "test_resharding_gives_every_consumer_rank_exactly_its_heads")

    def _spec(self, spec, heads):
        return dataclasses.replace(spec, layout=_as_if_head_major(spec.layout)) if _proper_slice(heads, spec) else spec

    def block_regions(self, cache, spec, block_ids, heads=None):
        return super().block_regions(cache, self._spec(spec, heads), block_ids, heads)

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, self._spec(spec, heads), block_ids, heads)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, self._spec(spec, heads), block_ids, wire, heads, num_tokens)


class ConnectorWireCastsValues(Mutant):
    """Serialises the wire through fp32 values (``.float().to(dtype)``) where a bit copy was
    meant: NaN payloads are canonicalised, fp8 NaN codes collapse to one."""

    catches = ("connector",)
    kills = ("test_exported_blocks_import_bit_for_bit",)

    def export_blocks(self, cache, spec, block_ids, heads=None):
        wire = super().export_blocks(cache, spec, block_ids, heads)
        dtype = wire.geometry.dtype
        cast = wire.data.view(dtype).float().to(dtype).view(torch.uint8)
        return dataclasses.replace(wire, data=cast)


class ConnectorImportIntoACopy(Mutant):
    """The receive step works on a temporary (``cache.clone()``) instead of the cache in place:
    every import vanishes (F.26, vllm#30448 review)."""

    catches = ("connector",)
    kills = ("test_exported_blocks_import_bit_for_bit",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache.clone(), spec, block_ids, wire, heads, num_tokens)


class ConnectorReblockDropsLastPartialBlock(Mutant):
    """Re-blocking copies whole wire blocks only: the tokens of a last, partial block are lost."""

    catches = ("connector",)
    kills = ("test_block_size_translation_keeps_every_token",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        if num_tokens is not None:
            num_tokens -= num_tokens % wire.geometry.block_size
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


class ConnectorHybridGroupOtherHeadSize(Mutant):
    """Ships every layer group with the head size of the first cache the engine registered (one
    ``block_len`` for all groups): a hybrid model's second group is sliced with the first's."""

    catches = ("connector",)
    kills = ("test_hybrid_model_groups_round_trip_each_with_its_own_geometry",)

    def __init__(self):
        super().__init__()
        self._registered = []  # (weak reference to a live cache of this engine, its head size)

    def allocate(self, buffer, spec):
        cache = super().allocate(buffer, spec)
        self._registered = [(ref, d) for ref, d in self._registered if ref() is not None] + [(weakref.ref(cache), spec.geometry.head_size)]
        return cache

    def _spec(self, spec):
        first = next((d for ref, d in self._registered if ref() is not None), spec.geometry.head_size)
        return dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, head_size=first))

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, self._spec(spec), block_ids, heads)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, self._spec(spec), block_ids, wire, heads, num_tokens)


class ConnectorHandshakeAcceptsInexactFnuzScale(Gfx942Mutant):
    """The handshake compares fp8 formats, not scales: an e4m3fn peer is accepted by this
    e4m3fnuz engine at any scale ratio, though only consumer scales of twice the producer's
    convert exactly (F.21: NIXL's compatibility hash sees neither format nor scale)."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        formats = {local.get("fp8_format"), remote.get("fp8_format")}
        if formats == {"float8_e4m3fn", "float8_e4m3fnuz"}:  # "the same e4m3, up to the ×2 convention"
            factor = 0.5 if remote["fp8_format"] == "float8_e4m3fn" else 2.0
            remote = {**remote, "k_scale": local["k_scale"] * factor, "v_scale": local["v_scale"] * factor}
        return compat.check(remote, local)


class ConnectorRegionsDensePlaneBlockStride(Mutant):
    """Registers block ``b`` at ``b·page/2``: the block stride of a dense K/V plane, not the
    blocks-first stride that spans both (the kernel- vs manager-block stride confusion, F.20)."""

    catches = ("connector",)
    kills = ("test_block_regions_cover_exactly_the_requested_blocks",)

    def block_regions(self, cache, spec, block_ids, heads=None):
        g = spec.geometry
        half_page = spec.layout.strides(g)["B"] * g.element_size // 2
        regions = []
        for b in block_ids:
            regions += [(offset - int(b) * half_page, length) for offset, length in super().block_regions(cache, spec, [b], heads)]
        return regions


class ConnectorDescriptorGuessesLayoutFromShape(Mutant):
    """Describes the cache from its live shape: ``shape[0] == 2`` read as kv-first, which a
    blocks-first cache of two blocks also has (F.25, LMCache#2494)."""

    catches = ("connector",)
    kills = ("test_layout_descriptor_describes_the_allocated_cache",)

    def layout_descriptor(self, cache, spec, **rank):
        if cache.shape[0] == 2:
            spec = dataclasses.replace(spec, layout=R.kv_first("NHD"))
        return super().layout_descriptor(cache, spec, **rank)


def _naive_rank_heads(total: int, tp: int, rank: int) -> range:
    """``[r·K/T, (r+1)·K/T)`` with integer division: right when the heads split, empty or off for replicated ranks."""
    return range(rank * total // tp, (rank + 1) * total // tp)


class ConnectorHandshakeSlicesIgnoreReplication(Mutant):
    """Plans head slices with ``heads = [r·K/T, (r+1)·K/T)`` on both sides, the even-split formula
    without vLLM's replication branch: with more TP ranks than KV heads a rank holds an empty
    range, so some consumer ranks are sent nothing (issue #27, TP > H)."""

    catches = ("connector",)
    kills = ("test_handshake_plans_every_rank_pair_as_kvconform_compat_does",)

    def handshake(self, local, remote):
        verdict = compat.check(remote, local)
        if not verdict.compatible:
            return verdict
        p, c = verdict.plan.producer, verdict.plan.consumer
        total = c.total_kv_heads
        mine, theirs = _naive_rank_heads(total, c.tp_size, c.tp_rank), _naive_rank_heads(total, p.tp_size, p.tp_rank)
        slices = tuple(R.connector.HeadSlice(p.tp_rank, range(h - theirs.start, h - theirs.start + 1), range(i, i + 1))
                       for i, h in enumerate(mine) if h in theirs)
        return dataclasses.replace(verdict, plan=dataclasses.replace(verdict.plan, slices=slices))


class ConnectorHandshakeIgnoresLayerGrouping(Mutant):
    """Compares the per-layer page (block size, heads, head size, dtype, scales) and not how
    layers are allocated: a cross-layer producer (one allocation of every layer) is taken by a
    per-layer consumer, and the reverse, as if it were itself."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        verdict = compat.check(remote, local)
        return compat.check(local, local) if verdict.kind == "layers" else verdict


class ConnectorHandshakeKScaleOnly(Mutant):
    """Judges the fp8 hand-off by ``k_scale`` alone and applies K's value ratio to V as well: a
    peer whose V is scaled apart from K is planned at the wrong V ratio (or refused/accepted for K's sake)."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        if local.get("k_scale") is None or remote.get("k_scale") is None:
            return compat.check(remote, local)
        return compat.check({**remote, "v_scale": remote["k_scale"]}, {**local, "v_scale": local["k_scale"]})


def _physical_shape(descriptor: dict) -> tuple[int, ...]:
    endpoint = compat.parse(descriptor)
    return tuple(endpoint.geometry.extent(s.split(":")[0]) for s in endpoint.layout.k_dims)


class ConnectorHandshakeLayoutByShape(Mutant):
    """Takes a peer whose cache tensor has its own shape for its own layout: at 2 KV heads vLLM's
    packed K‖V E3 spec and the 2-slot spec are both ``[L, B, 2, N, 2·D]`` (LMCache#4467), and the
    plan ships regions where the bytes sit elsewhere."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        if local.get("dims") != remote.get("dims") and _physical_shape(local) == _physical_shape(remote):
            same = ("dims", "strides", "v_dims", "v_strides", "block_pad", "tile", "layout", "era", "alias")
            remote = {**remote, **{k: local.get(k) for k in same}}
        return compat.check(remote, local)


class ConnectorImportBytesOfAnotherDtype(Mutant):
    """Imports a wire of another fp8 format byte for byte (the element sizes agree): an e4m3fn
    wire lands in an e4m3fnuz cache as fnuz codes (every value halved, −0 a NaN), e5m2 in e4m3."""

    catches = ("connector",)
    kills = ("test_a_wire_of_another_dtype_is_refused_or_converted_exactly",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        g = spec.geometry
        if wire.geometry.dtype != g.dtype and wire.geometry.element_size == g.element_size:
            wire = dataclasses.replace(wire, geometry=dataclasses.replace(wire.geometry, dtype=g.dtype))
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


class ConnectorMultiHeadSliceHeadMajor(Mutant):
    """Lands a slice of two or more heads on a token-major (NHD) cache head-major: the wire's
    ``[N][h][D]`` rows read as ``[h][N][D]`` (right for one head, and for the whole rank)."""

    catches = ("connector",)
    kills = ("test_resharding_gives_every_consumer_rank_exactly_its_heads", "test_hybrid_model_groups_round_trip_each_with_its_own_geometry")

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        if _proper_slice(heads, spec) and len(heads) >= 2 and _as_if_head_major(spec.layout) != spec.layout:
            wire = dataclasses.replace(wire, layout=_as_if_head_major(wire.layout))
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


class ConnectorExportHeadRangeFromFirstHead(Mutant):
    """Exports heads ``[h0, h1)`` as the first ``h1 - h0`` heads: the slice's length is right, its
    start offset forgotten (a pointer advanced by the block but not by ``h0``)."""

    catches = ("connector",)
    kills = ("test_exported_head_ranges_import_bit_for_bit", "test_resharding_gives_every_consumer_rank_exactly_its_heads")

    def export_blocks(self, cache, spec, block_ids, heads=None):
        if heads is not None and len(heads) and heads[0] > 0:
            heads = range(0, len(heads))
        return super().export_blocks(cache, spec, block_ids, heads)


class ConnectorHybridGroupFirstBlockSize(ConnectorHybridGroupOtherHeadSize):
    """Ships every layer group with the block size of the first cache the engine registered (one
    ``block_len`` for all groups): a hybrid model's second group, of another block size, is
    cut at the first group's token count per block."""

    kills = ("test_hybrid_model_groups_round_trip_each_with_its_own_geometry",)

    def allocate(self, buffer, spec):
        cache = Mutant.allocate(self, buffer, spec)
        self._registered = [(ref, n) for ref, n in self._registered if ref() is not None] + [(weakref.ref(cache), spec.geometry.block_size)]
        return cache

    def _spec(self, spec):
        first = next((n for ref, n in self._registered if ref() is not None), spec.geometry.block_size)
        return dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, block_size=first))


class ConnectorRegionsRepeatARun(Mutant):
    """Reports the last run of every region list twice (a K/V loop that appends its final region
    again): every byte is there, some twice — a transfer ships them twice and the byte counts of
    the two sides disagree."""

    catches = ("connector",)
    kills = ("test_block_regions_cover_exactly_the_requested_blocks", "test_resharding_gives_every_consumer_rank_exactly_its_heads",
             "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says")

    def block_regions(self, cache, spec, block_ids, heads=None):
        regions = super().block_regions(cache, spec, block_ids, heads)
        return regions + regions[-1:]


# Per block: every layer, K then V, [H][N][D] — a head-major wire form.
HEAD_MAJOR_WIRE = R.layouts.permuted("WIRE", "head-major", (("B",), ("L",), ("2",), ("H",), ("N",), ("D",)), range(6))


class ConnectorImportAssumesOwnWireLayout(Mutant):
    """Declares a head-major wire form and reads every wire it receives in that form, whatever
    the wire says: its own exports round-trip, a peer's canonical wire lands scrambled (seen only
    as a consumer of another endpoint: the interop row's received cells)."""

    catches = ("connector",)
    kills = ("test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says",)

    def wire_layout(self, spec):
        return HEAD_MAJOR_WIRE

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, spec, block_ids, dataclasses.replace(wire, layout=HEAD_MAJOR_WIRE), heads, num_tokens)


class E5m2CacheWrittenAsE4m3(Mutant):
    """An ``fp8_e5m2`` cache written with the platform's e4m3 codes (vLLM 0.33.0's TRITON_ATTN and
    Triton flash writer view every fp8 cache as ``current_platform.fp8_dtype()``: seen on the
    H200, docs/VLLM.md). The bytes are e4m3 while the cache says e5m2 (−2.75: e4m3fn c3, e5m2 c2)."""

    catches = ("write", "equivalence")

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        g = spec.geometry
        if g.dtype != torch.float8_e5m2:
            return super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        as_e4m3 = dataclasses.replace(g, dtype=self.cache_dtype("fp8_e4m3", spec.model_dtype))
        rows = [R.ops.encode(x, as_e4m3, scale, head_dim=1).view(torch.uint8).view(g.dtype) for x, scale in ((key, k_scale), (value, v_scale))]
        place_rows(cache, spec, slot_mapping, rows)


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
    "selector_ignores_connector": SelectorIgnoresConnector,
    "validate_drops_connector_flag": ValidateDropsConnectorFlag,
    "blocks_first_denies_connector": BlocksFirstDeniesConnector,
    "write_block_size_from_wrong_dim": BlockSizeFromWrongDim,
    "write_tokens_from_key_rows": TokensFromKeyRows,
    "write_k_scale_for_v": KScaleForVOnWrite,
    "fp8_truncates_instead_of_rne": TruncatingFp8,
    "fn_to_fnuz_without_negative_zero_fix": FnToFnuzWithoutNegativeZeroFix,
    "fnuz_read_as_fn": FnuzReadAsFn,
    "write_scribbles_past_the_end": ScribblesPastTheEnd,
    "write_int32_offset_wraparound": Int32OffsetWraparound,
    "write_one_bit_flipped": OneByteFlipped,
    "kv_first_shape_declared_blocks_first": KvFirstShapeDeclaredBlocksFirst,
    "validate_rejects_declared_head_size": ValidateRejectsDeclaredHeadSize,
    "decode_ignores_block_table": DecodeIgnoresBlockTable,
    "copy_blocks_dense_plane_stride": CopyBlocksDensePlaneStride,
    "swap_k_view_block_bytes": SwapKViewBlockBytes,
    "swap_only_below_two": SwapOnlyBelowTwo,
    "shuffle_dense_block_stride": ShuffleDenseBlockStride,
    "e3_cross_layer_packed_layer_outermost": CrossLayerPackedLayerOutermost,
    "fp8_nan_saturates_to_max": Fp8NanSaturatesToMax,
    "fp8_near_ties_rounded_as_ties": Fp8NearTiesRoundedAsTies,
    "write_block_index_by_shift": BlockIndexByShift,
    "write_head_stride_power_of_two": HeadStridePowerOfTwo,
    "swap_block_bytes_for_two_byte_elements": SwapBlockBytesForTwoByteElements,
    "swap_byte_offsets_int32": SwapByteOffsetsInt32,
    "copy_blocks_16_bit_ids": CopyBlocks16BitIds,
    "swap_16_bit_ids": Swap16BitIds,
    "decode_int32_offsets": DecodeInt32Offsets,
    "write_ignores_layer": WriteIgnoresLayer,
    "decode_reads_first_layer": DecodeReadsFirstLayer,
    "block_copies_first_layer_only": BlockCopiesFirstLayerOnly,
    "split_v_offset_for_two_byte_elements": SplitVOffsetForTwoByteElements,
    "connector_head_slice_off_by_one": ConnectorHeadSliceOffByOne,
    "connector_nhd_slice_as_hnd": ConnectorNhdSliceAsHnd,
    "connector_wire_casts_values": ConnectorWireCastsValues,
    "connector_import_into_a_copy": ConnectorImportIntoACopy,
    "connector_reblock_drops_last_partial_block": ConnectorReblockDropsLastPartialBlock,
    "connector_hybrid_group_other_head_size": ConnectorHybridGroupOtherHeadSize,
    "connector_handshake_accepts_inexact_fnuz_scale": ConnectorHandshakeAcceptsInexactFnuzScale,
    "connector_regions_dense_plane_block_stride": ConnectorRegionsDensePlaneBlockStride,
    "connector_descriptor_guesses_layout_from_shape": ConnectorDescriptorGuessesLayoutFromShape,
    "connector_handshake_slices_ignore_replication": ConnectorHandshakeSlicesIgnoreReplication,
    "connector_handshake_ignores_layer_grouping": ConnectorHandshakeIgnoresLayerGrouping,
    "connector_handshake_k_scale_only": ConnectorHandshakeKScaleOnly,
    "connector_handshake_layout_by_shape": ConnectorHandshakeLayoutByShape,
    "connector_import_bytes_of_another_dtype": ConnectorImportBytesOfAnotherDtype,
    "connector_multi_head_slice_head_major": ConnectorMultiHeadSliceHeadMajor,
    "connector_export_head_range_from_first_head": ConnectorExportHeadRangeFromFirstHead,
    "connector_hybrid_group_first_block_size": ConnectorHybridGroupFirstBlockSize,
    "connector_regions_repeat_a_run": ConnectorRegionsRepeatARun,
    "connector_import_assumes_own_wire_layout": ConnectorImportAssumesOwnWireLayout,
    "fp8_e5m2_written_as_e4m3": E5m2CacheWrittenAsE4m3,
}
MUTANTS.update(LATENT_MUTANTS)  # latent caches (latent_mutants.py)
MUTANTS.update(QUANT_MUTANTS)  # per-token-head quantised caches (quant_mutants.py)
MUTANTS.update(INPUT_MUTANTS)  # ops that change their inputs (input_mutants.py, SPEC OP-INPUTS-UNCHANGED)
