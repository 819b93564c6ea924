#!/bin/bash
# kvconform #25, 2026-12-02 seventh session: the tree after region_bytes left the device (0c5828d)
# on one 1 x H200 machine: quick -n 8 (first run, then ordered second runs), full -n 16 (first, ordered).
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-seventh/last/bench.sh
source benchmarks/h200_env.sh
quick_and_full "$PWD"
grep -h "outcomes:" "$OUT"/logs/*.log | sort | uniq -c
grep -h "by family" "$OUT"/logs/q-ordered-*.log | cut -c1-120
