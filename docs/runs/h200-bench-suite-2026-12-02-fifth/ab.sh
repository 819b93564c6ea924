#!/bin/bash
# kvconform #25, 2026-12-02 fifth session: xdist workers forked from a zygote (default) against
# new Pythons (--kvc-fresh-workers), alternately on one 1 x H200 machine, the same tree;
# quick -n 8 (first run, then ordered second runs), full -n 16, and one py-spy profile of a forked run.
# The recipe of ../h200-bench-suite-2026-12-01-fourth/ab.sh (entry points through /tmp/ep).
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info /tmp/keep $OUT/logs
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/ep TRITON_CACHE_DIR=/tmp/tc
[ -f "$PYSPY_WHEEL" ] && pip install -q "$PYSPY_WHEEL" 2>&1 | tail -1
bench() { local name=$1 limit=$2; shift 2
  echo "=== $(date +%T) $name"
  CUDA_VISIBLE_DEVICES=0 timeout $limit python3 benchmarks/bench_suite.py --label "$name" --summary $OUT/summary.jsonl "$@" > $OUT/logs/$name.log 2>&1
  echo "exit $? (limit $limit s)"; grep -E "wall with|efficiency|Different|error|Traceback" $OUT/logs/$name.log | head -4; grep -E "^ +gw[0-9]+ " $OUT/logs/$name.log | head -3; }
trap 'cd $OUT && tar -czf all.tar.gz logs summary.jsonl; rm -rf logs summary.jsonl' EXIT
echo "=== $(date +%T) machine"; nvidia-smi -L; nproc
bench q-first-forked 120 --profiles quick -n 8 --keep /tmp/keep/q
for i in 1 2; do
  bench q-ordered-forked-$i 90 --profiles quick -n 8 --keep /tmp/keep/q
  bench q-ordered-fresh-$i 90 --profiles quick -n 8 --keep /tmp/keep/q -- --kvc-fresh-workers
done
bench f-first-forked 120 --profiles full -n 16 --keep /tmp/keep/f
bench f-ordered-forked 100 --profiles full -n 16 --keep /tmp/keep/f
bench f-ordered-fresh 100 --profiles full -n 16 --keep /tmp/keep/f -- --kvc-fresh-workers
command -v py-spy >/dev/null && bench q-pyspy-forked 120 --profiles quick -n 8 --keep /tmp/keep/q --py-spy $OUT/logs/q-pyspy-forked.raw
