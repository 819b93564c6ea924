"""What every vLLM adapter shares (vllm_backend.py: K/V backends; vllm_mla.py: MLA members): importing vLLM,
its shuffle switch, the impl's config, turning "compiled extension absent" into OpUnavailable, and the
base adapter (gating, the platform's block copies, declarations read from the backend class)."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import os
import types

import torch

from kvconform import reference as R

from . import vllm_cuda_ops
from .contract import (
    CONNECTOR_NOT_SUPPORTED,
    Backend,
    BackendOutOfScope,
    BackendUnavailable,
    CacheSpec,
    Capabilities,
    OpUnavailable,
)

SHUFFLE = "+shuffle"
SHUFFLE_ENV = "VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"
# Backends that only exist on NVIDIA: their block copies are CudaPlatform's.
CUDA_ONLY = ("FLASH_ATTN", "FLASHINFER", "FLASH_ATTN_DIFFKV", "FLEX_ATTENTION")
CPU_PREFIX = "CPU_"  # vLLM's CPU backends: their block copies are CpuPlatform's
CANDIDATE_HEAD_SIZES = (64, 128, 80)
WIDE_HEAD_SIZES = (256,)  # only for a backend that supports none of the above (TRITON_FLASH_ATTN)
# Seconds per test unless --kvc-timeout says otherwise: a vLLM kernel that writes out of bounds
# has hung an interpreter worker in a futex wait (> 20 min); the slowest passing test takes ~4 s.
DEFAULT_TIMEOUT = 300.0
# Ops vLLM has that the adapter does not drive (their N/A is the adapter's, not vLLM's).
NOT_DRIVEN = {"decode": "does not drive vLLM's attention forward (paged decode), so the read checks do not run on vLLM"}
# vLLM's validate_configuration reasons that reject this device's hardware whatever the configuration:
# vLLM never selects the backend here (ROCM_SEGMENTED_ATTN on a CDNA gfx942, rocm_segmented_attn.py:141 in 0.34.0).
HARDWARE_REJECTED = ("compute capability not supported", "requires AMD RDNA GPUs")
# validate_configuration reasons that name a compiled part this vLLM build lacks (the GPU carry
# bundle has no FlashAttention extensions): not applicable here, not a finding.
BUILD_LACKS = ("requires FlashAttention",)
INTERPRETER_FP8 = (
    "not declared under TRITON_INTERPRET=1: the interpreter's fp8 casts drop the rounding carry "
    "(1.99 -> 1.0 in e4m3fn, 3.99 -> 2.0 in e4m3fnuz; Triton 3.9), so bytes would judge Triton, not vLLM"
)


def _rejects_hardware(reasons) -> bool:
    return any(part in reason for reason in reasons for part in HARDWARE_REJECTED)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def import_vllm():
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise BackendUnavailable(f"vLLM is not installed ({exc}); install vllm to check its backends") from exc


def _has_module(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        return False


def cache_planner():
    """The module holding the worker's ``_get_kv_cache_bytes_per_block``: vllm.v1.core.kv_cache_planning
    since 0.33.0, vllm.v1.core.kv_cache_utils in 0.30.0-0.32.0."""
    for module in ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"):
        try:
            planner = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(planner, "_get_kv_cache_bytes_per_block"):
            return planner
    raise BackendUnavailable(
        f"vLLM {import_vllm().__version__} has no _get_kv_cache_bytes_per_block in vllm.v1.core.kv_cache_planning or "
        "kv_cache_utils: kvconform's vLLM adapter cannot size the worker's blocks (it knows vLLM 0.30.0-0.34.0)"
    )


def cache_bytes_per_block(groups: list, member) -> int:
    """The worker's bytes per block, called as that release's worker calls it: with the layout from
    0.32.0 (it pads per layout), without one in 0.30.0-0.31.0 (kv_cache_utils.py:1768 in 0.31.0:
    one size for every layout, the layout applied only to the strides)."""
    sizing = cache_planner()._get_kv_cache_bytes_per_block
    if len(inspect.signature(sizing).parameters) < 2:
        return sizing(groups)
    return sizing(groups, member)


def worker_views(buffer: torch.Tensor, vspec, member, num_blocks: int, names: list[str], against: str, *, exact: bool = False) -> list:
    """The per-layer views vLLM's worker makes over ``buffer`` for one group of layers ``names``:
    the planner's bytes per block for ``member`` (block-outermost members interleave every layer
    per block, as get_kv_cache_config_from_groups does), its strides, then ``create_kv_cache_views``.
    ``against`` names the suite's allocation when vLLM wants more bytes than it holds (or, ``exact``,
    other than it holds: a spec that lays out every byte of the page)."""
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheTensor, compute_layout_strides, create_kv_cache_views

    bytes_per_block = cache_bytes_per_block([KVCacheGroupSpec(names, vspec)], member)
    fixed_block = bytes_per_block if member.is_block_outermost else None
    layer_stride, block_stride, *_ = compute_layout_strides(vspec, num_blocks, len(names), member, fixed_strides=(None, fixed_block, None, None, None))
    size = bytes_per_block * num_blocks
    if size > buffer.numel() or exact and size != buffer.numel():
        raise ValueError(f"vLLM wants {size} bytes in {member.name}; {against} has {buffer.numel()}")
    tensor = KVCacheTensor(size=size, layers=names, layer_stride=layer_stride, block_stride=block_stride)
    return create_kv_cache_views(buffer.view(torch.int8), vspec, num_blocks, member, tensor)


@contextlib.contextmanager
def shuffle_mode(enabled: bool):
    """Run vLLM with the AITER shuffled cache on or off, restoring the process's setting.

    vLLM reads the switch through ``rocm_aiter_ops`` at every call, so two adapters (shuffle
    on and off) can share one process.
    """
    previous = os.environ.get(SHUFFLE_ENV)
    os.environ[SHUFFLE_ENV] = "1" if enabled else "0"
    ops = _aiter_ops()
    if ops is not None:
        ops.refresh_env_variables()
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SHUFFLE_ENV, None)
        else:
            os.environ[SHUFFLE_ENV] = previous
        if ops is not None:
            ops.refresh_env_variables()


def _aiter_ops():
    try:
        return importlib.import_module("vllm._aiter_ops").rocm_aiter_ops
    except (ImportError, AttributeError):
        return None


BUILD = "this machine's vLLM build"


def _unavailable(exc: Exception) -> tuple[str, str] | None:
    """(who lacks it, why) when an exception means "this code path cannot run here", or None."""
    text = str(exc)
    if isinstance(exc, AttributeError) and "_OpNamespace" in text:
        return BUILD, f"vLLM's compiled op is not in this build ({text}); this code path needs vLLM's CUDA/HIP extension"
    if isinstance(exc, NameError):  # vLLM imports some kernels only when their extension loads
        return BUILD, f"vLLM did not define a kernel this path calls ({text}); its compiled extension is not available here"
    if isinstance(exc, ImportError):
        return "this machine", f"this path imports a module that is not installed ({text})"
    if isinstance(exc, NotImplementedError):  # e.g. FlashAttention without FA3: no fp8 cache
        return "vLLM on this machine", f"vLLM does not implement this configuration here ({text})"
    if not torch.cuda.is_available() and ("not compiled with CUDA" in text or "NVIDIA driver" in text):
        return "this machine", f"this path needs a CUDA device ({text})"
    return None


@contextlib.contextmanager
def _real_code_path():
    """Turn "compiled extension absent" into OpUnavailable; every other exception stays."""
    try:
        yield
    except (AttributeError, NameError, ImportError, NotImplementedError, AssertionError, RuntimeError) as exc:
        unavailable = _unavailable(exc)
        if unavailable is None:
            raise
        who, reason = unavailable
        raise OpUnavailable(reason, who=who) from exc


@contextlib.contextmanager
def _vllm_config(block_size: int):
    """Some impls read the current VllmConfig in ``__init__`` (B12X its block size); outside an
    engine use the default, with the cache's block size."""
    from vllm.config import get_current_vllm_config_or_none, set_current_vllm_config

    if get_current_vllm_config_or_none() is not None:
        yield
        return
    config = _default_config()
    previous, config.cache_config.block_size = config.cache_config.block_size, block_size
    try:
        with set_current_vllm_config(config):
            yield
    finally:
        config.cache_config.block_size = previous


