#!/bin/bash
# kvconform #25, 2026-12-01 fourth session: the tree before this session (8d8b86f, carried as
# old-tree.tgz, made by `git archive 8d8b86f | gzip > old-tree.tgz`) and this session's tree, alternately on
# one 1 x H200 machine, quick -n 8 then full -n 16,
# each first run then ordered second runs (the recipe of ../h200-bench-suite-2026-12-01-final/run.sh).
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info /tmp/keep $OUT/logs /tmp/old
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
tar xzf old-tree.tgz -C /tmp/old
export PYTHONPATH=/tmp/ep TRITON_CACHE_DIR=/tmp/tc
bench() { local tree=$1 name=$2 limit=$3; shift 3
  echo "=== $(date +%T) $name ($tree)"
  (cd $tree && CUDA_VISIBLE_DEVICES=0 timeout $limit python3 benchmarks/bench_suite.py --label "$name" --summary $OUT/summary.jsonl "$@") > $OUT/logs/$name.log 2>&1
  echo "exit $? (limit $limit s)"; grep -E "wall with|efficiency|Different|error" $OUT/logs/$name.log | head -4; }
trap 'cd $OUT && tar -czf all.tar.gz logs summary.jsonl; rm -rf logs summary.jsonl' EXIT
echo "=== $(date +%T) machine"; nvidia-smi -L; nproc
new=$PWD old=/tmp/old
bench $new q-first-new 120 --profiles quick -n 8 --keep /tmp/keep/qn
bench $old q-first-old 120 --profiles quick -n 8 --keep /tmp/keep/qo
for i in 1 2; do
  bench $new q-ordered-new-$i 90 --profiles quick -n 8 --keep /tmp/keep/qn
  bench $old q-ordered-old-$i 90 --profiles quick -n 8 --keep /tmp/keep/qo
done
bench $new f-first-new 120 --profiles full -n 16 --keep /tmp/keep/fn
bench $new f-ordered-new 120 --profiles full -n 16 --keep /tmp/keep/fn
