"""vLLM's compiled paged KV-cache ops for a vLLM whose compiled extension is absent.

vLLM's Python calls its CUDA cache kernels through ``torch.ops._C_cache_ops`` (``reshape_and_cache``
and ``reshape_and_cache_flash`` from ``vllm._custom_ops``, FLASH_ATTN's writer via fa_utils.py:23,
FLEX_ATTENTION's and FLASHINFER's ``do_kv_cache_update`` directly, ROCM_ATTN's at block sizes 16
and 32 through ``PagedAttention.write_to_paged_cache``). Where vLLM's ``_C_stable_libtorch`` is
not loaded — the GPU carry bundle of tests/vllm_gpu has no ``.so`` — ``$KVCONFORM_VLLM_CACHE_OPS``
may name a library built from vLLM's own ``csrc/cache_kernels.cu``
(tests/real_kernels_gpu/build_cache_ops.py) that registers those ops under the same namespace
and schemas; vLLM's code then runs them unchanged. Nothing here re-implements a kernel.
"""

from __future__ import annotations

import functools
import importlib
import os

import torch

ENV = "KVCONFORM_VLLM_CACHE_OPS"
OPS = ("reshape_and_cache", "reshape_and_cache_flash", "swap_blocks")


def registered() -> bool:
    return all(hasattr(torch.ops._C_cache_ops, op) for op in OPS)


@functools.cache
def load() -> str:
    """Where this process's ``torch.ops._C_cache_ops`` kernels come from, loading ``$KVCONFORM_VLLM_CACHE_OPS``
    when vLLM's own extension did not register them (call after vLLM is importable)."""
    importlib.import_module("vllm._custom_ops")  # imports vLLM's compiled extensions where they exist
    if registered():
        return "vLLM's compiled extension"
    path = os.environ.get(ENV)
    if not path:
        return "absent (vLLM's compiled extension is not loaded here)"
    torch.ops.load_library(path)
    if not registered():
        raise RuntimeError(f"${ENV}={path} registers none of torch.ops._C_cache_ops.{{{', '.join(OPS)}}}")
    return f"{path}: vLLM's csrc/cache_kernels.cu built by kvconform (tests/real_kernels_gpu/build_cache_ops.py)"
