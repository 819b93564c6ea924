"""``vllm_ops:mla``: vLLM 0.33.0's compiled latent-cache kernels, called as vLLM's Python calls them.

The ops are vLLM's own ``csrc/cache_kernels.cu`` registered under ``torch.ops._C_cache_ops`` — by
vLLM's compiled extension where it is installed, else by the library
tests/real_kernels_gpu/build_cache_ops.py builds from the sdist (``$KVCONFORM_VLLM_CACHE_OPS``).
Each op is called with the arguments ``vllm/_custom_ops.py`` passes (int64 slot mappings, int32
block tables and ``cu_seq_lens``, fp8 caches as the uint8 view vLLM's writers get); nothing here
re-implements a kernel. No vLLM Python is needed: the adapter runs wherever the library loads on a
CUDA GPU.

Declared: the record formats the kernels take — plain MLA 576 wide (bf16, fp16, per-tensor fp8
e4m3 / e5m2; ``gather_and_maybe_dequant_cache`` accepts only head dims 320, 512 and 576),
``fp8_ds_mla`` (its gather ``cp_gather_and_upconvert_fp8_kv_cache`` writes bf16 only) and the
indexer cache with float32, UE8M0 and MX scales. Block copies and swaps are ``swap_blocks`` per
layer. MLA decode is not a cache op (FlashMLA and the others are separate libraries): not declared.
"""

from __future__ import annotations

import functools
import os

import torch

from kvconform import reference as R

from .contract import Backend, BackendUnavailable, Capabilities
from .latent_contract import LatentCapabilities, LatentSpec

ENV = "KVCONFORM_VLLM_CACHE_OPS"
OPS = ("concat_and_cache_mla", "gather_and_maybe_dequant_cache", "cp_gather_and_upconvert_fp8_kv_cache",
       "indexer_k_quant_and_cache", "cp_gather_indexer_k_quant_cache", "swap_blocks")
# indexer_k_quant_and_cache's scale_fmt argument per declared scale format (cache_kernels.cu:1961-1964:
# "mxfp8" packs UE8M0 bytes, "ue8m0" rounds the float32 scale up to 2^k, anything else keeps it).
SCALE_FMT = {"float32": "fp8", "ue8m0": "ue8m0", "mx": "mxfp8"}
INDEXER_QUANT_BLOCK = 128  # vLLM's indexer quantises its 128-value key in one group


def _ops():
    return torch.ops._C_cache_ops


@functools.cache
def load_ops() -> str:
    """Where ``torch.ops._C_cache_ops``'s latent kernels come from; raises BackendUnavailable when absent."""
    if not torch.cuda.is_available():
        raise BackendUnavailable("vLLM's compiled latent-cache kernels are CUDA kernels: this machine has no CUDA GPU")
    if not all(hasattr(_ops(), op) for op in OPS):
        path = os.environ.get(ENV)
        if not path:
            raise BackendUnavailable(f"vLLM's compiled cache ops are not loaded: set ${ENV} to the library "
                                     "tests/real_kernels_gpu/build_cache_ops.py builds from vLLM 0.33.0's sdist")
        torch.ops.load_library(path)
        missing = [op for op in OPS if not hasattr(_ops(), op)]
        if missing:
            raise BackendUnavailable(f"${ENV}={path} registers no torch.ops._C_cache_ops.{{{', '.join(missing)}}}")
        return f"{path}: vLLM 0.33.0's csrc/cache_kernels.cu built by kvconform"
    return "vLLM's compiled extension"


def kernel_formats(platform: str, arch: str) -> tuple:
    LF = R.latent.LatentFormat
    on = {"platform": platform, "arch": arch}
    return (
        LF(kind="mla", **on), LF(kind="mla", model_dtype=torch.float16, **on),
        LF(kind="mla", cache_dtype="fp8", **on), LF(kind="mla", cache_dtype="fp8_e4m3", **on), LF(kind="mla", cache_dtype="fp8_e5m2", **on),
        LF(kind="fp8_ds_mla", **on),
        *(LF(kind="indexer", scale_format=s, **on) for s in R.latent.INDEXER_SCALE_FORMATS),
    )


def _cu_seq_lens(seq_lens: torch.Tensor, device) -> torch.Tensor:
    lens = seq_lens.to(torch.int64).cpu()
    return torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(device, torch.int32)


