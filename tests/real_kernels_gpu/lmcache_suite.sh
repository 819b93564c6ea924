#!/usr/bin/env bash
# LMCache 0.5.6's connector transfer under the suite on a CUDA GPU: builds lmcache.cuda_ops (and
# lmcache_native) from LMCache's sdist in place with its own setup.py against this machine's torch,
# as lmcache_build.sh does, then runs the connector family on the lmcache:NAME backends
# (backends_under_test/lmcache_connector.py: LMCache's detection, slot mapping and CUDA
# multi_layer_kv_transfer), from the repository root:
#
#   tests/real_kernels_gpu/lmcache_suite.sh lmcache-0.5.6.tar.gz OUT [cachetools-*.whl]
#
# The wheel: LMCache's lmcache.utils imports the pure-Python cachetools; a machine without it and
# without a registry gets it from the carried wheel (pip download --no-deps cachetools).
# Writes OUT/build.log, OUT/suite.log, OUT/results.json, OUT/results.html.
set -uo pipefail
out=$(mkdir -p "$2" && cd "$2" && pwd); sdist=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
wheel=${3:+$(cd "$(dirname "$3")" && pwd)/$(basename "$3")}
work=$(mktemp -d) && tar -xzf "$sdist" -C "$work" && tree=$work/lmcache-0.5.6 || exit 1
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
start=$(date +%s)
( cd "$tree" && TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=16 python3 setup.py build_ext --inplace ) > "$out/build.log" 2>&1
echo "== setup.py build_ext exit $? after $(( $(date +%s) - start )) s (TORCH_CUDA_ARCH_LIST=$arch)" >> "$out/build.log"
python3 -c "import cachetools" 2>/dev/null || [ -z "$wheel" ] || python3 -m zipfile -e "$wheel" "$tree"
KVCONFORM_LMCACHE="$tree" python3 -m pytest --pyargs kvconform.conformance -q -p no:cacheprovider -m connector \
    --kvc-backend lmcache:NHD,lmcache:HND,lmcache:kv_first_NHD,lmcache:kv_first_HND --kvc-device cuda \
    --kvc-json "$out/results.json" --kvc-html "$out/results.html" --kvc-expectations docs/expectations/lmcache-0.5.6.txt > "$out/suite.log" 2>&1
echo "== suite exit $?" >> "$out/suite.log"
tail -n 3 "$out/build.log" "$out/suite.log"
