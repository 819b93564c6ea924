"""vLLM's MLA and sparse-MLA backends as latent-cache backends (``--backend vllm:NAME``, SPEC §17).

An MLA member keeps one latent record per token (``kv_lora_rank + rope_dim`` values, or the
656-byte ``fp8_ds_mla`` record), no K/V planes: the adapter declares ``layouts=()`` and
``Capabilities.latent``. Everything is read from vLLM's own code at run time, nothing re-implemented:

| what the checks exercise | the vLLM code called                                                    |
|--------------------------|-------------------------------------------------------------------------|
| record formats           | ``supported_kv_cache_dtypes``, ``get_supported_head_sizes``             |
| block sizes              | ``get_supported_kernel_block_sizes`` / ``supports_block_size``          |
| allocation               | ``MLAAttentionSpec`` (as ``MLAAttention.get_kv_cache_spec`` builds it) → |
|                          | ``customize_spec`` → planner strides + ``create_kv_cache_views`` →      |
|                          | ``squeeze(1)`` (``MLAAttention.bind_kv_cache``)                         |
| latent write             | the impl's ``do_kv_cache_update`` (compiled ``concat_and_cache_mla``;   |
|                          | CPU_MLA's torch path; AMX_MLA's compiled ``amx_mla_concat_and_cache``)  |
| latent gather            | ``ops.gather_and_maybe_dequant_cache`` (MLA prefill's context gather)   |
| latent decode            | TRITON_MLA / CPU_MLA ``forward_mqa`` (Triton ``decode_attention_fwd`` / |
|                          | compiled ``mla_decode_kvcache_cpu``)                                    |
| indexer write / gather   | ``ops.indexer_k_quant_and_cache`` / ``cp_gather_indexer_k_quant_cache``; |
|                          | ROCm: ``indexer_k_quant_and_cache_triton``                              |
| copy, swap               | ``copy_kv_cache_blocks_inplace``; the platform's block swaps           |

A path that needs a compiled op this build lacks is not applicable naming the op, as for K/V.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types

import torch

from kvconform import reference as R

from .contract import BackendOutOfScope, Capabilities, OpUnavailable
from .latent_contract import LatentCapabilities, LatentSpec
from .vllm_base import (
    BUILD,
    INTERPRETER_FP8,
    VllmBackend,
    _real_code_path,
    _unavailable,
    _vllm_config,
    interpreted,
    worker_views,
)

ROPE_DIM = 64  # every MLA model vLLM 0.33.0 serves (DeepSeek V2/V3/V3.2/V4, Kimi-K2, GLM) ropes 64 dims
DEFAULT_HEAD_SIZE = 576  # what MLAAttention gets for DeepSeek V3 (512 + 64) when a member lists no head size
PLAIN = ("auto",)  # the model dtype: "bfloat16"/"float16" name the same record for their model dtype
FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")
DS_MLA = "fp8_ds_mla"
BLOCK_CANDIDATES = (16, 32, 64)  # for MultipleOf(b): the sizes vLLM's supports_block_size accepts
INDEXER_HEAD_DIM = 128  # DeepSeek V3.2's index_head_dim (config.json), the only indexer vLLM 0.33.0's sparse members serve
INDEXER_SCALE = "ue8m0"  # its scale_fmt (config.json), which sparse_attn_indexer.py passes to the writer on every platform
# forward_mqa of these reads only MLACommonMetadata's decode fields; every other member's decode
# needs its own kernel's scheduling metadata (FlashMLA tile scheduler, FlashInfer plans, AITER work
# buffers), which the adapter does not build.
DECODES = ("TRITON_MLA", "CPU_MLA")
# Not attributed yet: the same call outside the suite (20 bf16 tokens, 2 heads) gives ~8e8 where
# torch gives at most 2; run compiled (H200) before blaming vLLM or Triton.
INTERPRETED_TRITON_MLA_DECODE = ("vLLM's Triton MLA decode (decode_attention_fwd, is_mla=True) returns values ~8e8 under "
                                 "the interpreter where a torch reference gives |x| <= 2; not declared until a compiled run says whose it is")
# Where a member's indexer cache is written: vLLM's sparse members keep DeepSeek V3.2's indexer
# (sparse_attn_indexer.py), ROCm through its own Triton writer.
ROCM_INDEXER = "vllm.v1.attention.ops.rocm_aiter_mla_sparse"


def is_mla(backend_cls) -> bool:
    value = getattr(backend_cls, "is_mla", False)
    return bool(value() if callable(value) else value)


class VllmMLABackend(VllmBackend):
    """One vLLM MLA member: a latent cache per layer, ``[B, N, entry]`` as MLAAttention binds it."""

    def _block_copy_platform(self):
        name = self.vllm_name
        if name.startswith("ROCM_"):
            return importlib.import_module("vllm.platforms.rocm").RocmPlatform
        if name.startswith(("CPU_", "AMX_")):
            return importlib.import_module("vllm.platforms.cpu").CpuPlatform
        if name.startswith(("TRITON_", "XPU_")):  # Triton: any platform; XPU's platform does not import without its runtime
            from vllm.platforms import current_platform

            return type(current_platform)
        return importlib.import_module("vllm.platforms.cuda").CudaPlatform  # FlashMLA, FlashInfer, CUTLASS, FA, TokenSpeed: NVIDIA

    def undeclared_op(self, op):
        if op == "latent_decode" and interpreted() and self.vllm_name == "TRITON_MLA":
            return "Triton's interpreter (TRITON_INTERPRET=1)", INTERPRETED_TRITON_MLA_DECODE
        if op == "latent_decode":
            return (f"kvconform's vLLM adapter (backend {self.name})",
                    f"does not build {self.vllm_name}'s own decode scheduling metadata, so its forward_mqa is not driven")
        if op in ("latent_regions", "latent_plan"):
            return f"kvconform's vLLM adapter (backend {self.name})", "does not drive vLLM's connector for latent caches"
        if op in ("indexer_write", "indexer_gather"):
            return f"vLLM {self._version} {self.vllm_name}", "is not a sparse member: it keeps no indexer cache"
        return super().undeclared_op(op)

    # ---------------------------------------------------------------- declarations
    def _declare(self) -> Capabilities:
        try:
            self.backend_cls.get_impl_cls()
        except NotImplementedError as exc:  # DeepSeek V4/V4.1: the model's own attention layer keeps the cache
            raise BackendOutOfScope(
                f"is vLLM's {self.vllm_name}, which has no attention impl ({exc}): the model's layer builds and writes its "
                "cache (DeepseekV4Attention.get_kv_cache_spec: one state per compress_ratio tokens, a 584-byte fp8_ds_mla record), "
                "a latent format SPEC §17 does not define"
            ) from exc
        sparse = bool(self.backend_cls.is_sparse())
        ops = {"latent_write", "latent_gather", "latent_copy"} | ({"latent_swap"} if self._swaps() else set())
        ops |= {"latent_decode"} if self.vllm_name in DECODES and not (interpreted() and self.vllm_name == "TRITON_MLA") else set()
        formats = self._formats()
        if sparse:
            ops |= {"indexer_write", "indexer_gather"}
            formats += self._indexer_formats()
        return Capabilities(layouts=(), ops=frozenset(), standards=frozenset(),
                            latent=LatentCapabilities(formats=tuple(formats), ops=frozenset(ops), block_sizes=self._latent_block_sizes()))

    def _head_size(self) -> int:
        listed = self.backend_cls.get_supported_head_sizes()
        return DEFAULT_HEAD_SIZE if not listed or DEFAULT_HEAD_SIZE in listed else max(listed)

    def _model_dtypes(self):
        return super()._model_dtypes() or (torch.bfloat16,)

    def _formats(self) -> list:
        """A record format per cache dtype vLLM lists that kvconform specifies (the others are
        named in ``versions()['vllm_unspecified_cache_dtypes']``)."""
        listed = list(self.backend_cls.supported_kv_cache_dtypes)
        rank = self._head_size() - ROPE_DIM
        model = self._model_dtypes()[0]
        plain = [d for d in PLAIN if d in listed] or [d for d in ("bfloat16", "float16") if d in listed][:1]
        fp8 = [d for d in FP8 if d in listed]  # written by compiled ops (no interpreter cast); TRITON_MLA decode only reads them
        formats = [R.latent.LatentFormat(kind="mla", kv_lora_rank=rank, rope_dim=ROPE_DIM, cache_dtype=d if d in FP8 else "auto",
                                         model_dtype=model, **self._runs_on()) for d in plain + fp8]
        if DS_MLA in listed:
            formats.append(R.latent.LatentFormat(kind=DS_MLA, cache_dtype=DS_MLA, model_dtype=torch.bfloat16, **self._runs_on()))
        return formats

    def _indexer_formats(self) -> list:
        return [R.latent.LatentFormat(kind="indexer", kv_lora_rank=INDEXER_HEAD_DIM, rope_dim=0, cache_dtype="fp8", scale_format=INDEXER_SCALE,
                                      **self._runs_on())]

    def _runs_on(self) -> dict:
        """The platform and arch of the device vLLM runs on here: they pick the fp8 variant
        (current_platform.fp8_dtype()), whichever hardware the member was written for."""
        device = self._device_platform()
        if device == "rocm" and not torch.cuda.is_available():
            from vllm.platforms import rocm

            return {"platform": device, "arch": rocm._GCN_ARCH.split(":")[0]}
        return {"platform": device, "arch": VllmBackend.arch(self) if device == self.platform else ""}

    def unspecified_cache_dtypes(self) -> list[str]:
        known = set(PLAIN) | {"bfloat16", "float16"} | set(FP8) | {DS_MLA}
        return [d for d in self.backend_cls.supported_kv_cache_dtypes if d not in known]

    def _latent_block_sizes(self) -> tuple[int, ...]:
        """The kernel block sizes vLLM lists (fixed sizes as listed; ``MultipleOf(b)`` as the
        sizes of BLOCK_CANDIDATES it accepts), up to three."""
        listed = self.backend_cls.get_supported_kernel_block_sizes()
        fixed = [s for s in listed if isinstance(s, int) and s > 1]
        multiples = [s for s in BLOCK_CANDIDATES if any(not isinstance(e, int) for e in listed) and self.backend_cls.supports_block_size(s)]
        return tuple(dict.fromkeys(fixed + multiples))[:3] or (BLOCK_CANDIDATES[0],)

    def versions(self):
        unspecified = self.unspecified_cache_dtypes()
        return {**super().versions(), **({"vllm_unspecified_cache_dtypes": ", ".join(unspecified)} if unspecified else {})}

    # ---------------------------------------------------------------- allocation
    def mla_spec(self, spec: LatentSpec):
        """The layer's spec as ``MLAAttention.get_kv_cache_spec`` builds it, then ``customize_spec``."""
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
        from vllm.v1.kv_cache_interface import MLAAttentionSpec, get_kv_quant_mode

        fmt = spec.fmt
        if fmt.kind == "indexer":  # DeepseekV32IndexerCache.get_kv_cache_spec: uint8 records of D values + scales
            from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerBackend
            from vllm.v1.kv_cache_interface import SparseCacheRole

            raw = MLAAttentionSpec(block_size=spec.geometry.block_size, num_kv_heads=1, max_tp_shards=1, head_size=fmt.entry_bytes(),
                                   dtype=torch.uint8, cache_role=SparseCacheRole.INDEXER)
            with self.mode():
                return DeepseekV32IndexerBackend.customize_spec(raw)
        cache_dtype = fmt.cache_dtype
        dtype = kv_cache_dtype_str_to_dtype(cache_dtype, types.SimpleNamespace(dtype=fmt.model_dtype))
        raw = MLAAttentionSpec(block_size=spec.geometry.block_size, num_kv_heads=1, max_tp_shards=1, head_size=fmt.kv_lora_rank + fmt.rope_dim,
                               dtype=dtype, cache_dtype_str=cache_dtype, kv_quant_mode=get_kv_quant_mode(cache_dtype),
                               state_content_bytes={DS_MLA: 656, "nvfp4_ds_mla": 352}.get(cache_dtype))
        with self.mode():
            return self.backend_cls.customize_spec(raw)

    @functools.cached_property
    def _layout(self):
        from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts

        return get_supported_kv_cache_layouts([self.backend_cls])[0]  # the member's first preference (one layer: all agree)

    def allocate(self, buffer, spec):
        raise NotImplementedError(f"vllm:{self.vllm_name} keeps a latent cache: it declares no K/V layout to allocate")

    def latent_allocate(self, buffer, spec: LatentSpec):
        """As the worker: planner strides, ``create_kv_cache_views`` over ``buffer``, then the
        ``[B, H=1, N, C] → [B, N, C]`` squeeze of ``MLAAttention.bind_kv_cache``."""
        g = spec.geometry
        names = [f"model.layers.{i}.self_attn.attn" for i in range(g.num_layers)]
        views = worker_views(buffer, self.mla_spec(spec), self._layout, g.num_blocks, names, f"the reference record format of {g.short()}")
        if g.num_layers != 1:
            raise ValueError(f"vllm:{self.vllm_name} declares one layer per allocation; got {g.num_layers}")
        cache = views[0].squeeze(1)
        if spec.fmt.kind == "mla" and spec.fmt.cache_dtype in FP8:
            # The worker's buffer is uint8; MLAAttention.forward_impl views a quantized cache as
            # current_platform.fp8_dtype() for every fp8 cache dtype (mla_attention.py:957, :974-979).
            from vllm.platforms import current_platform

            cache = cache.view(current_platform.fp8_dtype())
        return cache

    @staticmethod
    def _as_written(cache):
        """The cache as update_kv_cache hands it to the writer: the worker's uint8 view for fp8."""
        return cache.view(torch.uint8) if cache.dtype.itemsize == 1 else cache

    # ---------------------------------------------------------------- the impl
    def mla_impl(self, spec: LatentSpec):
        """The member's MLA impl for this record format, as MLAAttention builds it (DeepSeek V3's
        head dims; no kv_b_proj: the cache ops never read the weights)."""
        fmt = spec.fmt
        key = (fmt.label(), spec.geometry.block_size)
        if key not in self._impls:
            impl_cls = self.backend_cls.get_impl_cls()
            head = fmt.kv_lora_rank + fmt.rope_dim
            args = {"num_heads": 16, "head_size": head, "scale": head**-0.5, "num_kv_heads": 1, "alibi_slopes": None, "sliding_window": None,
                    "kv_cache_dtype": fmt.cache_dtype, "logits_soft_cap": None, "attn_type": "decoder", "kv_sharing_target_layer_name": None,
                    "q_lora_rank": None, "kv_lora_rank": fmt.kv_lora_rank, "qk_nope_head_dim": 128, "qk_rope_head_dim": fmt.rope_dim,
                    "qk_head_dim": 128 + fmt.rope_dim, "v_head_dim": 128, "kv_b_proj": None}
            with self.mode(), _real_code_path(), _vllm_config(spec.geometry.block_size), self._foreign_impl(), self._outside_a_model():
                _single_rank_groups()  # sparse impls read their TP group, as in a one-GPU engine
                self._impls[key] = impl_cls(**args)
        return self._impls[key]

    @contextlib.contextmanager
    def _outside_a_model(self):
        """An impl whose ``__init__`` needs the model's own layers (kv_b_proj weights, the sparse
        indexer module) or an engine's workspace cannot be built by the adapter: not applicable,
        the adapter's limit."""
        try:
            yield
        except RuntimeError as exc:
            if " requires " not in str(exc):
                raise
            # vLLM's own refusal to build this impl on this machine (FLASHINFER_MLA_SPARSE_SM120 without
            # FlashInfer's sparse MLA API: the selector, validate_configuration, would not pick it either).
            raise OpUnavailable(f"vLLM refuses to build {self.vllm_name}'s impl here: {exc}", who="this machine") from exc
        except (AttributeError, TypeError, AssertionError) as exc:
            if _unavailable(exc) is not None:  # a machine's reason: _real_code_path names it
                raise
            raise OpUnavailable(f"builds {self.vllm_name}'s impl without a model or engine (kv_b_proj, indexer: None; no workspace manager); its __init__ raised "
                                f"{type(exc).__name__}: {exc}", who=f"kvconform's vLLM adapter (backend {self.name})") from exc

    # ---------------------------------------------------------------- ops
    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec: LatentSpec, *, scale):
        impl = self.mla_impl(spec)
        k_scale = (scale if scale is not None else torch.ones(1)).to(torch.float32).to(cache.device)
        with self.mode(), _real_code_path():
            # MLAAttention.update_kv_cache hands k_pe as [T, 1, P] and skips the scale for 1.0
            impl.do_kv_cache_update(kv_c, k_pe.unsqueeze(1), self._as_written(cache), slot_mapping, spec.fmt.cache_dtype, k_scale,
                                    spec.fmt.cache_dtype in FP8 and float(k_scale[0]) == 1.0)

    def latent_gather(self, cache, block_table, seq_lens, spec: LatentSpec, *, scale):
        """MLA prefill's context gather: ``gather_and_maybe_dequant_cache`` into a workspace."""
        from vllm import _custom_ops as ops

        fmt = spec.fmt
        seq_lens = seq_lens.to(torch.int32)
        cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=cache.device)
        cu[1:] = torch.cumsum(seq_lens, 0)
        out = torch.empty(int(cu[-1]), fmt.kv_lora_rank + fmt.rope_dim, dtype=fmt.model_dtype, device=cache.device)
        k_scale = (scale if scale is not None else torch.ones(1)).to(torch.float32).to(cache.device)
        token_to_seq = torch.repeat_interleave(torch.arange(len(seq_lens), dtype=torch.int32, device=cache.device), seq_lens)
        with self.mode(), _real_code_path():
            ops.gather_and_maybe_dequant_cache(cache, out, block_table.to(torch.int32), cu, token_to_seq, int(cu[-1]), fmt.cache_dtype, k_scale, None)
        return out

    def latent_decode(self, query, cache, block_table, seq_lens, spec: LatentSpec, *, scale, softmax_scale):
        """The member's ``forward_mqa`` with MLACommonMetadata's decode fields."""
        impl = self.mla_impl(spec)
        impl.scale = float(softmax_scale)
        k_scale = (scale if scale is not None else torch.ones(1)).to(torch.float32).to(cache.device)
        metadata = types.SimpleNamespace(decode=types.SimpleNamespace(block_table=block_table.to(torch.int32), seq_lens=seq_lens.to(torch.int32),
                                                                      dcp_tot_seq_lens=None),
                                         max_seq_len=int(seq_lens.max()), causal=True)
        layer = types.SimpleNamespace(_k_scale=k_scale, _k_scale_float=float(k_scale[0]))
        with self.mode(), _real_code_path():
            out, _ = impl.forward_mqa(query, cache, metadata, layer)
        return out

    def indexer_write(self, cache, k, slot_mapping, spec: LatentSpec):
        fmt = spec.fmt
        with self.mode(), _real_code_path():
            if self._device_platform() == "rocm":  # sparse_attn_indexer picks the writer by the platform it runs on
                if interpreted():
                    raise OpUnavailable(f"ROCm's indexer_k_quant_and_cache_triton casts to fp8 under TRITON_INTERPRET=1: {INTERPRETER_FP8}", who=BUILD)
                importlib.import_module(ROCM_INDEXER).indexer_k_quant_and_cache_triton(k, cache, slot_mapping, fmt.kv_lora_rank, fmt.scale_format)
            else:
                from vllm import _custom_ops as ops

                ops.indexer_k_quant_and_cache(k, cache, slot_mapping, fmt.kv_lora_rank, fmt.scale_format)

    def indexer_gather(self, cache, block_table, seq_lens, spec: LatentSpec):
        from vllm import _custom_ops as ops

        fmt = spec.fmt
        total = int(seq_lens.sum())
        values = torch.empty(total, fmt.kv_lora_rank, dtype=torch.uint8, device=cache.device)
        scales = torch.empty(total, fmt.entry_bytes() - fmt.kv_lora_rank, dtype=torch.uint8, device=cache.device)
        cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=cache.device)
        cu[1:] = torch.cumsum(seq_lens.to(torch.int32), 0)
        with self.mode(), _real_code_path():
            ops.cp_gather_indexer_k_quant_cache(cache, values, scales, block_table.to(torch.int32), cu)
        return values, scales

    def latent_copy(self, cache, block_mapping, spec: LatentSpec):
        from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

        pairs = [tuple(int(x) for x in row) for row in block_mapping.cpu()]
        with self.mode(), _real_code_path():  # the worker holds the [B, H=1, N, C] view
            copy_kv_cache_blocks_inplace([cache.unsqueeze(1)], spec.geometry.num_blocks, pairs)

    def latent_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        to_host = dst_cache.device.type == "cpu" and src_cache.device.type != "cpu"
        move = self._platform_cls.swap_out_blocks_to_host if to_host or src_cache.device == dst_cache.device else self._platform_cls.insert_blocks_to_device
        with self.mode(), _real_code_path():
            move(src_cache, dst_cache, src_ids, dst_ids)


@functools.cache
def _single_rank_groups() -> None:
    """vLLM's world and model-parallel groups of one rank (gloo, a file rendezvous), unless this
    process already has them: what a one-GPU engine sets up before it builds attention impls."""
    import tempfile

    from vllm.distributed import parallel_state as ps

    if ps.model_parallel_is_initialized():
        return
    with tempfile.NamedTemporaryFile(prefix="kvconform-vllm-", delete=False) as file:  # gloo's file store, kept for the process
        rendezvous = file.name
    ps.init_distributed_environment(world_size=1, rank=0, distributed_init_method=f"file://{rendezvous}", local_rank=0, backend="gloo")
    ps.ensure_model_parallel_initialized(1, 1)
