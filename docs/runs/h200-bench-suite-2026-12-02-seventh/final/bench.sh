#!/bin/bash
# kvconform #25, 2026-12-02 seventh session: the session's last tree (the decode kernel's query
# heads per program, the writer's fp8-only _encode, the reference's cached strides) on one
# 1 x H200 machine: quick -n 8 (first run, then ordered second runs), full -n 16 (first, ordered).
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-seventh/final/bench.sh
source benchmarks/h200_env.sh
quick_and_full "$PWD"
grep -h "outcomes:" "$OUT"/logs/*.log | sort | uniq -c
