"""AMD AITER's Triton KV-cache writer as a kvconform backend: ``--backend aiter:flash`` / ``aiter:asm``.

AITER (github.com/ROCm/aiter, PyPI ``amd-aiter``) ships ``aiter/ops/triton/fused_kv_cache.py``,
whose ``fused_qk_rope_reshape_and_cache`` rotates Q and K (RoPE) and writes K and V into a paged
cache in one kernel (``_fused_qk_rope_reshape_and_cache_kernel``). vLLM 0.33.0 runs it on ROCm
when AITER is enabled (``rocm_aiter_ops.triton_rope_and_cache``, vllm/_aiter_ops.py:4189, from the
``do_rope_and_kv_cache_update`` of TRITON_ATTN, ROCM_ATTN, ROCM_AITER_FA, ...). The adapter
calls it as vLLM does, with an identity rotation — every token at position 0 of a
``cos_sin_cache`` whose row is ``[1 … 1, 0 … 0]`` in the model dtype, split by
``chunk(2, dim=-1)`` — so it is a KV writer:

| name          | cache the kernel gets                                   | ``flash_layout`` |
|---------------|---------------------------------------------------------|------------------|
| ``aiter:flash`` | ``unbind(1)`` of a blocks-first NHD or HND cache: K, V ``[B, N, H, D]`` | True  |
| ``aiter:asm``   | the legacy (ASM) split of kv-first planes: K ``[B, H, D/x, N, x]``, V ``[B, H, D, N]`` | False |

Declared from the code, not from what passes: head sizes and block sizes powers of two (the
wrapper asserts both, fused_kv_cache.py:261, :263), bf16/fp16 keys, one scale per tensor
(``tl.load(k_scale_ptr)``, _triton_kernels/fused_kv_cache.py:543), fp8 caches of whichever
format the cache tensor has (``.to(key_cache_ptr.dtype.element_ty)``, :594). Two query heads
per KV head (GQA, as the vLLM adapter's impls). Only ``write``: AITER has no split, swap, copy
or connector gating of its own; its paged-decode kernels are not driven.

What an identity RoPE cannot keep is left to the checks, never excused: K is stored as
``x·cos + rot(x)·sin`` (:375), so K's −0 becomes +0 where ``rot(x)[d]`` (``−x[d + D/2]`` below
D/2, ``x[d − D/2]`` above) is ≥ +0, and a finite K becomes NaN where that partner is ±inf or NaN
(``inf·0``); docs/REAL_KERNELS.md and
docs/expectations/aiter-0.1.7.post2.dev18.txt list what that fails.

The slot mapping is passed as vLLM's model runner passes it: a prefix view of a longer
persistent buffer (``blk_table.slot_mapping.gpu[:num_tokens_padded]``,
vllm/v1/worker/gpu_model_runner.py:3866) whose tail holds slots of an earlier step, here one
slot no token of this write targets. The kernel reads past the mapping when it is shorter than
the keys and a KV head has several query heads (the grid is ``t·qh + (t_slot − t)·kh`` programs,
fused_kv_cache.py:289; each loads ``slot_mapping[pid_t]``, _triton_kernels/fused_kv_cache.py:537):
those reads find a real stale slot instead of whatever memory follows, so the stray writes are
caught by the write checks rather than corrupting memory.

Under ``TRITON_INTERPRET=1`` (CPU CI): no fp8 (the interpreter's fp8 casts drop the rounding
carry), and bf16 writes are not applicable while the interpreter computes bf16 arithmetic on
bit patterns (:mod:`.triton_interpreter`): the K path's ``x·cos + rot(x)·sin`` is bf16 × bf16.

AITER is found in ``$KVCONFORM_AITER`` (a directory holding the wheel's ``aiter/`` package, e.g.
``pip download --no-deps amd-aiter`` unzipped) or as an installed ``aiter``. Its Triton modules
are loaded without running ``aiter/__init__.py``, which starts AITER's HIP JIT machinery.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import sys
import types
from pathlib import Path

import torch
import triton

from kvconform import reference as R

from . import triton_interpreter
from .contract import BackendUnavailable, Capabilities, OpUnavailable
from .kernel_library import KernelLibrary
from .triton_backends import device_arch

AITER_ENV = "KVCONFORM_AITER"
PINNED = "amd-aiter==0.1.7.post2.dev18"  # what docs/REAL_KERNELS.md's verdicts were measured on
MODULE = "aiter.ops.triton.fused_kv_cache"
QUERY_HEADS_PER_KV_HEAD = 2
INTERPRETER_FP8 = ("not declared under TRITON_INTERPRET=1: the interpreter's fp8 casts drop the rounding carry "
                   "(1.99 -> 1.0 in e4m3fn), so fp8 bytes would judge Triton, not AITER")
NOT_AITERS = {
    "decode": "kvconform's AITER adapter does not drive AITER's paged-decode kernels (aiter/ops/triton/pa_decode.py)",
}


def aiter_package_dir() -> Path:
    """The directory of AITER's ``aiter`` package: ``$KVCONFORM_AITER/aiter``, or the installed one."""
    if os.environ.get(AITER_ENV):
        path = Path(os.environ[AITER_ENV]) / "aiter"
        if not (path / "ops" / "triton" / "fused_kv_cache.py").is_file():
            raise BackendUnavailable(f"${AITER_ENV}={os.environ[AITER_ENV]} holds no aiter/ops/triton/fused_kv_cache.py")
        return path
    spec = importlib.util.find_spec("aiter")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"AMD AITER is not installed: set ${AITER_ENV} to the unzipped wheel of "
                                 f"`pip download --no-deps {PINNED}` (or install it) to check its Triton KV writer")
    return Path(next(iter(spec.submodule_search_locations)))


