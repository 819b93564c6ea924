"""The ``reference`` backend: kvconform's executable spec wearing the backend contract.

It passes every check by construction and is the column every other backend is compared
with; the mutants subclass it and break one thing each.
"""

from __future__ import annotations

import torch

from kvconform.reference import compat
from kvconform import reference as R

from .contract import Backend, Capabilities, CacheSpec

DEFAULT_LAYOUTS = (R.blocks_first("NHD"), R.blocks_first("HND"), R.aiter_shuffle("blocks_first"))


def flat_storage(cache: torch.Tensor, spec: CacheSpec) -> torch.Tensor:
    """The contiguous 1-D region (layout offset 0 onwards) that ``cache`` views."""
    return torch.as_strided(cache, (spec.layout.numel(spec.geometry),), (1,), cache.storage_offset())


def view_over(buffer: torch.Tensor, spec: CacheSpec, shape_strides=None) -> torch.Tensor:
    """A strided tensor over ``buffer`` with the layout's (or the given) shape and strides."""
    shape, strides = shape_strides or spec.layout.view_shape_strides(spec.geometry)
    return buffer.view(spec.geometry.dtype).as_strided(shape, strides)


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self, layouts=DEFAULT_LAYOUTS, standards=frozenset({"e1"})):
        self._capabilities = Capabilities(
            layouts=tuple(layouts),
            ops=frozenset({"write", "split", "swap", "copy", "decode", "regions", "wire", "reblock", "handshake"}),
            standards=standards,
            dtypes=(torch.bfloat16, torch.float16, torch.float32),
            kv_cache_dtypes=("auto", *R.fp8.KV_CACHE_DTYPES),
            head_sizes=(16, 32, 64, 80, 128),
            block_sizes=(16, 32, 48),
            scale_types=("tensor", "head"),
            num_layers=(1, 3),
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def allocate(self, buffer, spec):
        return view_over(buffer, spec)

    def split(self, cache, spec):
        views = []
        for kv in (0, 1):
            shape, strides, offset = spec.layout.side_view(spec.geometry, kv, layer=spec.layer)
            views.append(cache.as_strided(shape, strides, cache.storage_offset() + offset))
        return views[0], views[1]

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        R.reshape_and_cache(key, value, flat_storage(cache, spec), spec.layout, spec.geometry, slot_mapping, k_scale=k_scale, v_scale=v_scale, layer=spec.layer)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        R.swap_out_blocks_to_host(flat_storage(cache, spec), flat_storage(host_cache, spec), spec.layout, spec.geometry, src_ids, dst_ids)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        R.insert_blocks_to_device(flat_storage(host_cache, spec), flat_storage(cache, spec), spec.layout, spec.geometry, src_ids, dst_ids)

    def copy_blocks(self, cache, block_mapping, spec):
        R.copy_blocks(flat_storage(cache, spec), spec.layout, spec.geometry, block_mapping)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        return R.paged_decode_attention(
            query, flat_storage(cache, spec), spec.layout, spec.geometry, block_table, seq_lens,
            scale=scale, k_scale=k_scale, v_scale=v_scale, layer=spec.layer,
        )

    def block_regions(self, cache, spec, block_ids, heads=None):
        return R.connector.byte_regions(spec.layout, spec.geometry, block_ids, heads)

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return R.connector.export_blocks(flat_storage(cache, spec), spec.layout, spec.geometry, block_ids, heads, self.wire_layout(spec))

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        R.connector.import_blocks(flat_storage(cache, spec), spec.layout, spec.geometry, block_ids, wire, heads, num_tokens)

    def handshake(self, local, remote):
        return compat.check(remote, local)

    def selection_order(self, *, use_kv_connector):
        """GATE-SELECTOR reduced to this backend: offered unless a connector is on and it cannot serve one."""
        return [] if use_kv_connector and not self.supports_kv_connector() else [self.name]

    def supports_kv_connector(self):
        return all(R.is_connector_shippable(R.offset_map(layout, _PROBE)) for layout in self.capabilities.layouts)


def kv_first_model() -> ReferenceBackend:
    """A faithful ROCM_ATTN model: kv-first ``(2, B, N, H, D)``, no standard, gated off connectors."""
    return ReferenceBackend(layouts=(R.kv_first("NHD"), R.kv_first("HND")), standards=frozenset())


def e3_model() -> ReferenceBackend:
    """vLLM 0.33.0's ``[L, B, H, N, C]`` standard: three connector-friendly permutations + 2-slot shuffle."""
    layouts = (R.standardized("LBNHC"), R.standardized("LBHNC"), R.standardized("BLHNC"), R.standardized("LBHNC", spec="two_slot", tile="shuffle"))
    return ReferenceBackend(layouts=layouts, standards=frozenset({"e3"}))


class Gfx942Reference(ReferenceBackend):
    """The reference as an MI300 (gfx942) would run it: kv_cache_dtype "fp8" stores e4m3fnuz."""

    platform = "rocm"

    def arch(self):
        return "gfx942"


# Small geometry used to read layout facts (SPEC §14: probe, never guess from a live tensor).
_PROBE = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
