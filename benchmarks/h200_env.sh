# Sourced by the device scripts of docs/runs/ (bash, run from the repository root on the lent
# H200, whose image has torch, Triton, pytest, Hypothesis and xdist but not kvconform installed):
# makes `kvconform` importable with its pytest11 and backend entry points, and defines
#   bench TREE NAME LIMIT_S BENCH_SUITE_ARGS…   one benchmarks/bench_suite.py run of TREE on GPU 0,
#                                               its log in $OUT/logs/NAME.log, a line in $OUT/summary.jsonl
#   quick_and_full TREE                         the runs that compare trees: quick -n 8 (first, then two
#                                               ordered second runs), full -n 16 (first, ordered)
# On exit the logs and the summary are packed into $OUT/all.tar.gz (one file comes back).
set -o pipefail
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=/tmp/tc
mkdir -p /tmp/ep/kvconform-0.2.0.dist-info /tmp/keep "$OUT/logs"
printf 'Metadata-Version: 2.1\nName: kvconform\nVersion: 0.2.0\n' > /tmp/ep/kvconform-0.2.0.dist-info/METADATA
printf '[pytest11]\nkvconform = kvconform.conformance.plugin.hooks\n\n[kvconform.backends]\nreference = kvconform.backends_under_test.reference_backend:ReferenceBackend\n' \
    > /tmp/ep/kvconform-0.2.0.dist-info/entry_points.txt
export PYTHONPATH=/tmp/ep
if [ -f "${PYSPY_WHEEL:-}" ]; then pip install -q "$PYSPY_WHEEL" 2>&1 | tail -1; fi

bench() {
    local tree=$1 name=$2 limit=$3
    shift 3
    echo "=== $(date +%T) $name"
    (cd "$tree" && CUDA_VISIBLE_DEVICES=0 timeout "$limit" python3 benchmarks/bench_suite.py --label "$name" --summary "$OUT/summary.jsonl" "$@") \
        > "$OUT/logs/$name.log" 2>&1
    echo "exit $? (limit $limit s)"
    grep -E "wall with|efficiency|time outside|Traceback|rror" "$OUT/logs/$name.log" | cut -c1-230 | head -4
}

quick_and_full() {
    local tree=$1
    bench "$tree" q-first 120 --profiles quick -n 8 --keep /tmp/keep/q
    for i in 1 2; do bench "$tree" q-ordered-$i 90 --profiles quick -n 8 --keep /tmp/keep/q; done
    bench "$tree" f-first 120 --profiles full -n 16 --keep /tmp/keep/f
    bench "$tree" f-ordered 100 --profiles full -n 16 --keep /tmp/keep/f
}

trap 'cd "$OUT" && tar -czf all.tar.gz logs summary.jsonl && rm -rf logs summary.jsonl' EXIT
echo "=== $(date +%T) machine"
nvidia-smi -L
nproc