@functools.cache
def _default_config():
    from vllm.config import VllmConfig

    return VllmConfig()  # ~2.5 s: build once per process


class VllmBackend(Backend):
    """What both API eras share: gating, the impl, block copies through the platform."""

    default_timeout = DEFAULT_TIMEOUT

    def __init__(self, backend_cls, name: str, shuffle: bool):
        vllm = import_vllm()
        self.backend_cls = backend_cls
        self.vllm_name = name
        self.shuffle = shuffle
        self._platform_cls = self._block_copy_platform()
        self.platform = next((p for p in ("rocm", "cuda") if p in self._platform_cls.__name__.lower()), "cpu")
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self._version = vllm.__version__
        # vLLM's CUDA cache kernels built from its source, where its own extension is absent (vllm_cuda_ops.py).
        self._cache_ops = vllm_cuda_ops.load() if os.environ.get(vllm_cuda_ops.ENV) else None
        self._impls = {}
        with self.mode():
            self._capabilities = self._declare()

    def mode(self):
        return shuffle_mode(self.shuffle)

    def selection_name(self) -> str:
        return self.vllm_name  # the AttentionBackendEnum member vLLM's priority lists name

    def undeclared_op(self, op):
        if op in NOT_DRIVEN:
            return f"kvconform's vLLM adapter (backend {self.name})", NOT_DRIVEN[op]
        return f"vLLM {self._version} {self.vllm_name}", f"has no code path for op '{op}' ({self._no_op_because(op)})"

    def _no_op_because(self, op) -> str:
        return {"split": "its K/V split is inline in do_kv_cache_update", "write": "its impl has no do_kv_cache_update",
                "copy": "this vLLM has no copy_kv_cache_blocks_inplace",
                "swap": f"{self._platform_cls.__name__} has no swap_out_blocks_to_host / insert_blocks_to_device"}.get(op, "not in this vLLM")

    def path_block_sizes(self, op, layout):
        # vLLM picks cache writers by block size (ROCM_ATTN: the compiled writer at 16 and 32,
        # Triton at other sizes); the adapter cannot tell where without restating vLLM's code,
        # so fixed write checks run at every declared size (at most three, see _block_sizes).
        return self.capabilities.block_sizes if op == "write" else self.capabilities.block_sizes[:1]

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def versions(self):
        from vllm.platforms import current_platform

        mode = "interpreted (TRITON_INTERPRET=1)" if interpreted() else "compiled"
        return {**({"fp8": INTERPRETER_FP8} if interpreted() else {}), "torch": torch.__version__, "vllm": self._version, "vllm_platform": type(current_platform).__name__,
                "vllm_backend": f"{self.backend_cls.__module__}.{self.backend_cls.__name__}", "triton_mode": mode,
                "vllm_shuffle_kv_cache": str(self.shuffle), **({"vllm_cache_ops": self._cache_ops} if self._cache_ops else {})}

    def arch(self):
        if self.platform != "rocm" or self._device_platform() != "rocm":  # a ROCm backend on an NVIDIA GPU: the GPU's
            if torch.cuda.is_available():
                major, minor = torch.cuda.get_device_capability()
                return f"sm{major}{minor}"
            return ""
        from vllm.platforms import rocm

        return rocm._GCN_ARCH.split(":")[0]

    # ---------------------------------------------------------------- declarations
    def _block_copy_platform(self):
        if self.vllm_name.startswith("ROCM_"):
            return importlib.import_module("vllm.platforms.rocm").RocmPlatform
        if self.vllm_name in CUDA_ONLY:
            return importlib.import_module("vllm.platforms.cuda").CudaPlatform
        if self.vllm_name.startswith(CPU_PREFIX):
            return importlib.import_module("vllm.platforms.cpu").CpuPlatform
        from vllm.platforms import current_platform

        return type(current_platform)

    def _block_sizes(self) -> tuple[int, ...]:
        sizes = []
        for entry in self.backend_cls.get_supported_kernel_block_sizes():
            base = getattr(entry, "base", entry)
            sizes += [base] if isinstance(entry, int) else [base, 2 * base, 3 * base]
        return tuple(s for s in dict.fromkeys(sizes) if s >= 16 and s <= 64) or (16,)

    def _head_sizes(self) -> tuple[int, ...]:
        supports = getattr(self.backend_cls, "supports_head_size", None)
        listed = self.backend_cls.get_supported_head_sizes() if hasattr(self.backend_cls, "get_supported_head_sizes") else []
        ok = [d for d in CANDIDATE_HEAD_SIZES if (d in listed if listed else supports is None or supports(d))]
        ok = ok or [d for d in WIDE_HEAD_SIZES if (d in listed if listed else supports is None or supports(d))]
        if not ok:
            raise BackendOutOfScope(f"is vLLM's {self.vllm_name}, which supports none of the head sizes {CANDIDATE_HEAD_SIZES + WIDE_HEAD_SIZES} "
                                    "kvconform's geometries use")
        return tuple(ok)

    def _model_dtypes(self) -> tuple[torch.dtype, ...]:
        listed = getattr(self.backend_cls, "supported_dtypes", [torch.bfloat16, torch.float16])
        return tuple(d for d in (torch.bfloat16, torch.float16) if d in listed)

    def _kv_cache_dtypes(self) -> tuple[str, ...]:
        listed = getattr(self.backend_cls, "supported_kv_cache_dtypes", ["auto"])
        auto = ("auto",) if "auto" in listed else ()
        if interpreted():  # see INTERPRETER_FP8
            return auto or ("auto",)
        return (*auto, *(d for d in R.fp8.KV_CACHE_DTYPES if d in listed))

    def _ops(self) -> frozenset[str]:
        splits = hasattr(self.backend_cls.get_impl_cls(), "_split_kv_cache") or self.vllm_name == "ROCM_ATTN"
        return frozenset({"write", "copy"} | ({"split"} if splits else set()) | ({"swap"} if self._swaps() else set()))

    def _swaps(self) -> bool:
        """vLLM's CpuPlatform has no block swaps (nothing to offload to): only platforms that do."""
        return all(hasattr(self._platform_cls, f) for f in ("swap_out_blocks_to_host", "insert_blocks_to_device"))

    def _declare(self) -> Capabilities:
        layouts = self._layouts()
        return Capabilities(
            layouts=layouts, ops=self._ops(), standards=self._standards(layouts), dtypes=self._model_dtypes(),
            kv_cache_dtypes=self._kv_cache_dtypes(), head_sizes=self._head_sizes(), block_sizes=self._block_sizes(),
            num_kv_heads=(1, 2, 3), scale_types=("tensor",),
        )

    # ---------------------------------------------------------------- vLLM objects
    def impl(self, spec: CacheSpec):
        """The backend's AttentionImpl for this geometry (GQA: two query heads per KV head)."""
        g = spec.geometry
        key = (g.num_kv_heads, g.head_size, spec.kv_cache_dtype, g.block_size)
        if key not in self._impls:
            if self._rejects_this_device is not None:
                raise self._rejects_this_device
            impl_cls = self.backend_cls.get_impl_cls()
            args = (2 * g.num_kv_heads, g.head_size, g.head_size**-0.5, g.num_kv_heads, None, None, spec.kv_cache_dtype)
            with self.mode(), _real_code_path(), _vllm_config(g.block_size), self._foreign_impl():
                self._impls[key] = impl_cls(*args)
        return self._impls[key]

    def _foreign(self) -> bool:
        """A backend of another platform than this device's (ROCm or CPU code on an NVIDIA GPU)."""
        return self.platform != self._device_platform()

    @contextlib.contextmanager
    def _foreign_impl(self):
        """A foreign backend's impl that cannot be built on this device is not applicable: vLLM
        never builds it here (its own checks in __init__ say so, or it needs that platform's state)."""
        try:
            yield
        except OpUnavailable:
            raise
        except Exception as exc:
            if not self._foreign():
                raise
            raise OpUnavailable(f"vLLM's {self.vllm_name} impl cannot be built on this {self._device_platform()} device "
                                f"({type(exc).__name__}: {exc}); it is a {self.platform} backend", who=f"this machine ({self._device_platform()} device)") from exc

    @functools.cached_property
    def _rejects_this_device(self) -> OpUnavailable | None:
        """vLLM's validate_configuration of the first declared configuration rejects this device
        (compute capability): the backend targets other hardware, nothing it runs here counts."""
        caps = self.capabilities
        try:
            self.validate_configuration(head_size=caps.head_sizes[0], dtype=caps.dtypes[0], kv_cache_dtype=caps.kv_cache_dtypes[0],
                                        block_size=caps.block_sizes[0], use_kv_connector=False)
        except OpUnavailable as exc:
            return exc if _rejects_hardware([str(exc)]) else None
        return None

    @staticmethod
    def layer(k_scale: torch.Tensor, v_scale: torch.Tensor):
        """The attributes of vLLM's Attention layer that cache updates read."""
        return types.SimpleNamespace(
            _k_scale=k_scale, _v_scale=v_scale, _k_scale_float=float(k_scale.flatten()[0]), _v_scale_float=float(v_scale.flatten()[0]),
        )

    def per_layer(self, cache: torch.Tensor) -> torch.Tensor:
        return cache

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        impl = self.impl(spec)
        with self.mode(), _real_code_path():
            impl.do_kv_cache_update(self.layer(k_scale, v_scale), key, value, self.per_layer(cache), slot_mapping)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        with self.mode(), _real_code_path():
            self._platform_cls.swap_out_blocks_to_host(self.per_layer(cache), self.per_layer(host_cache), src_ids, dst_ids)

    def swap_in(self, host_cache, cache, src_ids, dst_ids, spec):
        with self.mode(), _real_code_path():
            self._platform_cls.insert_blocks_to_device(self.per_layer(host_cache), self.per_layer(cache), src_ids, dst_ids)

    def supports_kv_connector(self):
        with self.mode():
            return bool(self.backend_cls.supports_kv_connector())

    def validate_configuration(self, *, head_size, dtype, kv_cache_dtype, block_size, use_kv_connector):
        """vLLM's own ``validate_configuration``: a decoder, no MLA/sinks/sparse, this device."""
        capability = self._device_capability()
        known = dict(
            head_size=head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, use_mla=False,
            has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
            device_capability=capability, attn_type="decoder", use_kv_connector=use_kv_connector,
        )
        reasons = list(self._call(self.backend_cls.validate_configuration, known))
        device = self._device_platform()
        beyond_connector = [r for r in reasons if r != CONNECTOR_NOT_SUPPORTED]
        if _rejects_hardware(reasons) or (self._foreign() and beyond_connector):
            # A backend for other hardware (ROCm on an NVIDIA GPU, an SM120-only kernel on SM90):
            # vLLM never selects it here, so its validation here says nothing about the backend.
            raise OpUnavailable(
                f"vLLM's {self.vllm_name}.validate_configuration rejects this {device} device (compute capability "
                f"{capability.major}.{capability.minor}): {beyond_connector}; a backend for other hardware ({self.platform})",
                who=f"this machine ({device} device)",
            )
        lacking = [r for r in reasons if any(part in r for part in BUILD_LACKS)]
        if lacking:
            raise OpUnavailable(f"vLLM's {self.vllm_name}.validate_configuration: {lacking}", who=BUILD)
        return reasons

    @staticmethod
    def _device_platform() -> str:
        from vllm.platforms import current_platform

        name = type(current_platform).__name__.lower()
        return next((p for p in ("rocm", "cuda") if p in name), "cpu")

    def selection_order(self, *, use_kv_connector):
        """The platform module's ``_get_backend_priorities`` for a non-MLA, non-sparse decoder."""
        module = importlib.import_module(self._platform_cls.__module__)
        priorities = getattr(module, "_get_backend_priorities", None)
        if priorities is None:
            return None
        known = dict(use_mla=False, use_sparse=False, use_kv_connector=use_kv_connector, device_capability=self._device_capability())
        return [b.name for b in self._call(priorities, known)]

    def _call(self, fn, known: dict):
        """``fn`` with the arguments of ``known`` its signature takes (vLLM's grow by release);
        a required parameter the adapter cannot supply is an unsupported-version error."""
        params = inspect.signature(fn).parameters
        required = [p for p, v in params.items() if v.default is inspect.Parameter.empty and p not in known and v.kind is not v.VAR_KEYWORD]
        if required:
            raise RuntimeError(f"unsupported vLLM version {self._version}: {fn.__name__} needs {required}, which the adapter does not know")
        with self.mode():
            return fn(**{k: v for k, v in known.items() if k in params})

    def _device_capability(self):
        from vllm.platforms import current_platform
        from vllm.platforms.interface import DeviceCapability

        if torch.cuda.is_available():
            return current_platform.get_device_capability()
        if self.platform == "rocm":  # what torch reports for gfx9xx: major 9, minor from the arch
            arch = self.arch()
            return DeviceCapability(9, int(arch[4:6], 16) % 16 if arch.startswith("gfx9") else 0)
        return DeviceCapability(9, 0)


def stack_layer_views(views: list[torch.Tensor]) -> torch.Tensor:
    """One ``[L, ...]`` view over per-layer views that sit a constant byte step apart."""
    first = views[0]
    step = (views[1].data_ptr() - first.data_ptr()) // first.element_size() if len(views) > 1 else first.numel()
    stacked = first.as_strided((len(views), *first.shape), (step, *first.stride()))
    for i, view in enumerate(views):
        if view.data_ptr() != stacked[i].data_ptr() or view.stride() != first.stride():
            raise ValueError(f"vLLM's layer {i} view does not sit {step} elements after layer {i - 1}: layers are not evenly spaced")
    return stacked
