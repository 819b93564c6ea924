"""The kvconform adapter for ACME's KV cache: declare what ACME supports, build its cache over
the buffer kvconform hands out, and call ACME's own kernels exactly as ACME's engine does."""

import torch

import acme_kv
from kvconform import reference as R
from kvconform.backends_under_test.contract import Backend, Capabilities


class AcmeBackend(Backend):
    name = "acme"
    capabilities = Capabilities(
        layouts=(R.blocks_first("NHD"),),  # (B, 2, N, H, D), split by unbind(1)
        ops=frozenset({"write", "split", "swap", "copy"}),
        standards=frozenset({"e1"}),
        dtypes=(torch.bfloat16, torch.float16),
        kv_cache_dtypes=("auto", "fp8_e5m2"),
        head_sizes=(64, 128),
        block_sizes=(16, 32),
        num_kv_heads=(1, 2, 4),
    )

    def allocate(self, buffer, spec):
        g = spec.geometry
        return buffer.view(g.dtype).view(g.num_blocks, 2, g.block_size, g.num_kv_heads, g.head_size)

    def split(self, cache, spec):
        return cache.unbind(1)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        key_cache, value_cache = cache.unbind(1)
        acme_kv.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale=k_scale, v_scale=v_scale)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        acme_kv.copy_blocks(cache, host_cache, src_ids, dst_ids)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        acme_kv.copy_blocks(host_cache, cache, src_ids, dst_ids)

    def copy_blocks(self, cache, block_mapping, spec):
        acme_kv.copy_blocks(cache, cache, block_mapping[:, 0], block_mapping[:, 1])


class AcmeBackendWithPaddingBug(AcmeBackend):
    """A regression for the example's CI to catch: padding slots (-1) index the last slot."""

    name = "acme_broken"

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        capacity = spec.geometry.num_blocks * spec.geometry.block_size
        super().write(cache, key, value, slot_mapping % capacity, spec, k_scale=k_scale, v_scale=v_scale)
