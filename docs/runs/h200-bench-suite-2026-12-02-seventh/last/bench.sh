#!/bin/bash
# kvconform #25, 2026-12-02 seventh session: the tree after region_bytes left the device (0c5828d)
# on one 1 x H200 machine: quick -n 8 (first run, then ordered second runs), full -n 16 (first, ordered).
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-seventh/last/bench.sh
source benchmarks/h200_env.sh
T=$PWD
bench $T q-first 120 --profiles quick -n 8 --keep /tmp/keep/q
for i in 1 2; do bench $T q-ordered-$i 90 --profiles quick -n 8 --keep /tmp/keep/q; done
bench $T f-first 120 --profiles full -n 16 --keep /tmp/keep/f
bench $T f-ordered 100 --profiles full -n 16 --keep /tmp/keep/f
grep -h "outcomes:" "$OUT"/logs/*.log | sort | uniq -c
grep -h "by family" "$OUT"/logs/q-ordered-*.log | cut -c1-120
