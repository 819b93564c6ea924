#!/bin/bash
# kvconform #25, 2026-12-02 sixth session: the session's last tree on one 1 x H200 machine (its
# compiled Triton kernels, the decode kernel's hoisted (head, dim) offsets among them), quick -n 8
# (first run, then ordered second runs) and full -n 16 (first, ordered).
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-sixth/final/bench.sh
source benchmarks/h200_env.sh
quick_and_full "$PWD"