class VllmOpsMLA(Backend):
    name = "vllm_ops:mla"
    platform = "cuda"
    device = "cuda"

    def __init__(self):
        self._source = load_ops()
        self._capabilities = Capabilities(
            layouts=(), ops=frozenset(),
            latent=LatentCapabilities(formats=kernel_formats(self.platform, self.arch()), block_sizes=(16, 64), num_layers=(1, 3),
                                      ops=frozenset({"latent_write", "latent_gather", "latent_copy", "latent_swap",
                                                     "indexer_write", "indexer_gather", "latent_regions"})),
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def versions(self):
        return {"torch": torch.__version__, "vllm_cache_ops": self._source}

    def arch(self) -> str:
        major, minor = torch.cuda.get_device_capability()
        return f"sm{major}{minor}"

    def allocate(self, buffer, spec):
        raise NotImplementedError("vllm_ops:mla keeps latent caches only")

    def latent_allocate(self, buffer, spec: LatentSpec):
        # vLLM allocates every fp8 cache as uint8 bytes; a plain fp8 MLA cache is then read as the
        # platform's fp8 dtype (MLAAttention.forward_impl's view), the dtype MLA-SHAPE names.
        return buffer.view(spec.fmt.storage_dtype()).view(spec.geometry.shape())

    @staticmethod
    def _layer(cache: torch.Tensor, spec: LatentSpec) -> torch.Tensor:
        """One layer's cache as vLLM's ops get it: fp8 caches as their uint8 bytes (the kernels check the dtype)."""
        layer = cache[spec.layer] if spec.geometry.num_layers > 1 else cache
        return layer.view(torch.uint8) if layer.element_size() == 1 else layer

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec: LatentSpec, *, scale):
        kv_cache_dtype = "fp8_ds_mla" if spec.fmt.kind == "fp8_ds_mla" else spec.fmt.cache_dtype
        # fp8_ds_mla computes its own tile scales; vLLM still passes the layer's k_scale (1.0).
        scale = torch.ones(1) if scale is None else scale
        _ops().concat_and_cache_mla(kv_c, k_pe, self._layer(cache, spec), slot_mapping.to(torch.int64), kv_cache_dtype,
                                    scale.to(cache.device, torch.float32))

    def indexer_write(self, cache, k, slot_mapping, spec: LatentSpec):
        _ops().indexer_k_quant_and_cache(k, self._layer(cache, spec), slot_mapping.to(torch.int64), INDEXER_QUANT_BLOCK,
                                         SCALE_FMT[spec.fmt.scale_format])

    def latent_gather(self, cache, block_table, seq_lens, spec: LatentSpec, *, scale):
        fmt, layer = spec.fmt, self._layer(cache, spec)
        total = int(seq_lens.sum())
        dst = torch.empty(total, fmt.kv_lora_rank + fmt.rope_dim, dtype=fmt.model_dtype, device=cache.device)
        table = block_table.to(cache.device, torch.int32)
        cu = _cu_seq_lens(seq_lens, cache.device)
        if fmt.kind == "fp8_ds_mla":
            _ops().cp_gather_and_upconvert_fp8_kv_cache(layer, dst, table, cu[:-1].contiguous(), len(seq_lens), None)
        else:
            token_to_seq = torch.repeat_interleave(torch.arange(len(seq_lens)), seq_lens.cpu().to(torch.int64)).to(cache.device, torch.int32)
            _ops().gather_and_maybe_dequant_cache(layer, dst, table, cu, token_to_seq, total, fmt.cache_dtype,
                                                  scale.to(cache.device, torch.float32), None)
        return dst

    def indexer_gather(self, cache, block_table, seq_lens, spec: LatentSpec):
        fmt = spec.fmt
        total = int(seq_lens.sum())
        values = torch.empty(total, fmt.kv_lora_rank, dtype=torch.uint8, device=cache.device)
        scales = torch.empty(total, 4, dtype=torch.uint8, device=cache.device)
        _ops().cp_gather_indexer_k_quant_cache(self._layer(cache, spec), values, scales, block_table.to(cache.device, torch.int32),
                                               _cu_seq_lens(seq_lens, cache.device))
        return values, scales

    def _swap(self, src, src_spec: LatentSpec, dst, dst_spec: LatentSpec, mapping: torch.Tensor) -> None:
        block_bytes = src_spec.geometry.block_bytes()
        layers = range(src_spec.geometry.num_layers)
        for layer in layers:  # vLLM swaps per layer: each layer's cache is its own tensor
            s, d = (self._layer(c, LatentSpec(geometry=s.geometry, layer=layer)) for c, s in ((src, src_spec), (dst, dst_spec)))
            _ops().swap_blocks(s, d, block_bytes, mapping)

    def latent_copy(self, cache, block_mapping, spec: LatentSpec):
        self._swap(cache, spec, cache, spec, block_mapping.to("cpu", torch.int64).contiguous())

    def latent_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        mapping = torch.stack([src_ids.to("cpu", torch.int64), dst_ids.to("cpu", torch.int64)], dim=1).contiguous()
        self._swap(src_cache, src_spec, dst_cache, dst_spec, mapping)

    def latent_regions(self, spec: LatentSpec, blocks, heads=None):
        if heads is not None:
            raise ValueError("a latent cache is replicated across TP ranks: it has no head slice (LATENT-TP-SOURCE)")
        return R.latent.block_byte_ranges(spec.geometry, blocks)
