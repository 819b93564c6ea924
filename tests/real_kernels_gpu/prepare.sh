#!/usr/bin/env bash
# Prepare, on a machine with the package registry, what run.sh needs on a GPU machine without one:
#
#   tests/real_kernels_gpu/prepare.sh CARRY VLLM_SDIST     # CARRY: a folder the device call carries (< 64 MiB)
#
# VLLM_SDIST is vLLM 0.33.0's sdist (vllm_sources.py says how it was fetched and checks its sha256).
# Run from the repository root with the Python that has kvconform's dependencies.
set -euo pipefail
carry=$1; sdist=$2; py=${PYTHON:-python3}
mkdir -p "$carry"
[ -f "$carry/vllm-bundle.tar.xz" ] || "$py" tests/vllm_gpu/build_bundle.py "$carry/vllm-bundle.tar.xz"
rm -rf "$carry/vllm-src" && "$py" tests/real_kernels_gpu/vllm_sources.py "$sdist" "$carry/vllm-src" > /dev/null

# The Python tree of the amd-aiter wheel (its Triton kernels; no compiled parts).
wheels=$(mktemp -d)
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" "$("$py" -c 'from kvconform.backends_under_test.aiter_backend import PINNED; print(PINNED)')"
rm -rf "$carry/aiter" && "$py" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); z.extractall(sys.argv[2], [n for n in z.namelist() if n.startswith("aiter/") and n.endswith(".py")])' "$wheels"/amd_aiter-*.whl "$carry"

# flashinfer-python's Python tree without most of flashinfer/data (its JIT sources: 363 of its 544 MB),
# for vLLM's FLASHINFER member to import (its cache writes are vLLM's compiled reshape_and_cache_flash),
# plus what JIT-compiling its page and batch-decode modules needs (data/include, its own CCCL —
# fastdiv.cuh uses cuda::fast_mod_div, which CUDA 13.0's CCCL lacks — csrc/page.cu, batch_decode.cu,
# their bindings and the decode module's jinja templates): flashinfer_page.py, flashinfer_suite.sh.
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$wheels" flashinfer-python==0.7.2.post1
tree=$(mktemp -d) && "$py" -c '
import sys, zipfile
page = ("flashinfer/data/include/", "flashinfer/data/cccl/", "flashinfer/data/csrc/page.cu", "flashinfer/data/csrc/flashinfer_page_binding.cu", "flashinfer/data/csrc/tvm_ffi_utils.h",
        "flashinfer/data/csrc/batch_decode.cu", "flashinfer/data/csrc/batch_decode_jit_binding.cu", "flashinfer/data/csrc/batch_decode_customize_config.jinja",
        "flashinfer/data/csrc/batch_decode_kernel_inst.jinja")
z = zipfile.ZipFile(sys.argv[1])
z.extractall(sys.argv[2], [n for n in z.namelist() if not n.startswith("flashinfer/data/") or n.startswith(page)])' "$wheels"/flashinfer_python-*.whl "$tree"
tar -cJf "$carry/flashinfer.tar.xz" -C "$tree" .

# LMCache 0.5.6's sdist (lmcache_suite.sh), by URL and sha256-checked as the CPU tests fetch it (lmcache_sdist.py).
"$py" -m tests.real_kernels_gpu.lmcache_sdist "$carry" > /dev/null
ls "$carry"/cachetools-*.whl > /dev/null 2>&1 || "$py" -m pip download -q --no-deps --only-binary=:all: -d "$carry" cachetools  # lmcache.utils imports it

# Stable-ABI headers of this torch, with vLLM's fix for 2.13's (cmake/patches/pytorch_stable_string.patch,
# applied by vLLM's CMakeLists.txt:409-444): build_cache_ops.py's fallback when the GPU's torch headers fail.
include=$("$py" -c 'import torch.utils.cpp_extension as c; print(c.include_paths()[0])')
rm -rf "$carry/torch-headers"
for d in torch/headeronly torch/csrc/stable torch/csrc/inductor/aoti_torch/c torch/csrc/inductor/aoti_torch/generated; do
    mkdir -p "$carry/torch-headers/$d" && cp -r "$include/$d/." "$carry/torch-headers/$d/"
done
if grep -q "auto strptr = new std::string" "$carry/torch-headers/torch/csrc/stable/stableivalue_conversions.h"; then
    tar -xzf "$sdist" -O vllm-0.33.0/cmake/patches/pytorch_stable_string.patch | (cd "$carry/torch-headers" && patch -s --batch --forward -p1)
fi
du -sh "$carry"/*
