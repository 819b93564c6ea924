#!/bin/bash
# kvconform #25, 2026-12-02 fifth session (result: no difference; tree A's exit kept): how a forked worker ends. Tree A (c2b3a2c, carried as
# old-tree.tgz from `git archive c2b3a2c | gzip`): the child ends through the interpreter's exit
# (every module torn down). Tree B (this tree): threads joined, atexit handlers run, streams
# flushed, os._exit. Alternately on one 1 x H200 machine, quick -n 8 and full -n 16, ordered runs.
set -o pipefail
export PYTHONUNBUFFERED=1
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info /tmp/keep $OUT/logs /tmp/old
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
tar xzf old-tree.tgz -C /tmp/old  # run from the repository root: bash docs/runs/…/exit-ab/exit-ab.sh
export PYTHONPATH=/tmp/ep TRITON_CACHE_DIR=/tmp/tc
bench() { local tree=$1 name=$2 limit=$3; shift 3
  echo "=== $(date +%T) $name"
  (cd $tree && CUDA_VISIBLE_DEVICES=0 timeout $limit python3 benchmarks/bench_suite.py --label "$name" --summary $OUT/summary.jsonl "$@") > $OUT/logs/$name.log 2>&1
  echo "exit $? (limit $limit s)"; grep -E "wall with|time outside|Traceback" $OUT/logs/$name.log | cut -c1-230 | head -3; }
trap 'cd $OUT && tar -czf all.tar.gz logs summary.jsonl; rm -rf logs summary.jsonl' EXIT
echo "=== $(date +%T) machine"; nvidia-smi -L; nproc
new=$PWD old=/tmp/old
bench $new q-first-B 120 --profiles quick -n 8 --keep /tmp/keep/qb
bench $old q-first-A 120 --profiles quick -n 8 --keep /tmp/keep/qa
for i in 1 2; do
  bench $new q-ordered-B-$i 90 --profiles quick -n 8 --keep /tmp/keep/qb
  bench $old q-ordered-A-$i 90 --profiles quick -n 8 --keep /tmp/keep/qa
done
bench $new f-first-B 120 --profiles full -n 16 --keep /tmp/keep/fb
bench $new f-ordered-B 100 --profiles full -n 16 --keep /tmp/keep/fb
bench $old f-ordered-A 100 --profiles full -n 16 --keep /tmp/keep/fb
