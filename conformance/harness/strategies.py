"""Hypothesis strategies bound to one backend's declared capabilities.

Only combinations the backend declares — and its layout can hold (multiples of x for tiled
layouts) — are generated; nothing unsupported is drawn and then skipped. Strategies are pure:
drawing records nothing (a test's facts note the caches it allocates).
"""

from __future__ import annotations

import dataclasses

import torch
from hypothesis import strategies as st

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec

from .case import Case


@dataclasses.dataclass(frozen=True)
class WriteCase:
    spec: CacheSpec
    slot_mapping: torch.Tensor
    extra_rows: int
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    seed: int


def geometry_choices(case: Case, kv_cache_dtypes=None):
    """Every (model dtype, kv_cache_dtype, N, D, H) the backend declares and its layout holds."""
    key = tuple(kv_cache_dtypes) if kv_cache_dtypes else None
    if key not in case.geometry_memo:
        case.geometry_memo[key] = _geometry_choices(case, kv_cache_dtypes)
    return case.geometry_memo[key]


def _geometry_choices(case: Case, kv_cache_dtypes) -> list:
    caps = case.backend.capabilities
    choices = []
    for model_dtype in caps.dtypes:
        for kv_dtype in kv_cache_dtypes or caps.kv_cache_dtypes:
            if kv_dtype not in caps.kv_cache_dtypes:
                continue
            for N in caps.block_sizes:
                for D in caps.head_sizes:
                    for H in caps.num_kv_heads:
                        g = case.geometry(kv_cache_dtype=kv_dtype, model_dtype=model_dtype, block_size=N, head_size=D, num_kv_heads=H)
                        try:
                            case.layout.validate(g)
                        except ValueError:
                            continue
                        choices.append((model_dtype, kv_dtype, g))
    return choices


@st.composite
def specs(draw, case: Case, kv_cache_dtypes=None, num_blocks=(3, 6)) -> CacheSpec:
    choices = geometry_choices(case, kv_cache_dtypes)
    if not choices:
        raise ValueError(f"{case.backend.name} declares no geometry its layout {case.layout} can hold")
    model_dtype, kv_dtype, g = draw(st.sampled_from(choices), label="model dtype, kv_cache_dtype, geometry")
    g = dataclasses.replace(g, num_blocks=draw(st.integers(*num_blocks), label="num_blocks"))
    return case.spec(g, kv_dtype, model_dtype)


@st.composite
def slot_mappings(draw, g: R.Geometry, max_tokens: int = 20, padding_slots: bool = True) -> torch.Tensor:
    """Unique slots spread over all blocks (ids ≥ 2 included), ``-1`` padding where the backend
    declares it, int32 or int64."""
    capacity = g.num_blocks * g.block_size
    slots = draw(st.lists(st.integers(0, capacity - 1), unique=True, min_size=1, max_size=min(max_tokens, capacity)), label="slots")
    padding = [False] * len(slots)
    if padding_slots:
        padding = draw(st.lists(st.booleans(), min_size=len(slots), max_size=len(slots)), label="padding")
    dtype = draw(st.sampled_from((torch.int32, torch.int64)), label="slot dtype")
    return torch.tensor([-1 if pad else s for s, pad in zip(slots, padding)], dtype=dtype)


@st.composite
def scales(draw, case: Case, g: R.Geometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-unit, unequal k/v scales, per tensor or per KV head as the backend declares."""
    kind = draw(st.sampled_from(case.backend.capabilities.scale_types), label="scale type")
    count = 1 if kind == "tensor" else g.num_kv_heads
    values = st.sampled_from([0.25, 0.5, 1.5, 2.0, 3.0])
    k = torch.tensor(draw(st.lists(values, min_size=count, max_size=count), label="k_scale"))
    v = torch.tensor(draw(st.lists(values, min_size=count, max_size=count), label="v_scale"))
    if torch.equal(k, v):
        v = v * 2
    return k, v


@st.composite
def write_cases(draw, case: Case, kv_cache_dtypes=None) -> WriteCase:
    spec = draw(specs(case, kv_cache_dtypes))
    k_scale, v_scale = draw(scales(case, spec.geometry))
    return WriteCase(
        spec=spec, slot_mapping=draw(slot_mappings(spec.geometry, padding_slots=case.backend.capabilities.padding_slots)),
        extra_rows=draw(st.integers(0, 3), label="extra key rows"),
        k_scale=k_scale, v_scale=v_scale, seed=draw(st.integers(0, 2**20), label="data seed"),
    )
