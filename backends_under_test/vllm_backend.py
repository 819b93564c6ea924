"""vLLM's own attention backends as kvconform backends: ``--backend vllm:NAME[+shuffle]``.

``NAME`` is a member of vLLM's ``AttentionBackendEnum`` (ROCM_AITER_FA, ROCM_ATTN,
ROCM_AITER_UNIFIED_ATTN, TRITON_ATTN, FLASH_ATTN, FLASHINFER, ...); ``+shuffle`` runs it with
``VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT=1`` (the AITER shuffled cache). Nothing is re-implemented:

| what the checks exercise | the vLLM code called                                                   |
|--------------------------|------------------------------------------------------------------------|
| declared layouts         | ``supported_kv_cache_layouts()`` + ``customize_spec`` (0.33.0), or     |
|                          | ``get_kv_cache_shape`` + ``get_kv_cache_stride_order`` (E1 era)        |
| allocation               | the worker's planner strides + ``create_kv_cache_views`` (0.33.0)      |
| K/V split                | the impl's ``_split_kv_cache`` / ``PagedAttention.split_kv_cache``     |
| reshape_and_cache        | the impl's ``do_kv_cache_update`` (Triton, AITER shuffle or compiled op;|
|                          | the compiled ops built from vLLM's source when its extension is absent,|
|                          | ``$KVCONFORM_VLLM_CACHE_OPS``, vllm_cuda_ops.py)                        |
| swap out / in            | the platform's ``swap_out_blocks_to_host`` / ``insert_blocks_to_device`` |
| copy blocks              | ``copy_kv_cache_blocks_inplace`` (0.33.0 worker)                       |
| gating                   | ``supports_kv_connector`` / ``validate_configuration``                 |

The adapter only *declares* what the backend is meant to produce, as reference layouts: the
standard E3 layout for each layout vLLM lists, or the 2-slot form with the tile the backend's
kernels keep in each slot region (``TILES``). The checks then hold vLLM's tensors and bytes
against the reference. When vLLM is not installed every check is not applicable; when a code
path needs a compiled op this build lacks, that check is not applicable with the op's name.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types

import torch

from kvconform import reference as R

from . import vllm_connector, vllm_mla
from .contract import Backend, BackendOutOfScope, BackendUnavailable, CacheSpec
from .vllm_base import (  # noqa: F401 - re-exported: the adapter's shared parts moved to vllm_base.py
    BUILD,
    CUDA_ONLY,
    DEFAULT_TIMEOUT,
    INTERPRETER_FP8,
    NOT_DRIVEN,
    SHUFFLE,
    SHUFFLE_ENV,
    VllmBackend,
    _has_module,
    _real_code_path,
    cache_planner,
    import_vllm,
    interpreted,
    shuffle_mode,
    stack_layer_views,
    worker_views,
)
from .vllm_quant import VllmQuant

# What the kernels keep inside each 2-slot region (reference.E3_TILES); absent: plain [N, H·D].
TILES = {("ROCM_ATTN", False): "legacy", ("ROCM_ATTN", True): "legacy", ("ROCM_AITER_FA", True): "shuffle"}

def adapter_for_name(name: str) -> Backend:
    """``NAME[+shuffle]`` → an adapter over the installed vLLM's backend class of that name."""
    shuffle = name.endswith(SHUFFLE)
    enum_name = name.removesuffix(SHUFFLE)
    vllm = import_vllm()
    enum = _attention_backend_enum()
    if enum_name not in enum.__members__:
        raise ValueError(f"vllm:{name}: {enum_name!r} is not an AttentionBackendEnum member of vLLM {vllm.__version__}; known: {', '.join(enum.__members__)}")
    with shuffle_mode(shuffle):
        try:
            cls = enum[enum_name].get_class()
        except ImportError as exc:  # a module of its own needs a package or extension absent here
            raise BackendUnavailable(f"vLLM's {enum_name} cannot be imported here ({type(exc).__name__}: {exc})") from exc
        except AssertionError as exc:  # CUTLASS_MLA asserts a CUDA torch at import
            raise BackendUnavailable(f"vLLM's {enum_name} cannot be imported on this machine (its module asserts: {exc})") from exc
    return adapter_for(cls, name=enum_name, shuffle=shuffle)


