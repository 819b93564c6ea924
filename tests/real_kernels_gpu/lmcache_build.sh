#!/usr/bin/env bash
# LMCache 0.5.6's CUDA ops (lmcache.cuda_ops: the paged-memory GPU connector's gather/scatter
# kernels, csrc/cuda/) built from LMCache's own sdist against this machine's torch, with LMCache's
# setup.py, then loaded: the step issue #24 found blocking (the wheel's prebuilt cuda_ops is built
# against another torch: "undefined symbol: _ZN3c1019NotImplementedErrorC1E…" on torch 2.11).
#
#   tests/real_kernels_gpu/lmcache_build.sh lmcache-0.5.6.tar.gz LOG
#
# The sdist (sha256 d6951e60ce8818a76aa42d0866a4ba85f1c95cd919355fff30ff24dcc3243f1e) was fetched
# with NO_CUDA_EXT=1 pip download --no-deps --no-binary :all: --no-build-isolation lmcache==0.5.6.
set -uo pipefail
log=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
work=$(mktemp -d) && tar -xzf "$1" -C "$work" && cd "$work"/lmcache-0.5.6 || exit 1
arch=$(python3 -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
start=$(date +%s)
TORCH_CUDA_ARCH_LIST=$arch MAX_JOBS=12 python3 setup.py build_ext --inplace > "$log" 2>&1
echo "== setup.py build_ext exit $? after $(( $(date +%s) - start )) s (TORCH_CUDA_ARCH_LIST=$arch)" >> "$log"
python3 -c "import torch, lmcache.cuda_ops as ops; print('== lmcache.cuda_ops', ops.__file__, 'loads with torch', torch.__version__, ':', ', '.join(n for n in sorted(dir(ops)) if not n.startswith('_')))" >> "$log" 2>&1
