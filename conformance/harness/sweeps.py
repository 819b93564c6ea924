"""Sweeps over what a backend declares, generated at collection.

A check that takes ``cache_dtype`` runs once per cache dtype the backend declares (``auto``
with each model dtype, each fp8 ``kv_cache_dtype``); ``fp8_cache_dtype`` once per declared fp8
one; ``size_class`` once per size class its declared sizes reach on the layout (H = 1, H = 2,
a head count, head size or block size that is not a power of two, three layers where the
layout has a layer dim). Only declared values are generated; a backend that declares none gets
one not-applicable case saying so. The same functions give the environment's ``declared``
facts, which the coverage table is held to.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import Backend
from kvconform.reports.coverage import ADDRESS_CLASSES, cache_dtype_label, is_power_of_two

from .applicability import CaseParam, by_declaration


@dataclasses.dataclass(frozen=True)
class CacheDtype:
    """One declared cache dtype: the kv_cache_dtype string and the model dtype written into it."""

    kv_cache_dtype: str
    model_dtype: torch.dtype
    label: str  # reports.coverage.cache_dtype_label

    @property
    def id(self) -> str:
        return self.label.replace("/", "-")


_SYMBOL = {"num_layers": "L", "block_size": "N", "num_kv_heads": "H", "head_size": "D"}


@dataclasses.dataclass(frozen=True)
class SizeClass:
    """One declared size class and the geometry size that puts a case in it."""

    name: str  # reports.coverage size class
    field: str  # the Case.geometry keyword
    value: int

    @property
    def id(self) -> str:
        return f"{_SYMBOL[self.field]}{self.value}"

    def kwargs(self) -> dict:
        return {self.field: self.value}


def cache_dtypes(backend: Backend, layout=None, *, fp8_only: bool = False) -> list[CacheDtype]:
    """The declared cache dtypes (those ``layout`` can hold, given one)."""
    caps = backend.capabilities
    found = []
    for kv in caps.kv_cache_dtypes:
        fp8 = kv in R.fp8.KV_CACHE_DTYPES
        if fp8_only and not fp8:
            continue
        for model in caps.dtypes[:1] if fp8 else caps.dtypes:
            storage = backend.cache_dtype(kv, model)
            if layout is None or _holds(backend, layout, storage):
                found.append(CacheDtype(kv, model, cache_dtype_label(kv, str(storage))))
    return found


def fp8_cache_dtypes(backend: Backend, layout) -> list[CacheDtype]:
    return cache_dtypes(backend, layout, fp8_only=True)


def size_classes(backend: Backend, layout) -> list[SizeClass]:
    """Each size class this layout can hold with the backend's declared sizes (the smallest value)."""
    caps = backend.capabilities
    odd = lambda values: sorted(v for v in values if not is_power_of_two(v))  # noqa: E731
    candidates = [
        ("h=1", "num_kv_heads", [h for h in caps.num_kv_heads if h == 1]),
        ("h=2", "num_kv_heads", [h for h in caps.num_kv_heads if h == 2]),
        ("h!=2^k", "num_kv_heads", odd(caps.num_kv_heads)),
        ("d!=2^k", "head_size", odd(caps.head_sizes)),
        ("n!=2^k", "block_size", odd(caps.block_sizes)),
        ("l>=3", "num_layers", [n for n in caps.num_layers if n >= 3] if "L" in layout.k_dims else []),
    ]
    found = []
    for name, field, values in candidates:
        value = next((v for v in values if _holds(backend, layout, **{field: v})), None)
        if value is not None:
            found.append(SizeClass(name, field, value))
    return found


def _holds(backend: Backend, layout, dtype=None, **override) -> bool:
    """Can the layout hold a cache of this storage dtype (default: the first declared) with
    this one size (the others: the first declared)?"""
    caps = backend.capabilities
    kv = "auto" if "auto" in caps.kv_cache_dtypes else caps.kv_cache_dtypes[0]
    g = R.Geometry(**{"num_blocks": 4, "block_size": caps.block_sizes[0], "num_kv_heads": caps.num_kv_heads[0], "head_size": caps.head_sizes[0],
                      "dtype": dtype or backend.cache_dtype(kv, caps.dtypes[0]), **override})
    try:
        layout.validate(g)
    except ValueError:
        return False
    return True


