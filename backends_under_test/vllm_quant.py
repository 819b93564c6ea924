"""vLLM 0.33.0 TRITON_ATTN's per-token-head quantised caches through the ``vllm:`` adapter (SPEC §16 PTH-*).

``int8_per_token_head`` / ``fp8_per_token_head`` keep, per (head, slot), ``[K | K scale | V | V scale]``
with float32 scales carved from the page. Nothing is re-implemented; the adapter calls:

| what the checks exercise | the vLLM code called                                                        |
|--------------------------|-----------------------------------------------------------------------------|
| modes                    | ``supported_kv_cache_dtypes``, ``get_kv_quant_mode``                         |
| allocation               | ``FullAttentionSpec`` (as ``Attention.get_kv_cache_spec``) → ``customize_spec`` |
|                          | (adds the scale bytes) → planner strides + ``create_kv_cache_views``        |
| a layer's first use      | its impl's ``_ensure_scale_caches`` (what ``do_kv_cache_update`` and        |
|                          | ``forward`` call first: scale views from the strides, every scale 1.0)     |
| write                    | the layer impl's ``do_kv_cache_update`` (Triton                              |
|                          | ``triton_reshape_and_cache_flash_per_token_head_quant``)                    |
| decode                   | the layer impl's ``forward`` (Triton ``unified_attention``, 2D kernel)       |
| copy, swap               | ``copy_kv_cache_blocks_inplace``; the platform's block swaps, per layer     |

One impl per layer of an allocation, as a model has: vLLM builds a layer's scale views once, on
that layer's first use, and keeps them (``_k_scale_cache``) until the worker drops the cache.
HND is vLLM's ``LBHNC``, NHD its ``LBNHC`` (layer-outermost, so a layer is one slab as
quant_layouts lays it out); the block-outermost layouts interleave layers per block, which
SPEC §16 does not lay out.
"""

from __future__ import annotations

import types

import torch
from kvconform.reference import quant_layouts as QL

from .quant_contract import QuantCapabilities, QuantOps, QuantSpec
from .vllm_base import (
    INTERPRETER_FP8,
    _real_code_path,
    _vllm_config,
    interpreted,
    stack_layer_views,
    worker_views,
)

MEMBERS = {"HND": "LBHNC", "NHD": "LBNHC"}  # SPEC §16 order -> vLLM KVCacheLayout member
QUANT_HEAD_SIZES = (64, 128)
# Not a per-token-head finding: under the interpreter forward gives ~1.05e9 where the reference
# gives |x| <= 7 (int8, both orders, MHA and GQA), and unified_attention's 2D kernel over a plain
# bf16 cache gives ~8e8 too (as TRITON_MLA's decode, vllm_mla.py); run compiled (the H200 command in
# docs/VLLM.md) to say whether the interpreter or the kernel is wrong.
INTERPRETED_DECODE = ("vLLM's Triton unified_attention returns values ~1e9 under the interpreter, over a per-token-head cache (~1.05e9) "
                      "and over a plain bf16 cache (~8e8) alike, where the reference gives |x| <= 7; not declared until a compiled run says whose it is")


def interpreter_drops(mode: str) -> bool:
    """fp8 codes are cast by Triton: under the interpreter the cast drops the rounding carry."""
    return interpreted() and mode == "fp8_per_token_head"


