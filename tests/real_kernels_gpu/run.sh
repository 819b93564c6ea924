#!/usr/bin/env bash
# The real-kernel runs of docs/REAL_KERNELS.md on one NVIDIA GPU with no package registry, in one
# go, from the repository root:
#
#   tests/real_kernels_gpu/run.sh CARRY OUT [ONLY]
#
# CARRY holds what prepare.sh made on a machine with the registry: vllm-bundle.tar.xz
# (tests/vllm_gpu/build_bundle.py), vllm-src/csrc (vllm_sources.py: vLLM 0.33.0's cache kernels),
# torch-headers/ (stable-ABI headers of a newer torch, the fallback build), aiter/ (the amd-aiter
# wheel's Python tree), flashinfer.tar.xz (flashinfer-python's Python tree and its page module's
# sources, so vLLM's FLASHINFER member imports), lmcache-0.5.6.tar.gz and a cachetools wheel (lmcache_suite.sh). ONLY
# (default FLASH_ATTN,FLEX_ATTENTION,ROCM_ATTN,FLASHINFER) are the vLLM members run with the
# compiled ops. Writes into OUT: versions.txt, build.log, vllm/ and vllm-run.log
# (tests/vllm_gpu/run.py's files), aiter/ (suite results and log, probes.txt), agreement.txt,
# flashinfer-page.txt, flashinfer/ (flashinfer_suite.sh: flashinfer:nhd and flashinfer:hnd under the
# suite), lmcache/ (lmcache_suite.sh: build.log, suite.log, results). docs/runs/real-kernels-h200/ holds such a run.
set -uo pipefail
carry=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd); only=${3:-FLASH_ATTN,FLEX_ATTENTION,ROCM_ATTN,FLASHINFER}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_INTERPRET
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; nvcc --version | tail -n 1; } > "$out/versions.txt" 2>&1

# 0. LMCache's CUDA ops built from its sdist, then the connector family on lmcache:NAME (item 3 of issue #24).
( [ -f "$carry/lmcache-0.5.6.tar.gz" ] && timeout 450 tests/real_kernels_gpu/lmcache_suite.sh "$carry/lmcache-0.5.6.tar.gz" "$out/lmcache" \
    $(ls "$carry"/cachetools-*.whl 2>/dev/null | head -1) ) &

# 1. vLLM's cache kernels, with the device's torch headers; else the carried newer ones.
build=/tmp/vllm-cache-ops
if ! python3 tests/real_kernels_gpu/build_cache_ops.py "$carry/vllm-src" "$build" > "$out/build.log" 2>&1; then
    echo "== build with this torch's headers failed; retrying with $carry/torch-headers first" >> "$out/build.log"
    python3 tests/real_kernels_gpu/build_cache_ops.py "$carry/vllm-src" "$build-fallback" --torch-headers "$carry/torch-headers" >> "$out/build.log" 2>&1 && build="$build-fallback"
fi
library="$build/vllm_0_33_0_cache_ops.so"
[ -f "$library" ] && export KVCONFORM_VLLM_CACHE_OPS="$library"
tail -n 2 "$out/build.log"

# 2. In parallel: vLLM members through the compiled ops, AITER compiled, CUDA vs Triton writers.
site=$(mktemp -d)/unpacked && mkdir -p "$site" && tar -xJf "$carry/vllm-bundle.tar.xz" -C "$site"
flashinfer=$(mktemp -d) && tar -xJf "$carry/flashinfer.tar.xz" -C "$flashinfer"
( PYTHONPATH="$flashinfer${PYTHONPATH:+:$PYTHONPATH}" timeout 350 python3 tests/vllm_gpu/run.py "$carry/vllm-bundle.tar.xz" "$out/vllm" --jobs 3 --only "$only" --deadline 330 \
    -- -n 3 --kvc-expectations "docs/expectations/vllm-0.33.0-gpu${KVCONFORM_VLLM_CACHE_OPS:+-cuda-ops}.txt" > "$out/vllm-run.log" 2>&1 ) &
( mkdir -p "$out/aiter" && KVCONFORM_AITER="$carry" timeout 330 python3 -m pytest --pyargs kvconform.conformance -q -p no:cacheprovider \
    --kvc-backend aiter:flash,aiter:asm -n 4 --kvc-json "$out/aiter/results.json" --kvc-html "$out/aiter/results.html" \
    --kvc-expectations docs/expectations/aiter-0.1.7.post2.dev18.txt > "$out/aiter/suite.log" 2>&1;
  KVCONFORM_AITER="$carry" python3 -m tests.real_kernels_gpu.aiter_probes > "$out/aiter/probes.txt" 2>&1 ) &
( [ -f "$library" ] && PYTHONPATH="$site/site:$PWD" timeout 240 python3 -m tests.real_kernels_gpu.writer_agreement > "$out/agreement.txt" 2>&1 ) &
( PYTHONPATH="$flashinfer:$site/site:$PWD" timeout 300 python3 -m tests.real_kernels_gpu.flashinfer_page > "$out/flashinfer-page.txt" 2>&1;
  tests/real_kernels_gpu/flashinfer_suite.sh "$carry" "$out/flashinfer" > /dev/null 2>&1 ) &
wait
tail -n 5 "$out/vllm-run.log" "$out/aiter/suite.log" "$out/flashinfer/suite.log"; tail -n 3 "$out/agreement.txt"
