"""``triton_mla``: latent caches on kvconform's own portable Triton kernels (:mod:`triton_latent_kernels`).

The plain MLA cache (16-bit or per-tensor fp8), ``fp8_ds_mla`` records and the DSA indexer cache,
each in the tensor shape vLLM allocates (``LatentGeometry.shape()``); writers, gathers and MLA decode
are Triton kernels, block copies and swaps :func:`triton_kernels.copy_blocks` over whole blocks of
every layer. It keeps no K/V cache (``layouts=()``). Compiled on NVIDIA/ROCm, interpreted on CPU
(``TRITON_INTERPRET=1``); the record's fp8 variant and scale divisor follow the platform it runs on.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from . import triton_kernels as KV
from . import triton_latent_kernels as K
from .contract import Capabilities
from .latent_contract import LatentCapabilities, LatentSpec
from .reference_mla import latent_formats  # the kernels write and read every format the reference declares
from .triton_backends import OnTriton

# Every latent op but the connector's TP plan (a connector's decision, not a kernel's).
OPS = frozenset({"latent_write", "latent_grouped_write", "latent_gather", "latent_decode", "latent_copy", "latent_swap",
                 "indexer_write", "indexer_gather", "latent_regions"})


class TritonMLA(OnTriton):
    name = "triton_mla"

    def __init__(self):
        super().__init__()
        self._capabilities = Capabilities(
            layouts=(), ops=frozenset(),
            latent=LatentCapabilities(formats=latent_formats(self.platform, self.arch()), ops=OPS, block_sizes=(16, 64), num_layers=(1, 3)),
        )

    def allocate(self, buffer, spec):
        raise NotImplementedError("triton_mla keeps latent caches only")

    def latent_allocate(self, buffer, spec: LatentSpec):
        return buffer.view(spec.fmt.storage_dtype()).view(spec.geometry.shape())

    @staticmethod
    def _layer(cache: torch.Tensor, spec: LatentSpec) -> torch.Tensor:
        """The ``[B, N, entry]`` tensor of the layer the op acts on."""
        return cache[spec.layer] if spec.geometry.num_layers > 1 else cache

    @staticmethod
    def _scale(scale, like: torch.Tensor) -> torch.Tensor:
        """A per-tensor float32 scale on the cache's device (None: 1.0, vLLM's ``skip_scale``)."""
        return torch.as_tensor(1.0 if scale is None else scale, dtype=torch.float32, device=like.device).reshape(1)

    @staticmethod
    def _form(fmt) -> int:
        if fmt.kind == "fp8_ds_mla":
            return K.DS_MLA
        return K.PLAIN16 if fmt.cache_dtype == "auto" else K.PLAIN_FP8

    @staticmethod
    def _codes(fmt) -> torch.dtype | None:
        """The dtype of the record's fp8 codes (None: a 16-bit plain cache)."""
        if fmt.kind == "mla":
            return None if fmt.cache_dtype == "auto" else fmt.storage_dtype()
        return fmt.e4m3.dtype

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        fmt, layer = spec.fmt, self._layer(cache, spec)
        if fmt.kind == "fp8_ds_mla":
            policy = R.latent.ScalePolicy.ds_mla("0.33.0", self.platform, self.arch())
            K.concat_and_cache_ds_mla(kv_c, k_pe, layer, slot_mapping, code_dtype=fmt.e4m3.dtype, divisor=policy.divisor,
                                      floor=policy.floor, pow2=policy.pow2)
        else:
            K.concat_and_cache_mla(kv_c, k_pe, layer, slot_mapping, self._scale(scale, cache), code_dtype=self._codes(fmt))

    def latent_grouped_write(self, per_layer_cache, kv_cs, k_pes, slot_mappings, specs, *, scales):
        """``concat_and_cache_mla_grouped`` as one launch of the MLA writer per layer (vLLM's kernel takes
        the layers as a second grid axis over an array of cache pointers; the bytes are the same)."""
        for layer, (cache, spec) in enumerate(zip(per_layer_cache, specs)):
            self.latent_write(cache, kv_cs[layer], k_pes[layer], slot_mappings[layer][: kv_cs[layer].shape[0]], spec,
                              scale=None if scales is None else scales[layer : layer + 1])

    def indexer_write(self, cache, k, slot_mapping, spec):
        fmt = spec.fmt
        policy = R.latent.ScalePolicy.indexer(fmt.scale_format, self.platform, self.arch())
        K.indexer_k_quant_and_cache(k, self._layer(cache, spec), slot_mapping, code_dtype=fmt.e4m3.dtype, mx=fmt.scale_format == "mx",
                                    divisor=policy.divisor, floor=policy.floor, pow2=policy.pow2)

    def latent_gather(self, cache, block_table, seq_lens, spec, *, scale):
        fmt = spec.fmt
        return K.gather_latent(self._layer(cache, spec), block_table, seq_lens, self._scale(scale, cache), form=self._form(fmt),
                               rank=fmt.kv_lora_rank, rope=fmt.rope_dim, model_dtype=fmt.model_dtype, code_dtype=self._codes(fmt))

    def indexer_gather(self, cache, block_table, seq_lens, spec):
        return K.gather_indexer(self._layer(cache, spec), block_table, seq_lens, head_dim=spec.fmt.kv_lora_rank)

    def latent_decode(self, query, cache, block_table, seq_lens, spec, *, scale, softmax_scale):
        fmt = spec.fmt
        return K.mla_decode(query, self._layer(cache, spec), block_table, seq_lens, self._scale(scale, cache), softmax_scale=softmax_scale,
                            form=self._form(fmt), rank=fmt.kv_lora_rank, rope=fmt.rope_dim, code_dtype=self._codes(fmt))

    def _copy(self, src, src_spec, dst, dst_spec, src_ids, dst_ids):
        """Whole blocks, layer by layer (each layer's blocks are one contiguous run of ``block_bytes``)."""
        size = src_spec.geometry.block_bytes()
        for layer in range(src_spec.geometry.num_layers):
            src_layer, dst_layer = (self._layer(c, LatentSpec(geometry=s.geometry, layer=layer)) for c, s in ((src, src_spec), (dst, dst_spec)))
            KV.copy_blocks(src_layer, dst_layer, src_ids, dst_ids, block_bytes=size, regions=1, region_stride_bytes=0,
                           src_block_stride_bytes=size, dst_block_stride_bytes=size)
        if src.is_cuda or dst.is_cuda:
            torch.cuda.synchronize()  # the host side is read/written by the device asynchronously

    def latent_copy(self, cache, block_mapping, spec):
        src, dst = block_mapping[:, 0], block_mapping[:, 1]
        if set(src.tolist()) & set(dst.tolist()):
            # A block both read and written: every source is read before any destination is written,
            # through a staging cache (the kernel's programs run in no fixed order).
            staging = LatentSpec(geometry=dataclasses.replace(spec.geometry, num_blocks=len(src)))
            staged = self.latent_allocate(torch.empty(staging.geometry.nbytes(), dtype=torch.uint8, device=cache.device), staging)
            staged_ids = torch.arange(len(src), device=cache.device)
            self._copy(cache, spec, staged, staging, src, staged_ids)
            self._copy(staged, staging, cache, spec, staged_ids, dst)
        else:
            self._copy(cache, spec, cache, spec, src, dst)

    def latent_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        self._copy(src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids)

    def latent_regions(self, spec, blocks, heads=None):
        """Whole blocks of every layer, from the strides of the tensor :meth:`latent_allocate` makes."""
        if heads is not None:
            raise ValueError("a latent cache is replicated across TP ranks: it has no head slice (LATENT-TP-SOURCE)")
        g = spec.geometry
        shape = g.shape() if g.num_layers > 1 else (1, *g.shape())
        strides = torch.empty(shape, dtype=spec.fmt.storage_dtype(), device="meta").stride()
        item = spec.fmt.storage_dtype().itemsize
        return [(layer * strides[0] * item + int(b) * strides[1] * item, strides[1] * item)
                for b in torch.as_tensor(blocks).flatten().tolist() for layer in range(g.num_layers)]