def declared(backend: Backend) -> dict:
    """The backend's declaration as results record it: capabilities, and the cache dtypes and
    size classes the coverage table must show cases of."""
    caps = backend.capabilities
    sizes = {s.name for layout in caps.layouts for s in size_classes(backend, layout)}
    return {
        "layouts": [str(layout) for layout in caps.layouts], "ops": sorted(caps.ops), "standards": sorted(caps.standards),
        "dtypes": [str(d) for d in caps.dtypes], "kv_cache_dtypes": list(caps.kv_cache_dtypes),
        "head_sizes": list(caps.head_sizes), "block_sizes": list(caps.block_sizes), "num_kv_heads": list(caps.num_kv_heads),
        "num_layers": list(caps.num_layers), "scale_types": list(caps.scale_types),
        "cache_dtypes": [c.label for c in cache_dtypes(backend)],
        "layout_cache_dtypes": {str(layout): [c.label for c in cache_dtypes(backend, layout)] for layout in caps.layouts},
        # The address classes are reached by the K/V probes (big_caches.py) and counted for K/V caches only:
        # a latent- or per-token-head-only backend is held to its own probes by its checks, not by this table.
        "size_classes": [name for name in ("h=1", "h=2", "h!=2^k", "d!=2^k", "n!=2^k", "l>=3") if name in sizes] + (list(ADDRESS_CLASSES) if caps.layouts else []),
    }


@dataclasses.dataclass(frozen=True)
class DeclaredLatentFormat:
    """One latent record format the backend declares (``reference.latent.LatentFormat``)."""

    fmt: object

    @property
    def id(self) -> str:
        return self.fmt.label()


# kvc_latent(*selectors): which declared formats a latent check runs on (all when not given).
LATENT_SELECTORS = {
    "mla": lambda f: f.kind == "mla",
    "mla_fp8": lambda f: f.kind == "mla" and f.cache_dtype != "auto",
    "fp8_ds_mla": lambda f: f.kind == "fp8_ds_mla",
    "indexer": lambda f: f.kind == "indexer",
}


def latent_formats(backend: Backend, _layout=None, selectors=None) -> list[DeclaredLatentFormat]:
    """The declared latent formats that match any of ``selectors`` (``LATENT_SELECTORS`` names)."""
    latent = backend.capabilities.latent
    if latent is None:
        return []
    unknown = set(selectors or ()) - set(LATENT_SELECTORS)
    if unknown:
        raise ValueError(f"kvc_latent: unknown {sorted(unknown)}; expected some of {sorted(LATENT_SELECTORS)}")
    return [DeclaredLatentFormat(f) for f in latent.formats if not selectors or any(LATENT_SELECTORS[s](f) for s in selectors)]


SWEEPS = {"cache_dtype": cache_dtypes, "fp8_cache_dtype": fp8_cache_dtypes, "size_class": size_classes, "latent_format": latent_formats}
_NONE = {"cache_dtype": "declares no cache dtype", "fp8_cache_dtype": "declares no fp8 kv_cache_dtype",
         "size_class": "declares no size class this layout holds (H=1, H=2, odd H/D/N sizes, L>=3)",
         "latent_format": "declares no latent format of kind {}"}


def expand(fixturenames, params: list[CaseParam], latent_selectors=()) -> tuple[list[str], list, list[str]]:
    """``(argnames, values, ids)`` for ``metafunc.parametrize`` (indirect: the fixtures of
    fixtures.py hand the values to the check): each case times the values of the sweep the
    check asks for, if any. A case with nothing to sweep carries the reason. The latent sweep
    takes no layout; ``latent_selectors`` (``kvc_latent``) narrow it."""
    wanted = [name for name in SWEEPS if name in fixturenames]
    if not wanted:
        return ["case_param"], params, [p.id for p in params]
    if len(wanted) > 1:
        raise ValueError(f"a check takes one sweep; it asks for {wanted}")
    name = wanted[0]
    values, ids = [], []
    for param in params:
        if param.reason is not None or param.loaded.backend is None or (param.layout is None and name != "latent_format"):
            swept = [None]
        else:
            swept = latent_formats(param.loaded.backend, None, latent_selectors) if name == "latent_format" else SWEEPS[name](param.loaded.backend, param.layout)
        if not swept:
            what = _NONE[name].format(" or ".join(latent_selectors or ("any",)))
            param = dataclasses.replace(param, reason=by_declaration(param.loaded.backend, what))
            swept = [None]
        for value in swept:
            values.append((param, value))
            ids.append(f"{param.id}-{value.id}" if value is not None else param.id)
    return ["case_param", name], values, ids