class VllmQuant(QuantOps):
    """The per-token-head half of a 0.33.0 K/V adapter (VllmE3Backend mixes it in)."""

    def _quant_capabilities(self) -> QuantCapabilities | None:
        """Declared when vLLM lists a mode SPEC §16 specifies and its customize_spec packs the scales inline."""
        listed = getattr(self.backend_cls, "supported_kv_cache_dtypes", [])
        modes = tuple(m for m in QL.PTH_MODES if m in listed and self._packs_scales(m) and not interpreter_drops(m))
        members = {m.name for m in self._members()}
        orders = tuple(o for o, member in MEMBERS.items() if member in members)
        heads = tuple(d for d in QUANT_HEAD_SIZES if d in self._head_sizes())
        if not (modes and orders and heads):
            return None
        ops = {"quant_write", "quant_copy"} | ({"quant_swap"} if self._swaps() else set()) | (set() if interpreted() else {"quant_decode"})
        return QuantCapabilities(modes=modes, orders=orders, ops=frozenset(ops), block_sizes=self._block_sizes()[:1], head_sizes=heads)

    def _packs_scales(self, mode: str) -> bool:
        probe = self._quant_vllm_spec(QL.QuantGeometry(num_blocks=1, block_size=16, num_kv_heads=1, head_size=64, mode=mode))
        return probe.state_content_bytes == QL.QuantGeometry(num_blocks=1, block_size=16, num_kv_heads=1, head_size=64, mode=mode).cell_bytes

    def quant_not_declared(self) -> list[str]:
        """Why a mode vLLM lists, or an op, is not declared here (versions())."""
        listed = getattr(self.backend_cls, "supported_kv_cache_dtypes", [])
        why = [f"{m}: {INTERPRETER_FP8}" for m in QL.PTH_MODES if m in listed and interpreter_drops(m)]
        why += [f"quant_decode: {INTERPRETED_DECODE}"] if interpreted() else []
        why += ["quant_regions: kvconform's vLLM adapter does not drive vLLM's connector for per-token-head caches"]
        return why + [f"{m}: SPEC §16 does not specify it" for m in listed if m.endswith("_per_token_head") and m not in QL.MODES]

    def _quant_vllm_spec(self, g: QL.QuantGeometry):
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
        from vllm.v1.kv_cache_interface import FullAttentionSpec, get_kv_quant_mode

        dtype = kv_cache_dtype_str_to_dtype(g.mode, types.SimpleNamespace(dtype=torch.bfloat16))
        raw = FullAttentionSpec(block_size=g.block_size, num_kv_heads=g.num_kv_heads, head_size=g.head_size, dtype=dtype,
                                kv_quant_mode=get_kv_quant_mode(g.mode))
        with self.mode():
            return self.backend_cls.customize_spec(raw)

    # ---------------------------------------------------------------- allocation
    def quant_allocate(self, buffer, spec: QuantSpec):
        """As the worker: planner strides and ``create_kv_cache_views`` over ``buffer`` in the
        order's layout, stacked ``[L, B, H, N, C]``; then layer ``spec.layer``'s first use."""
        from vllm.v1.kv_cache_layout import KVCacheLayout

        g = spec.geometry
        member = KVCacheLayout[MEMBERS[g.order]]
        names = [f"model.layers.{i}.attn" for i in range(g.num_layers)]
        views = worker_views(buffer, self._quant_vllm_spec(g), member, g.num_blocks, names, f"SPEC §16 for {g.short()}", exact=True)
        cache = stack_layer_views(views)
        self._layer_impl(cache, spec)
        return cache

    def _layer_impl(self, cache, spec: QuantSpec):
        """Layer ``spec.layer``'s impl, built (with its scale views: the layer's first use) the first
        time the layer is used, then kept, as a model keeps each layer's impl."""
        kv = cache[spec.layer]
        key = ("quant", kv.data_ptr(), tuple(kv.shape), kv.stride(), spec.geometry.mode)
        if key not in self._impls:
            g = spec.geometry
            args = (2 * g.num_kv_heads, g.head_size, g.head_size**-0.5, g.num_kv_heads, None, None, g.mode)
            with self.mode(), _real_code_path(), _vllm_config(g.block_size):
                impl = self.backend_cls.get_impl_cls()(*args)
                impl._ensure_scale_caches(kv)
            self._impls[key] = impl
        return self._impls[key]

    # ---------------------------------------------------------------- ops
    def quant_write(self, cache, key, value, slot_mapping, spec: QuantSpec):
        impl = self._layer_impl(cache, spec)
        ones = torch.ones(1, dtype=torch.float32, device=cache.device)
        with self.mode(), _real_code_path():
            impl.do_kv_cache_update(self.layer(ones, ones), key, value, cache[spec.layer], slot_mapping)

    def quant_decode(self, cache, query, block_table, seq_lens, spec: QuantSpec, *, scale):
        """One query token per sequence through ``forward``; no 3D split-softmax scratch, so
        ``unified_attention`` takes its 2D kernel."""
        from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

        impl = self._layer_impl(cache, spec)
        impl.scale = float(scale)
        S, device = query.shape[0], cache.device
        seq_lens = seq_lens.to(torch.int32)
        metadata = TritonAttentionMetadata(
            num_actual_tokens=S, max_query_len=1, query_start_loc=torch.arange(S + 1, dtype=torch.int32, device=device),
            max_seq_len=int(seq_lens.max()), seq_lens=seq_lens, block_table=block_table.to(torch.int32),
            slot_mapping=torch.full((S,), -1, dtype=torch.int64, device=device), seq_threshold_3D=None, num_par_softmax_segments=None,
            softmax_segm_output=None, softmax_segm_max=None, softmax_segm_expsum=None, causal=True)
        output = torch.empty_like(query)
        ones = torch.ones(1, dtype=torch.float32, device=device)
        with self.mode(), _real_code_path():
            impl.forward(self.layer(ones, ones), query, None, None, cache[spec.layer], metadata, output)
        return output

    def quant_copy(self, cache, block_mapping, spec: QuantSpec):
        from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

        pairs = [tuple(int(x) for x in row) for row in block_mapping.cpu()]
        with self.mode(), _real_code_path():
            copy_kv_cache_blocks_inplace(list(cache.unbind(0)), spec.geometry.num_blocks, pairs)

    def quant_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        to_host = dst_cache.device.type == "cpu" and src_cache.device.type != "cpu"
        move = self._platform_cls.swap_out_blocks_to_host if to_host or src_cache.device == dst_cache.device else self._platform_cls.insert_blocks_to_device
        with self.mode(), _real_code_path():
            for src, dst in zip(src_cache.unbind(0), dst_cache.unbind(0)):  # the worker swaps each layer's cache
                move(src, dst, src_ids, dst_ids)
