"""Portable Triton backends: the cache ops of each backend family, on :mod:`triton_kernels`.

| backend            | cache tensor                | K/V the kernels get              | like                        |
|--------------------|-----------------------------|----------------------------------|-----------------------------|
| ``triton_flash``   | ``(B,2,N,H,D)`` NHD or HND  | ``unbind(1)`` views              | FLASH_ATTN / FlashInfer     |
| ``triton_unified`` | ``(B,2,N,H,D)`` NHD         | the 5-D cache, V by ``stride(1)``| ROCM_AITER_UNIFIED_ATTN     |
| ``triton_aiter``   | ``(B,2,N,H,D)`` container   | ``unbind(1)`` re-viewed as tiles | ROCM_AITER_FA, shuffle on   |
| ``triton_rocm_attn``| ``(2,B,N,H,D)`` container  | ``unbind(0)`` re-viewed legacy   | ROCM_ATTN (no connectors)   |

Runs compiled on NVIDIA/ROCm, and on CPU under ``TRITON_INTERPRET=1`` (set before Triton is
imported; kvconform's conftest does it when no GPU is present).
"""

from __future__ import annotations

import os

import torch
import triton

from kvconform import reference as R

from . import triton_kernels as K
from .contract import Backend, Capabilities
from .tensor_regions import IndexedView, regions_of


def _platform() -> str:
    if torch.version.hip:
        return "rocm"
    return "cuda" if torch.cuda.is_available() else "cpu"


class OnTriton(Backend):
    """What every portable Triton backend states of where it runs: the platform (the device its
    kernels compile for, or the CPU interpreter), its torch device, arch and versions. A subclass
    sets ``_capabilities`` after ``super().__init__()``."""

    _capabilities: Capabilities

    def __init__(self):
        self.platform = _platform()
        self.device = "cpu" if self.platform == "cpu" else "cuda"

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def versions(self):
        mode = "interpreted (TRITON_INTERPRET=1)" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"
        return {"torch": torch.__version__, "triton": triton.__version__, "triton_mode": mode}

    def arch(self):
        return device_arch(self.platform)


class TritonBackend(OnTriton):
    """Shared plumbing: allocation over the suite's buffer, block copies along the block dim."""

    form: int = K.STRIDED
    block_dim: int = 0  # the dim of the cache tensor that indexes blocks
    layouts: tuple = ()
    connector: bool = True
    standards = frozenset({"e1"})
    head_sizes = (64, 128)

    def __init__(self):
        super().__init__()
        self._capabilities = Capabilities(
            layouts=self.layouts, ops=frozenset({"write", "split", "swap", "copy", "decode", "regions"}),
            standards=self.standards, dtypes=(torch.bfloat16, torch.float16),
            kv_cache_dtypes=("auto", *R.fp8.KV_CACHE_DTYPES), head_sizes=self.head_sizes, block_sizes=(16, 32),
            num_kv_heads=(1, 2, 3), scale_types=("tensor", "head"),
        )

    def allocate(self, buffer, spec):
        shape, strides = spec.layout.view_shape_strides(spec.geometry)
        return buffer.view(spec.geometry.dtype).as_strided(shape, strides)

    def kernel_views(self, cache, spec):
        """The K and V tensors this backend's kernels take (default: ``unbind(1)``)."""
        return cache.unbind(1)

    def split(self, cache, spec):
        return self.kernel_views(cache, spec)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        k_cache, v_cache = self.kernel_views(cache, spec)
        K.reshape_and_cache(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale, form=self.form, block_size=spec.geometry.block_size, x=spec.geometry.x)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        k_cache, v_cache = self.kernel_views(cache, spec)
        g = spec.geometry
        return K.paged_decode(query, k_cache, v_cache, block_table, seq_lens, k_scale, v_scale, scale=scale, num_kv_heads=g.num_kv_heads, form=self.form, block_size=g.block_size, x=g.x)

    def _copy(self, src, dst, src_ids, dst_ids, spec):
        """Whole blocks along ``block_dim``; a kv-first block is two regions (its K and V planes)."""
        e = spec.geometry.element_size
        regions = 2 if self.block_dim == 1 else 1
        K.copy_blocks(
            src, dst, src_ids, dst_ids, block_bytes=src[0].stride(0) * e if regions == 2 else src.stride(0) * e,
            regions=regions, region_stride_bytes=src.stride(0) * e if regions == 2 else 0,
            src_block_stride_bytes=src.stride(self.block_dim) * e, dst_block_stride_bytes=dst.stride(self.block_dim) * e,
        )
        if src.is_cuda or dst.is_cuda:
            torch.cuda.synchronize()  # the host side is read/written by the device asynchronously

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        self._copy(cache, host_cache, src_ids, dst_ids, spec)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        self._copy(host_cache, cache, src_ids, dst_ids, spec)

    def copy_blocks(self, cache, block_mapping, spec):
        self._copy(cache, cache, block_mapping[:, 0], block_mapping[:, 1], spec)

    def block_regions(self, cache, spec, block_ids, heads=None):
        """What a connector registers for these blocks (heads): runs of the addresses the
        kernel views reach — blocks on their dim 0, heads on dim 2 (``(B, N, H, D)``) or dim 1
        (tiles ``[B, H, …]``)."""
        head_dim = 2 if self.form == K.STRIDED else 1
        views = [IndexedView(view, 0, head_dim) for view in self.kernel_views(cache, spec)]
        return regions_of(views, cache, block_ids, heads)

    def supports_kv_connector(self):
        return self.connector