def adapter_for(backend_cls, *, name: str | None = None, shuffle: bool = False) -> Backend:
    """The adapter for the API this backend class exposes (0.33.0 or E1 era)."""
    vllm = import_vllm()
    name = name or backend_cls.get_name()
    if _flag(backend_cls, "is_mla") and _has_module("vllm.v1.kv_cache_layout"):  # a latent cache (vllm_mla.py)
        return vllm_mla.VllmMLABackend(backend_cls, name, shuffle)
    # A class that states its own shape is E1-era (0.33.0 backends dropped get_kv_cache_shape).
    if hasattr(backend_cls, "get_kv_cache_shape"):
        _check_scope(backend_cls, name)
        return VllmE1Backend(backend_cls, name, shuffle)
    if hasattr(backend_cls, "supported_kv_cache_layouts") and _has_module("vllm.v1.kv_cache_layout"):
        _check_scope(backend_cls, name)
        cache_planner()  # the worker's block sizing, which allocation calls: unavailable now, not per check
        return VllmE3Backend(backend_cls, name, shuffle)
    raise RuntimeError(
        f"unsupported vLLM version {vllm.__version__}: backend {backend_cls.__name__} has neither "
        "get_kv_cache_shape (E1 era, mid-2026) nor supported_kv_cache_layouts + vllm.v1.kv_cache_layout "
        "(0.33.0); kvconform's vLLM adapter knows those two APIs"
    )


def _flag(backend_cls, name: str) -> bool:
    value = getattr(backend_cls, name, False)  # a classmethod, or a plain class attribute on some
    return bool(value() if callable(value) else value)


def _check_scope(backend_cls, name: str) -> None:
    """Backends that keep no K/V cache kvconform specifies are not applicable, not errors."""
    if _flag(backend_cls, "is_sparse"):
        raise BackendOutOfScope(f"is vLLM's sparse-attention backend {name} (its validate_configuration rejects dense "
                                "decoders); kvconform specifies dense K/V paged caches")
    listed = getattr(backend_cls, "supported_kv_cache_dtypes", ["auto"])
    if "auto" not in listed and not set(listed) & set(R.fp8.KV_CACHE_DTYPES):
        raise BackendOutOfScope(f"is vLLM's {name}, which stores only {listed}: quantized cache formats kvconform does not "
                                "specify (it specifies the model dtype and fp8)")
    try:
        backend_cls.get_impl_cls()
    except NotImplementedError as exc:
        raise BackendOutOfScope(f"is vLLM's {name}, which has no attention impl of its own to drive ({exc})") from exc


def _attention_backend_enum():
    for module in ("vllm.v1.attention.backends.registry", "vllm.attention.backends.registry"):
        try:
            return importlib.import_module(module).AttentionBackendEnum
        except ImportError:
            continue
    raise RuntimeError("unsupported vLLM version: no AttentionBackendEnum in vllm.v1.attention.backends.registry or vllm.attention.backends.registry")


