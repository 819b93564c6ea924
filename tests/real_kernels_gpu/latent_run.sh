#!/usr/bin/env bash
# The latent-cache and quantised-cache runs on one NVIDIA GPU, in one device call, from the
# repository root:
#
#   bash tests/real_kernels_gpu/latent_run.sh CARRY OUT
#
# CARRY holds vllm-src/ (vllm_sources.py: vLLM 0.33.0's cache kernels) and torch-headers/ (the
# fallback build's stable-ABI headers; prepare.sh makes both). Writes into OUT: versions.txt,
# build.log, suite/ (the conformance suite on vLLM's compiled latent kernels and kvconform's own
# latent and quantised backends: results.json, results.html, suite.log) and bench/ (the quick
# profile of every built-in, -n 8, two runs: benchmarks/bench_suite.py; BENCH=0 skips it).
set -uo pipefail
carry=$(cd "$1" && pwd); out=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 TRITON_CACHE_DIR=/tmp/tc
unset TRITON_INTERPRET
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import sys, torch, triton; print(sys.version.split()[0], torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"; } > "$out/versions.txt" 2>&1

# kvconform importable with its pytest11 and backend entry points (the image does not install it).
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' \
    > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
export PYTHONPATH="/tmp/ep:$PWD"

# 1. vLLM's cache kernels (with its latent ops), with the device's torch headers; else the carried ones.
build=/tmp/vllm-cache-ops
if ! timeout 60 python3 tests/real_kernels_gpu/build_cache_ops.py "$carry/vllm-src" "$build" > "$out/build.log" 2>&1; then
    echo "== build with this torch's headers failed; retrying with $carry/torch-headers first" >> "$out/build.log"
    timeout 60 python3 tests/real_kernels_gpu/build_cache_ops.py "$carry/vllm-src" "$build-fallback" --torch-headers "$carry/torch-headers" >> "$out/build.log" 2>&1 && build="$build-fallback"
fi
[ -f "$build/vllm_0_33_0_cache_ops.so" ] && export KVCONFORM_VLLM_CACHE_OPS="$build/vllm_0_33_0_cache_ops.so"
tail -n 2 "$out/build.log"

# 2. The suite on the latent and quantised backends, compiled.
mkdir -p "$out/suite"
timeout "${SUITE_LIMIT:-100}" python3 -m pytest --pyargs kvconform.conformance -q -p no:cacheprovider -n 8 --kvc-device cuda \
    --kvc-backend vllm_ops:mla,triton_mla,reference_mla,reference_quant \
    --kvc-json "$out/suite/results.json" --kvc-html "$out/suite/results.html" > "$out/suite/suite.log" 2>&1
echo "suite exit $?"; tail -n 25 "$out/suite/suite.log"

# 3. The quick profile of every built-in, -n 8: a first run, and (RUNS=2) one ordered by its durations.
#    BENCH=0 skips it (a call that shares the GPU with other runs would time them, not the suite).
[ "${BENCH:-1}" = 0 ] && exit 0
mkdir -p "$out/bench"
for run in $( [ "${RUNS:-1}" = 2 ] && echo first ordered || echo first ); do
    timeout "${BENCH_LIMIT:-90}" python3 benchmarks/bench_suite.py --label "q-$run" --summary "$out/bench/summary.jsonl" --profiles quick -n 8 --keep /tmp/keep/q \
        > "$out/bench/q-$run.log" 2>&1
    echo "bench q-$run exit $?"; grep -E "wall with|efficiency|time outside|Traceback|rror" "$out/bench/q-$run.log" | cut -c1-200 | head -4
done
