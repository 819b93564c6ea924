#!/usr/bin/env bash
# FlashInfer's own paged-KV append and decode under the suite (flashinfer:nhd, flashinfer:hnd) on one
# NVIDIA GPU with no package registry, from the repository root:
#
#   tests/real_kernels_gpu/flashinfer_suite.sh CARRY OUT
#
# CARRY holds flashinfer.tar.xz (prepare.sh: flashinfer-python's Python tree with the sources of its
# page and batch-decode JIT modules and its own CCCL) and vllm-bundle.tar.xz (for apache-tvm-ffi,
# which FlashInfer's JIT modules load through). Writes into OUT: jit.log (flashinfer_jit.py: the
# modules built, in parallel), dtype-probe.txt (flashinfer_dtype_probe.py), nvfp4-probe.txt and
# nvfp4-probe.json (flashinfer_nvfp4_probe.py: FlashInfer's NVFP4 writer against SPEC §16.1), suite.log,
# results.json.gz and results.html.
set -uo pipefail
carry=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
tree=$(mktemp -d) && tar -xJf "$carry/flashinfer.tar.xz" -C "$tree"
site=$(mktemp -d) && tar -xJf "$carry/vllm-bundle.tar.xz" -C "$site"
export PYTHONPATH="$tree:$site/site:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
unset TRITON_INTERPRET
expectations=(); [ -f docs/expectations/flashinfer-0.7.2.post1.txt ] && expectations=(--kvc-expectations docs/expectations/flashinfer-0.7.2.post1.txt)
timeout 420 python3 -m tests.real_kernels_gpu.flashinfer_jit > "$out/jit.log" 2>&1; tail -n 1 "$out/jit.log"
timeout 60 python3 -m tests.real_kernels_gpu.flashinfer_dtype_probe > "$out/dtype-probe.txt" 2>&1; cat "$out/dtype-probe.txt"
timeout 150 python3 -m tests.real_kernels_gpu.flashinfer_nvfp4_probe "$out" > "$out/nvfp4-probe.txt" 2>&1; tail -n 1 "$out/nvfp4-probe.txt"
timeout 300 python3 -m pytest --pyargs kvconform.conformance -q -p no:cacheprovider --kvc-backend flashinfer:nhd,flashinfer:hnd -n 4 \
    --kvc-json "$out/results.json" --kvc-html "$out/results.html" "${expectations[@]}" \
    > "$out/suite.log" 2>&1
status=$?
gzip -f "$out/results.json"
tail -n 4 "$out/suite.log"
exit $status
