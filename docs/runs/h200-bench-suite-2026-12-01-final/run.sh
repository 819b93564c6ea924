#!/bin/bash
# kvconform #25, 2026-12-01 third session: the final tree (recorder makes its document once), first and
# ordered second runs, quick -n 8 and full -n 16, 1 x H200 (the recipe of ..-ordered/run.sh).
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info /tmp/keep $OUT/logs
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/ep TRITON_CACHE_DIR=/tmp/tc
bench() { local name=$1 limit=$2; shift 2
  echo "=== $(date +%T) $name"
  CUDA_VISIBLE_DEVICES=0 timeout $limit python3 benchmarks/bench_suite.py --label "$name" --summary $OUT/summary.jsonl "$@" > $OUT/logs/$name.log 2>&1
  echo "exit $? (limit $limit s)"; grep -E "wall with|efficiency|outcomes|Different|error" $OUT/logs/$name.log | head -6; }
trap 'cd $OUT && tar -czf all.tar.gz logs summary.jsonl; rm -rf logs summary.jsonl' EXIT
echo "=== $(date +%T) machine"; nvidia-smi -L; nproc; git log --oneline -1 2>/dev/null
bench q-first 120 --profiles quick -n 8 --keep /tmp/keep/q
bench q-ordered 90 --profiles quick -n 8 --keep /tmp/keep/q
bench q-ordered-again 90 --profiles quick -n 8 --keep /tmp/keep/q
bench f-first 120 --profiles full -n 16 --keep /tmp/keep/f
bench f-ordered 120 --profiles full -n 16 --keep /tmp/keep/f
