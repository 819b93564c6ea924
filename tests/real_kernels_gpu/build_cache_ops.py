"""Compile vLLM 0.33.0's paged KV-cache ops (``csrc/cache_kernels.cu``) with nvcc as a torch
extension of just those kernels, registered under vLLM's own ``torch.ops._C_cache_ops``:

    python tests/real_kernels_gpu/build_cache_ops.py SOURCES_DIR BUILD_DIR   # prints the library's path

``SOURCES_DIR/csrc`` is what vllm_sources.py extracts from the sdist; ``cache_ops_bindings.cpp``
(beside this file) registers ``swap_blocks``, ``reshape_and_cache`` and ``reshape_and_cache_flash``
with vLLM's schemas. Point ``KVCONFORM_VLLM_CACHE_OPS`` at the printed path and the ``vllm:``
adapter loads it (backends_under_test/vllm_cuda_ops.py).

Flags as vLLM's CMake builds its ``_C_stable_libtorch`` (CMakeLists.txt:1281-1290,
cmake/utils.cmake:130-147): torch's common nvcc flags without the ``__CUDA_NO_HALF*`` /
``__CUDA_NO_BFLOAT16_CONVERSIONS__`` defines (removed for CUDA >= 12), ``-DENABLE_FP8``,
``-DUSE_CUDA``, ``TORCH_TARGET_VERSION`` 2.11 (the stable-ABI floor vLLM targets), for this
GPU's compute capability; linked with the CUDA driver library as vLLM links every extension
(``CUDA::cuda_driver``, cmake/utils.cmake:661: ``swap_blocks_batch`` resolves
``cuMemcpyBatchAsync`` through ``cuGetProcAddress``). ``--torch-headers DIR`` puts another torch's stable-ABI headers first
(vLLM builds against newer headers than the torch it loads in).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch.utils import cpp_extension

HERE = Path(__file__).resolve().parent
VLLM_DEFINES = ["-DENABLE_FP8", "-DUSE_CUDA", "-DTORCH_TARGET_VERSION=0x020B000000000000ULL"]
# cpp_extension adds torch's COMMON_NVCC_FLAGS; vLLM's CMake removes these for CUDA >= 12.
UNDEFINES = ["-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__", "-U__CUDA_NO_HALF2_OPERATORS__"]


def cuda_driver_library() -> str:
    """The CUDA driver library to link: the toolkit's stub, else the driver's own (its SONAME, libcuda.so.1, is what loads)."""
    home = Path(cpp_extension.CUDA_HOME)
    candidates = [*home.glob("lib64/stubs/libcuda.so"), *home.glob("targets/*/lib/stubs/libcuda.so")]
    for folder in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib"):
        candidates += sorted(Path(folder).glob("libcuda.so*"))
    if not candidates:
        raise SystemExit("build_cache_ops: no libcuda.so (CUDA toolkit stub or driver) to link")
    return str(candidates[0])


def build(sources: Path, build_dir: Path, torch_headers: Path | None = None) -> Path:
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    build_dir.mkdir(parents=True, exist_ok=True)
    includes = [str(p) for p in (torch_headers, sources / "csrc") if p]
    cpp_extension.load(
        name="vllm_0_33_0_cache_ops", sources=[str(sources / "csrc" / "cache_kernels.cu"), str(HERE / "cache_ops_bindings.cpp")],
        extra_include_paths=includes, extra_cflags=["-O3", *VLLM_DEFINES], extra_cuda_cflags=["-O3", *VLLM_DEFINES, *UNDEFINES],
        extra_ldflags=[cuda_driver_library()], build_directory=str(build_dir), is_python_module=False, verbose=True,
    )
    return build_dir / "vllm_0_33_0_cache_ops.so"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", type=Path)
    parser.add_argument("build_dir", type=Path)
    parser.add_argument("--torch-headers", type=Path, default=None)
    args = parser.parse_args()
    started = time.monotonic()
    library = build(args.sources, args.build_dir, args.torch_headers)
    print(f"built {library} in {time.monotonic() - started:.0f} s (torch {torch.__version__}, CUDA {torch.version.cuda})", flush=True)


if __name__ == "__main__":
    main()
