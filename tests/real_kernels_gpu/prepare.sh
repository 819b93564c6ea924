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
