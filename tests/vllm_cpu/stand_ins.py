"""Stand-ins that let vLLM 0.33.0's real Python and Triton code import on a CPU-only machine.

They exist only for kvconform's own CI (no GPU, CPU torch, ``TRITON_INTERPRET=1``); a vendor
machine with a real vLLM build needs none of them. Each one replaces something vLLM treats
as optional or hardware-specific, never the code under test:

- ``amdsmi``: vllm/platforms/rocm.py asks amdsmi for the GPU's gfx arch at import time. A
  module that reports one device of arch ``KVCONFORM_STANDIN_GFX`` (default gfx942) makes
  vLLM's own detection pick ``RocmPlatform`` — so ``current_platform.is_rocm()`` is true and
  rocm_aiter_fa defines its shuffle writer. Every other amdsmi call raises AmdSmiException,
  which vLLM already handles. Never installed over a real amdsmi.
- ``vllm._C_stable_libtorch``: vllm/platforms/cuda.py imports this CUDA extension
  unconditionally; an empty module, only if the real import fails, lets ``CudaPlatform``'s
  pure-Python block copies be called.
- pinned memory: the simulated ROCm platform reports pinned host memory available; with no
  accelerator, CPU torch cannot pin, so vLLM's ``PIN_MEMORY`` flag and RocmPlatform's
  ``is_pin_memory_available`` are set to the truth (False) after import — vLLM's own code path for machines without pinning.
- AITER's attention kernels (``AITER_KERNELS``): ROCM_AITER_UNIFIED_ATTN's impl imports AITER's
  ``unified_attention`` in ``__init__``, and 0.30.0-0.31.0's rocm_aiter_fa imports its gluon decode at
  import; the stand-ins raise if a kernel is ever *called*, so only the cache-layout code (split,
  cache update) runs.
- compute units: RocmPlatform.num_compute_units asks torch.cuda; without a device it answers the
  simulated GPU's CU count (TRITON_MLA's impl sizes its decode splits by it).

``install()`` must run before vLLM is imported; it also sets the two environment variables
the vLLM CPU recipe needs (no visible GPUs, Triton interpreter).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types

import torch

GFX_ENV = "KVCONFORM_STANDIN_GFX"
COMPUTE_UNITS = {"gfx942": 304, "gfx950": 256}  # MI300X, MI355X


class AmdSmiException(Exception):
    """What real amdsmi raises; vLLM catches it around optional queries."""


def _amdsmi(arch: str) -> types.ModuleType:
    module = types.ModuleType("amdsmi")
    module.__kvconform_stand_in__ = True
    module.AmdSmiException = AmdSmiException
    module.amdsmi_init = lambda *a, **k: None
    module.amdsmi_shut_down = lambda *a, **k: None
    module.amdsmi_get_processor_handles = lambda: ["stand-in-gpu-0"]
    module.amdsmi_get_gpu_asic_info = lambda handle: {"target_graphics_version": arch}

    def unsupported(*args, **kwargs):
        raise AmdSmiException("kvconform amdsmi stand-in: query not available on this machine")

    def __getattr__(name: str):
        if name.startswith("_"):  # inspect/pickle probe dunders; they must look absent
            raise AttributeError(name)
        return unsupported

    module.__getattr__ = __getattr__
    return module


def _empty(name: str, doc: str) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__doc__ = doc
    module.__kvconform_stand_in__ = True
    return module


# AITER's attention kernels that vLLM's ROCm backends import (the module, its functions); none is the
# code under test, and each raises if it is ever called.
AITER_KERNELS = {
    "aiter.ops.triton.unified_attention": ("unified_attention",),
    # ROCM_AITER_FA's module imports AITER's gluon decode at import in 0.30.0-0.31.0 (rocm_aiter_fa.py:74-79 in 0.31.0)
    "aiter.ops.triton.gluon.pa_decode_gluon": ("pa_decode_gluon", "get_recommended_splits"),
}


def _aiter_kernels() -> dict[str, types.ModuleType]:
    def not_installed(name):
        def kernel(*args, **kwargs):
            raise RuntimeError(f"kvconform stand-in: AITER's {name} kernel is not installed here")

        return kernel

    modules: dict[str, types.ModuleType] = {}
    for leaf, functions in AITER_KERNELS.items():
        parts = leaf.split(".")
        for depth in range(1, len(parts) + 1):
            name = ".".join(parts[:depth])
            if name not in modules:
                modules[name] = _empty(name, "kvconform CPU stand-in for AITER (not installed)")
                modules[name].__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=name != leaf)
                if depth > 1:
                    setattr(modules[".".join(parts[:depth - 1])], parts[depth - 1], modules[name])
        for function in functions:
            setattr(modules[leaf], function, not_installed(function))
    return modules


def install(arch: str | None = None) -> str:
    """Install the stand-ins (idempotent); returns the gfx arch reported."""
    arch = arch or os.environ.get(GFX_ENV, "gfx942")
    if "vllm" in sys.modules:
        raise RuntimeError("vllm_cpu stand-ins must be installed before vllm is imported")
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ["HIP_VISIBLE_DEVICES"] = ""
    os.environ["TRITON_INTERPRET"] = "1"
    if importlib.util.find_spec("amdsmi") is None:
        sys.modules["amdsmi"] = _amdsmi(arch)
    if importlib.util.find_spec("aiter") is None:
        sys.modules.update(_aiter_kernels())
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except (ImportError, OSError):  # a CUDA .so against CPU torch
        sys.modules["vllm._C_stable_libtorch"] = _empty("vllm._C_stable_libtorch", "kvconform CPU placeholder (CUDA extension)")
    torch_utils = importlib.import_module("vllm.utils.torch_utils")
    torch_utils.PIN_MEMORY = torch_utils.PIN_MEMORY and torch.cuda.is_available()
    if not torch.cuda.is_available():  # the simulated device's CU count, which RocmPlatform asks torch.cuda for
        rocm = importlib.import_module("vllm.platforms.rocm").RocmPlatform
        rocm.num_compute_units = classmethod(lambda cls, device_id=0: COMPUTE_UNITS.get(arch, COMPUTE_UNITS["gfx942"]))
        # Pinning, as PIN_MEMORY above, for releases that ask the platform at each call (0.30.0-0.32.0's
        # async_tensor_h2d, which copy_kv_cache_blocks_inplace calls: "pin_memory=True requires a CUDA ...").
        rocm.is_pin_memory_available = classmethod(lambda cls: False)
        asked = importlib.import_module("vllm.utils.platform_utils").is_pin_memory_available
        getattr(asked, "cache_clear", lambda: None)()  # 0.32.0 caches the answer it gave during vLLM's import
    return arch
