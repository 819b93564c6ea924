"""Hypothesis strategies for the reference's own tests: small geometries a layout can hold."""

from __future__ import annotations

import torch
from hypothesis import strategies as st

from kvconform.reference import Geometry, Layout

CACHE_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)


@st.composite
def geometries(draw, layout: Layout, dtypes=CACHE_DTYPES, max_blocks: int = 5) -> Geometry:
    """A geometry ``layout`` accepts: multiples of x where it tiles, layers only where it has L."""
    dtype = draw(st.sampled_from(dtypes))
    x = 16 // torch.empty((), dtype=dtype).element_size()
    symbols = set(layout.k_dims) | set(layout.v_dims)
    d_unit = x if symbols & {"D/x", "x:d"} else 1
    n_unit = x if symbols & {"N/x", "x:n"} else 1
    return Geometry(
        num_blocks=draw(st.integers(2, max_blocks)),
        block_size=n_unit * draw(st.integers(1, max(1, 32 // n_unit))),
        num_kv_heads=draw(st.integers(1, 3)),
        head_size=d_unit * draw(st.integers(1, max(1, 32 // d_unit))),
        dtype=dtype,
        num_layers=draw(st.integers(1, 3)) if "L" in symbols else 1,
    )


@st.composite
def slot_mappings(draw, g: Geometry, max_tokens: int = 24):
    """Unique slots over the whole cache (ids ≥ 2 included), some -1 padding, int32 or int64."""
    capacity = g.num_blocks * g.block_size
    slots = draw(st.lists(st.integers(0, capacity - 1), unique=True, min_size=1, max_size=min(max_tokens, capacity)))
    padded = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)))
    values = [-1 if pad else s for s, pad in zip(slots, padded)]
    dtype = draw(st.sampled_from((torch.int32, torch.int64)))
    return torch.tensor(values, dtype=dtype)
