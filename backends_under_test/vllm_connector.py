"""Connector-facing facts of a vLLM 0.33.0 cache, read off vLLM's own objects (SPEC.md LAYOUT-E3, §11).

The layout descriptor comes from the ``KVCacheLayout`` member vLLM resolved for the cache (its
stride permutation of ``[L, B, H, N, C]``), the attention spec after the backend's
``customize_spec`` (what one head slot and one content cell hold), and the strides of the
``[L, B, H, N, C]`` tensor ``create_kv_cache_views`` returned (block padding included). Byte
regions are read off that same tensor, as NIXL registers it. The tile a backend's kernels keep
inside a 2-slot region is not visible in vLLM's objects: it comes from the adapter's ``TILES``.
"""

from __future__ import annotations

import torch

from kvconform.reference import compat
from kvconform import reference as R

from .tensor_regions import IndexedView, regions_of


def cell_symbols(adapter, spec) -> tuple[str, tuple[str, ...]]:
    """What vLLM's spec puts on the H axis and in one C cell: ``("H", ("2", "D"))`` for the
    standard spec (K‖V of one head), ``("2", ("H", "D"))`` for the 2-slot one (all heads of K or V)."""
    from vllm.v1.kv_cache_interface import compute_layer_kv_cache_shape_bytes

    g = spec.geometry
    vspec = adapter.vllm_spec(spec)
    _, heads, _, content = compute_layer_kv_cache_shape_bytes(vspec, g.num_blocks)
    # Ask the spec whether customize_spec set head slots: at num_kv_heads == 2 both readings
    # have 2 slots of 2·D·e bytes (LMCache#4467), so the sizes alone cannot tell.
    if getattr(vspec, "num_head_slots", None) is None and heads == g.num_kv_heads and content == 2 * g.head_size * g.element_size:
        return "H", ("2", "D")
    if getattr(vspec, "num_head_slots", None) == 2 and content == g.num_kv_heads * g.head_size * g.element_size:
        return "2", ("H", "D")
    raise ValueError(f"vllm:{adapter.vllm_name}: a spec with {heads} head slots of {content} bytes is neither the standard nor the 2-slot GQA spec")


def descriptor(adapter, cache: torch.Tensor, spec, **rank) -> dict:
    """The kvconform.compat descriptor of a vLLM cache (``cache`` = the adapter's ``[L, B, H, N, C]`` view)."""
    g = spec.geometry
    member = adapter._by_layout[str(spec.layout)]
    slot, cell = cell_symbols(adapter, spec)
    symbols = {0: ("L",), 1: ("B",), 2: (slot,), 3: ("N",), 4: cell}
    dims = tuple(s for axis in member.stride_order for s in symbols[axis])
    k_dims = v_dims = dims
    if adapter._tile:  # the kernels' re-view of each slot's [N, H·D] region (not in vLLM's objects)
        k_tile, v_tile = R.layouts.E3_TILES[adapter._tile]
        k_dims, v_dims = dims[:-3] + k_tile, dims[:-3] + v_tile
    dense = R.Layout(era="E3", alias=member.name, k_dims=k_dims, v_dims=v_dims, native=tuple((s,) for s in k_dims))
    block_pad = cache.stride(1) - dense.strides(g)["B"]  # vLLM's block stride (elements) beyond the dense page
    if block_pad < 0:
        raise ValueError(f"vllm:{adapter.vllm_name}: block stride {cache.stride(1)} is below the dense {member.name} page")
    layout = R.Layout(era="E3", alias=member.name, k_dims=k_dims, v_dims=v_dims, native=tuple((s,) for s in k_dims), block_pad=block_pad)
    return compat.describe(layout, g, kv_cache_dtype=spec.kv_cache_dtype, backend=adapter.name, platform=adapter.platform, arch=adapter.arch(),
                           vllm_layout=member.name, vllm_spec=type(adapter.vllm_spec(spec)).__name__, **rank)


def block_regions(adapter, cache: torch.Tensor, spec, block_ids, heads=None) -> list[tuple[int, int]]:
    """Byte runs of the blocks (heads) in vLLM's ``[L, B, H, N, C]`` view: heads on the H axis
    (standard spec), or inside C, unflattened to ``(H, D)`` (2-slot spec without a tile)."""
    slot, _ = cell_symbols(adapter, spec)
    if slot == "H":
        return regions_of([IndexedView(cache, 1, 2)], cache, block_ids, heads)
    g = spec.geometry
    view = cache.unflatten(-1, (g.num_kv_heads, g.head_size))
    return regions_of([IndexedView(view, 1, 4)], cache, block_ids, heads)