def aiter_version(package: Path) -> str:
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", (package / "_version.py").read_text()) if (package / "_version.py").is_file() else None
    return found.group(1) if found else "unknown"


@functools.cache
def fused_kv_cache():
    """AITER's ``fused_kv_cache`` module, imported without ``aiter/__init__.py``: ``aiter`` and
    ``aiter.ops`` are bare package objects whose path points into AITER's tree, so only
    ``aiter/ops/triton`` (Triton and torch code) runs. A process that already imported ``aiter``
    (a ROCm install) uses it as it is."""
    if "aiter" not in sys.modules:
        package = aiter_package_dir()
        for name, path in (("aiter", package), ("aiter.ops", package / "ops")):
            module = types.ModuleType(name, "kvconform: a bare package object over AITER's tree (its __init__ starts the HIP JIT)")
            module.__path__ = [str(path)]
            sys.modules[name] = module
    try:
        return importlib.import_module(MODULE)
    except ImportError as exc:
        raise BackendUnavailable(f"cannot import AITER's {MODULE} ({exc})") from exc


def _platform() -> str:
    if torch.version.hip:
        return "rocm"
    return "cuda" if torch.cuda.is_available() else "cpu"


class AiterBackend(KernelLibrary):
    """``fused_qk_rope_reshape_and_cache`` with an identity rotation, on the views of ``kernel_views``."""

    flash_layout: bool
    layouts: tuple

    def __init__(self):
        if triton_interpreter.interpreted():
            triton_interpreter.exact_xor_reduction()  # its rope's tl.flip, else minutes of Python a run
        self._kernel = fused_kv_cache().fused_qk_rope_reshape_and_cache
        self._version = aiter_version(Path(sys.modules["aiter"].__path__[0]))
        self.platform = _platform()
        self.device = "cpu" if self.platform == "cpu" else "cuda"
        fp8 = () if triton_interpreter.interpreted() else R.fp8.KV_CACHE_DTYPES
        # Fixed checks run at the first declared dtype: fp16 while bf16 cannot run here, so they
        # exercise AITER instead of reporting not applicable.
        dtypes = (torch.float16, torch.bfloat16) if triton_interpreter.bf16_arithmetic_defect() else (torch.bfloat16, torch.float16)
        self._capabilities = Capabilities(
            layouts=self.layouts, ops=frozenset({"write"}), dtypes=dtypes,
            kv_cache_dtypes=("auto", *fp8), head_sizes=(64, 128), block_sizes=(16, 32), num_kv_heads=(1, 2, 3), scale_types=("tensor",),
        )

    @property
    def capabilities(self):
        return self._capabilities

    def versions(self):
        mode = "interpreted (TRITON_INTERPRET=1)" if triton_interpreter.interpreted() else "compiled"
        return {**({"fp8": INTERPRETER_FP8} if triton_interpreter.interpreted() else {}), "torch": torch.__version__,
                "triton": triton.__version__, "triton_mode": mode, "aiter": self._version, "aiter_kernel": f"{MODULE}.fused_qk_rope_reshape_and_cache"}

    def arch(self):
        return device_arch(self.platform)

    def undeclared_op(self, op):
        if op in NOT_AITERS:
            return f"kvconform's AITER adapter (backend {self.name})", NOT_AITERS[op]
        return self.library, f"has no {op} op of its own (a kernel library: the engine splits, swaps and copies its caches)"

    @property
    def library(self):
        return f"AMD AITER {self._version}"

    def kernel_views(self, cache, spec) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        defect = triton_interpreter.bf16_arithmetic_defect() if key.dtype == torch.bfloat16 else None
        if defect:
            raise OpUnavailable(f"AITER rotates bfloat16 K as x*cos + rot(x)*sin in bfloat16 (fused_kv_cache kernel, _unit_rope); {defect}",
                                who="this machine's Triton interpreter")
        key_cache, value_cache = self.kernel_views(cache, spec)
        tokens, heads, head_size = key.shape
        query = torch.zeros(tokens, QUERY_HEADS_PER_KV_HEAD * heads, head_size, dtype=key.dtype, device=key.device)
        cos_sin_cache = torch.cat([torch.ones(1, head_size // 2), torch.zeros(1, head_size // 2)], dim=-1).to(key.dtype).to(key.device)
        cos, sin = cos_sin_cache.chunk(2, dim=-1)  # as rocm_aiter_ops.triton_rope_and_cache
        positions = torch.zeros(tokens, dtype=torch.int64, device=key.device)
        self._kernel(query, key, value, key_cache, value_cache, persistent_slot_view(slot_mapping, tokens, spec), positions, cos, sin,
                     k_scale, v_scale, True, flash_layout=self.flash_layout, apply_scale=spec.kv_cache_dtype != "auto", output_zeros=False)


def persistent_slot_view(slot_mapping: torch.Tensor, rows: int, spec) -> torch.Tensor:
    """``slot_mapping`` as the prefix of a ``rows``-long buffer whose tail holds a stale slot that
    no token of this write targets (vLLM's per-step buffer keeps earlier steps' slots there)."""
    count = slot_mapping.shape[0]
    if count >= rows:
        return slot_mapping
    targeted = set(slot_mapping.tolist())
    stale = next(s for s in range(spec.geometry.num_blocks * spec.geometry.block_size) if s not in targeted)
    buffer = torch.full((rows,), stale, dtype=slot_mapping.dtype, device=slot_mapping.device)
    buffer[:count] = slot_mapping
    return buffer[:count]


class AiterFlash(AiterBackend):
    """``flash_layout=True``: K and V ``[B, N, H, D]`` with any strides — the ``unbind(1)`` views of
    a blocks-first cache in NHD or HND order (the kernel reads all four strides of each)."""

    flash_layout = True
    layouts = (R.blocks_first("NHD"), R.blocks_first("HND"))

    def kernel_views(self, cache, spec):
        return cache.unbind(1)


class AiterAsm(AiterBackend):
    """``flash_layout=False``: the ASM (legacy paged) layout, K ``[B, H, D/x, N, x]``, V ``[B, H, D, N]``,
    over the two planes of a kv-first allocation (as ROCM_ATTN keeps them)."""

    flash_layout = False
    layouts = (R.legacy_paged(),)

    def kernel_views(self, cache, spec):
        g = spec.geometry
        B, N, H, D, x = g.num_blocks, g.block_size, g.num_kv_heads, g.head_size, g.x
        k, v = cache.unbind(0)
        return k.view(B, H, D // x, N, x), v.view(B, H, D, N)
