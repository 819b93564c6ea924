"""Layout descriptors of any loadable backend, for ``kvconform describe`` (and so for
``kvconform compat``): the backend allocates a cache of the asked-for geometry over a zero
buffer and announces its descriptor once per TP rank."""

from __future__ import annotations

import math

import torch

from kvconform import reference as R
from kvconform.reference import compat

from . import registry
from .contract import CacheSpec

DESCRIBE_MAX_BYTES = 1 << 34  # the zero-filled cache a backend allocates to announce its descriptor


def layout_named(backend, name: str | None) -> R.Layout:
    """A declared layout by ``era:alias``, alias or name (the first declared one when None)."""
    layouts = backend.capabilities.layouts
    if name is None:
        return layouts[0]
    for layout in layouts:
        if name in (f"{layout.era}:{layout.alias}", layout.alias, layout.name):
            return layout
    raise ValueError(f"backend {backend.name} declares no layout {name!r}; it declares {', '.join(f'{lay.era}:{lay.alias}' for lay in layouts)}")


def describe_backend(name: str, layout: str | None = None, *, kv_cache_dtype: str = "auto", model_dtype=torch.bfloat16, num_blocks: int = 1024,
                     block_size: int = 16, total_kv_heads: int = 8, head_size: int = 128, num_layers: int = 1, tp_size: int = 1,
                     k_scale: float = 1.0, v_scale: float = 1.0) -> list[dict]:
    """One descriptor per TP rank of ``tp_size``. fp8 scales are the checkpoint's: a backend
    storing e4m3fnuz doubles them, as vLLM does on gfx94x. Sizes outside the descriptor schema's
    bounds raise ``DescriptorError`` (a ValueError) before anything is allocated."""
    for option, value in (("num_blocks", num_blocks), ("block_size", block_size), ("total_kv_heads", total_kv_heads), ("head_size", head_size),
                          ("num_layers", num_layers), ("tp_size", tp_size)):
        limit = compat.LIMITS[option]
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise compat.DescriptorError(f"--{option.replace('_', '-')} must be an integer in [1, {limit}], got {value!r}")
    for option, value in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not (math.isfinite(value) and value > 0):
            raise compat.DescriptorError(f"--{option.replace('_', '-')} must be a finite positive scale, got {value!r}")
    loaded = registry.load(name)
    if loaded.backend is None:
        raise ValueError(f"backend {name} did not load: {loaded.error or loaded.unavailable}")
    backend = loaded.backend
    chosen = layout_named(backend, layout)
    dtype = backend.cache_dtype(kv_cache_dtype, model_dtype)
    factor = 2.0 if dtype == torch.float8_e4m3fnuz else 1.0
    out = []
    for rank in range(tp_size):
        try:
            heads = R.connector.rank_heads(total_kv_heads, tp_size, rank)
        except ValueError as exc:
            raise compat.DescriptorError(f"--tp-size {tp_size}, --total-kv-heads {total_kv_heads}: {exc}") from exc
        layers = num_layers if "L" in chosen.k_dims else 1
        g = R.Geometry(num_blocks=num_blocks, block_size=block_size, num_kv_heads=len(heads), head_size=head_size, dtype=dtype, num_layers=layers)
        spec = CacheSpec(layout=chosen, geometry=g, kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype)
        if chosen.nbytes(g) > DESCRIBE_MAX_BYTES:  # allocated here (zeros), unlike a descriptor
            raise compat.DescriptorError(f"a cache of {chosen.nbytes(g)} bytes per rank is too large to describe here; lower --num-blocks")
        cache = backend.allocate(torch.zeros(chosen.nbytes(g), dtype=torch.uint8), spec)
        out.append(backend.layout_descriptor(cache, spec, tp_rank=rank, tp_size=tp_size, total_kv_heads=total_kv_heads,
                                             k_scale=k_scale * factor, v_scale=v_scale * factor))
    return out
