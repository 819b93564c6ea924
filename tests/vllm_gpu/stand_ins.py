"""Stand-ins for vLLM 0.33.0's *compiled extensions* when its Python tree runs on a GPU machine
without them (the carry bundle of build_bundle.py: the ``.so`` files are built against torch
2.14 and are too large to carry). A machine with a real vLLM install needs none of these.

Each one replaces an import-time use of an absent extension, never the code under test; the
KV-cache writers the checks drive (the Triton flash writer, ROCM_ATTN's Triton path) are vLLM's
own ``@triton.jit`` kernels, compiled on the device. A path that needs a compiled op still
fails with vLLM's own error, which the adapter reports as not applicable (this build lacks it).

- ``vllm._C_stable_libtorch``: vllm/platforms/cuda.py imports it unconditionally; an empty
  module (only when the real import fails), as on the CPU (tests/vllm_cpu/stand_ins.py).
- ``vllm.vllm_flash_attn``: its ``__init__`` raises ImportError when neither FlashAttention
  extension loaded, and vllm/v1/attention/backends/fa_utils.py imports it on CUDA (reached
  from the NIXL connector chain the adapter's connector-layout resolution imports). The
  stand-in is the same package without that raise: its submodules are vLLM's own, and its
  attention functions fail if called (they need the extension).
- ``vllm._custom_ops.cutlass_*supports*``: capability queries of the absent ``_C`` extension
  that w8a8_utils calls at import time; without the extension nothing is supported, so they
  answer False (only if the op is missing from ``torch.ops._C``).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types

FLASH_ATTN = "vllm.vllm_flash_attn"
FLASH_ATTN_EXPORTS = ("compile_flash_attn_varlen_func_from_specs", "fa_version_unsupported_reason", "flash_attn_varlen_func",
                      "get_scheduler_metadata", "is_fa_version_supported")


def _stable_libtorch() -> None:
    try:
        importlib.import_module("vllm._C_stable_libtorch")
    except (ImportError, OSError):
        module = types.ModuleType("vllm._C_stable_libtorch")
        module.__doc__ = "kvconform GPU stand-in: vLLM's compiled extension is not in the carry bundle"
        module.__kvconform_stand_in__ = True
        sys.modules["vllm._C_stable_libtorch"] = module


def _flash_attn_package() -> None:
    try:
        importlib.import_module(FLASH_ATTN)
        return
    except ImportError:
        pass
    spec = importlib.util.find_spec(FLASH_ATTN)
    package = types.ModuleType(FLASH_ATTN)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    package.__kvconform_stand_in__ = True
    sys.modules[FLASH_ATTN] = package
    interface = importlib.import_module(FLASH_ATTN + ".flash_attn_interface")  # vLLM's own; FA2/FA3_AVAILABLE False
    for name in FLASH_ATTN_EXPORTS:
        setattr(package, name, getattr(interface, name))


def _cutlass_capability_queries() -> None:
    import torch

    ops = importlib.import_module("vllm._custom_ops")
    compiled = getattr(torch.ops, "_C", None)
    for name in dir(ops):
        if name.startswith("cutlass_") and "supports" in name and not hasattr(compiled, name):
            setattr(ops, name, lambda *args, **kwargs: False)


def install() -> None:
    """Install the stand-ins (before any backend imports vLLM's attention modules)."""
    _stable_libtorch()
    _flash_attn_package()
    _cutlass_capability_queries()