class VllmE3Backend(VllmQuant, VllmBackend):
    """vLLM 0.33.0: per-layer ``[B, H, N, C]`` views of one int8 allocation (SPEC LAYOUT-E3); the
    per-token-head quantised caches of those that pack them (vllm_quant.py)."""

    def _declare(self):
        caps = super()._declare()
        return dataclasses.replace(caps, quant=self._quant_capabilities())

    def versions(self):
        undeclared = self.quant_not_declared()
        return {**super().versions(), **({"vllm_quant_not_declared": "; ".join(undeclared)} if undeclared else {})}

    def _standards(self, layouts):
        return frozenset({"e3"})

    def _members(self):
        from vllm.v1.kv_cache_layout import KVCacheLayout

        listed = self.backend_cls.supported_kv_cache_layouts()
        return tuple(listed) if listed is not None else tuple(KVCacheLayout)

    def _spec_kind(self) -> str:
        """"two_slot" when customize_spec folds the heads into C (H = 2 slots), else "standard"."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        probe = FullAttentionSpec(block_size=16, num_kv_heads=3, head_size=64, dtype=torch.bfloat16)
        custom = self.backend_cls.customize_spec(probe)
        all_heads = probe.num_kv_heads * probe.head_size * probe.dtype.itemsize
        return "two_slot" if custom.num_heads == 2 and custom.state_content_size_bytes == all_heads else "standard"

    def _layouts(self):
        self._kind = self._spec_kind()
        self._tile = TILES.get((self.vllm_name, self.shuffle)) if self._kind == "two_slot" else None
        layouts = {R.standardized(m.name, spec=self._kind, tile=self._tile): m for m in self._members()}
        self._by_layout = {str(layout): member for layout, member in layouts.items()}
        return tuple(layouts)

    @functools.cached_property
    def _connector_layout(self):
        """The layout vLLM's own resolution (SPEC §14) picks for this backend with NixlConnector
        configured: the backend's connector-aware ``supported_kv_cache_layouts`` under that
        config, then ``resolve_kv_cache_layout`` (NIXL asks for LBHNC on non-MLA models)."""
        from vllm.config import set_current_vllm_config
        from vllm.v1.attention.backends.utils import (
            get_supported_kv_cache_layouts,
            resolve_kv_cache_layout,
        )

        config = _connector_config()
        config.cache_config.kv_cache_layout = None  # resolution records its answer there
        with self.mode(), set_current_vllm_config(config):
            names = [m.name for m in get_supported_kv_cache_layouts([self.backend_cls])]
            member = resolve_kv_cache_layout(config, [names])
        layout = R.standardized(member.name, spec=self._kind, tile=self._tile)
        self._by_layout[str(layout)] = member
        return layout

    def connector_layouts(self):
        return (self._connector_layout,)

    def _ops(self):
        # Regions are read off vLLM's [L, B, H, N, C] views; a kernel tile inside a 2-slot region is not.
        return super()._ops() | ({"regions"} if self._tile is None else set())

    def block_regions(self, cache, spec, block_ids, heads=None):
        return vllm_connector.block_regions(self, cache, spec, block_ids, heads)

    def layout_descriptor(self, cache, spec, **rank):
        return vllm_connector.descriptor(self, cache, spec, **rank)

    def vllm_spec(self, spec: CacheSpec):
        from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        g = spec.geometry
        dtype = kv_cache_dtype_str_to_dtype(spec.kv_cache_dtype, types.SimpleNamespace(dtype=spec.model_dtype))
        raw = FullAttentionSpec(block_size=g.block_size, num_kv_heads=g.num_kv_heads, head_size=g.head_size, dtype=dtype)
        with self.mode():
            return self.backend_cls.customize_spec(raw)

    def allocate(self, buffer, spec):
        """The cache as vLLM's worker builds it: planner strides, then ``create_kv_cache_views``
        over the suite's buffer; returned as ``[L, B, H, N, C]`` (the per-layer views, stacked
        as a view)."""
        g = spec.geometry
        member = self._by_layout[str(spec.layout)]
        names = [f"model.layers.{i}.attn" for i in range(g.num_layers)]
        views = worker_views(buffer, self.vllm_spec(spec), member, g.num_blocks, names, f"the reference layout {spec.layout} for {g.short()}")
        return stack_layer_views(views)

    def per_layer(self, cache):
        if cache.shape[0] != 1:
            raise ValueError(f"vllm adapter ops take one layer; the cache has {cache.shape[0]}")
        return cache[0]

    def split(self, cache, spec):
        kv = self.per_layer(cache)
        with self.mode(), _real_code_path():
            if self.vllm_name == "ROCM_ATTN":  # what its do_kv_cache_update hands the kernels
                from vllm.v1.attention.ops.paged_attn import PagedAttention

                views = PagedAttention.split_kv_cache(kv.transpose(0, 1), spec.geometry.num_kv_heads, spec.geometry.head_size)
            else:
                views = self.impl(spec)._split_kv_cache(kv)
        views = tuple(views)
        if len(views) != 2:
            raise AssertionError(
                f"split: vLLM's {self.vllm_name} split of the [B, H, N, C] cache {tuple(kv.shape)} returned {len(views)} "
                f"tensors, not K and V (it unbinds dim 0, the block dim: SPEC F.18)"
            )
        return views

    def copy_blocks(self, cache, block_mapping, spec):
        from vllm.v1.worker.utils import copy_kv_cache_blocks_inplace

        pairs = [tuple(int(x) for x in row) for row in block_mapping.cpu()]
        with self.mode(), _real_code_path():
            copy_kv_cache_blocks_inplace([self.per_layer(cache)], spec.geometry.num_blocks, pairs)


@functools.cache
def _connector_config():
    """A VllmConfig with NixlConnector as a both-roles transfer instance (built once: ~3 s)."""
    from vllm.config import KVTransferConfig, VllmConfig

    config = VllmConfig(kv_transfer_config=KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both"))
    # No model is loaded; NIXL's layout choice reads only whether the model uses MLA.
    config.model_config = types.SimpleNamespace(use_mla=False)
    return config


class VllmE1Backend(VllmBackend):
    """E1 era (mid-2026): ``get_kv_cache_shape`` + ``get_kv_cache_stride_order`` (SPEC SHAPE-STRIDES, LAYOUT-E1, LAYOUT-E0)."""


    def _stride_order(self, ndim: int) -> tuple[int, ...]:
        try:
            return tuple(self.backend_cls.get_kv_cache_stride_order())
        except (AttributeError, NotImplementedError):
            return tuple(range(ndim))

    def _layouts(self):
        B, N, H, D = 7, 16, 3, 64  # pairwise distinct, so the shape says which dim is which
        shape = tuple(self.backend_cls.get_kv_cache_shape(B, N, H, D, "auto"))
        order = self._stride_order(len(shape))
        eras = {(B, 2, N, H, D): ("E1", R.layouts._LOGICAL_E1), (2, B, N, H, D): ("E0", R.layouts._LOGICAL_E0)}
        if shape not in eras:
            raise RuntimeError(f"vllm:{self.vllm_name}: get_kv_cache_shape gave {shape}, neither (B, 2, N, H, D) nor (2, B, N, H, D)")
        era, logical = eras[shape]
        alias = next((a for a, o in R.layouts.E1_STRIDE_ORDERS.items() if o == order), str(order))
        return (R.permuted(era, alias, logical, order),)

    def _standards(self, layouts):
        # Only blocks-first is the E1 standard; kv-first gets the standard checks as not applicable.
        return frozenset({"e1"}) if layouts[0].era == "E1" else frozenset()

    def _ops(self):
        # E1-era splits are inline in forward() (no split op); the write check covers them.
        impl_cls = self.backend_cls.get_impl_cls()
        return frozenset(({"swap"} if self._swaps() else set()) | ({"write"} if hasattr(impl_cls, "do_kv_cache_update") else set()))

    def allocate(self, buffer, spec):
        """As the E1 worker: allocate the physical (stride-ordered) shape, permute back (SPEC SHAPE-STRIDES)."""
        g = spec.geometry
        shape = tuple(self.backend_cls.get_kv_cache_shape(g.num_blocks, g.block_size, g.num_kv_heads, g.head_size, spec.kv_cache_dtype))
        order = self._stride_order(len(shape))
        physical = buffer.view(g.dtype)[: torch.Size(shape).numel()].view(tuple(shape[i] for i in order))
        inverse = tuple(order.index(i) for i in range(len(order)))
        return physical.permute(*inverse)
