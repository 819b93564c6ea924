"""E1-era (mid-2026) backend declarations, for testing kvconform's E1 adapter path on CPU.

vLLM 0.33.0 removed ``get_kv_cache_shape``; the E1 adapter branch still has to work for vendors
on mid-2026 vLLM. These classes restate the E1-era *declarations* of three backends exactly as
docs/SPEC.md (LAYOUT-E1, LAYOUT-E0, §14) records them (shape, stride order, connector support) on top of
vLLM 0.33.0's real ``AttentionBackend`` base (its ``validate_configuration``), so the adapter's
E1 branch can be driven against vLLM's real platform block copies. They carry no kernels.
"""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionBackend, AttentionImpl

from kvconform.backends_under_test.vllm_backend import adapter_for


class _NoKernels(AttentionImpl):
    """E1-era impls wrote the cache inside forward(); nothing here to drive."""


class _E1Backend(AttentionBackend):
    supported_dtypes = [torch.float16, torch.bfloat16]

    @staticmethod
    def get_impl_cls():
        return _NoKernels

    @staticmethod
    def get_builder_cls():
        raise NotImplementedError

    @classmethod
    def get_supported_head_sizes(cls):
        return [64, 128]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [16, 32]


class BlocksFirstHND(_E1Backend):
    """FLASH_ATTN / ROCM_AITER_FA after #42095/#43660: (B, 2, N, H, D), HND stride order."""

    @staticmethod
    def get_name():
        return "FLASH_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (num_blocks, 2, block_size, num_kv_heads, head_size)

    @staticmethod
    def get_kv_cache_stride_order(include_num_layers_dimension=False):
        return (0, 1, 3, 2, 4)


class KvFirstRocmAttn(_E1Backend):
    """ROCM_ATTN in the E1 era: kv-first (2, B, N, H, D), supports_kv_connector() = False."""

    @staticmethod
    def get_name():
        return "ROCM_ATTN"

    @staticmethod
    def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size, cache_dtype_str="auto"):
        return (2, num_blocks, block_size, num_kv_heads, head_size)

    @classmethod
    def supports_kv_connector(cls):
        return False


class NeitherApi:
    """A backend class from a vLLM that has neither E1 nor 0.33.0 layout declarations."""

    @staticmethod
    def get_name():
        return "OLD"


def blocks_first_hnd():
    return adapter_for(BlocksFirstHND, name="FLASH_ATTN")


def kv_first_rocm_attn():
    return adapter_for(KvFirstRocmAttn, name="ROCM_ATTN")


def neither_api():
    return adapter_for(NeitherApi, name="OLD")