class TritonFlash(TritonBackend):
    """FLASH_ATTN / FlashInfer: blocks-first, NHD or HND, strides read from the views."""

    layouts = (R.blocks_first("NHD"), R.blocks_first("HND"))
    head_sizes = (64, 80, 128)


class TritonUnified(TritonBackend):
    """ROCM_AITER_UNIFIED_ATTN: blocks-first NHD; kernels index the 5-D cache, V via ``stride(1)``."""

    layouts = (R.blocks_first("NHD"),)

    def kernel_views(self, cache, spec):
        # The kernel receives the whole cache; V's base is one kv stride further, same strides.
        k = cache.select(1, 0)
        v = cache.as_strided(k.shape, k.stride(), cache.storage_offset() + cache.stride(1))
        return k, v


class TritonAiter(TritonBackend):
    """ROCM_AITER_FA with the shuffled layout, written through ``unbind(1)`` views of a
    blocks-first cache with explicit K and V block strides (2× the plane, PR #43660)."""

    form = K.X_TILES
    layouts = (R.aiter_shuffle("blocks_first"),)

    def kernel_views(self, cache, spec):
        g = spec.geometry
        B, N, H, D, x = g.num_blocks, g.block_size, g.num_kv_heads, g.head_size, g.x
        k, v = cache.unbind(1)  # (B, N, H, D) containers, stride(0) = 2·N·H·D
        # Each side's (N, H, D) tail is dense, so these re-views are views, never copies (F.6).
        k = k.reshape(B, N * H * D).view(B, H, D // x, N, x)
        v = v.reshape(B, N * H * D).view(B, H, N // x, D, x)
        return k, v


class TritonRocmAttn(TritonBackend):
    """ROCM_ATTN: kv-first ``(2, B, N, H, D)`` planes re-viewed as the legacy paged layout
    (K ``[B,H,D/x,N,x]``, V ``[B,H,D,N]``); not blocks-first, so no KV connector."""

    form = K.LEGACY
    block_dim = 1
    layouts = (R.legacy_paged(),)
    connector = False
    standards = frozenset()

    def kernel_views(self, cache, spec):
        g = spec.geometry
        B, N, H, D, x = g.num_blocks, g.block_size, g.num_kv_heads, g.head_size, g.x
        k, v = cache.unbind(0)
        return k.view(B, H, D // x, N, x), v.view(B, H, D, N)


def device_arch(platform: str) -> str:
    """The GPU architecture a backend of ``platform`` runs on here: ``gfx942``, ``sm90``, or '' on the CPU."""
    if platform == "rocm":
        return torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    if platform == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return f"sm{major}{minor}"
    return ""
