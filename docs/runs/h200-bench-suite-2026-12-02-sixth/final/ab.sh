#!/bin/bash
# kvconform #25, 2026-12-02 sixth session: the fifth session's last tree (A, 2abdb4c, carried as
# old-tree.tgz: `git archive 2abdb4c | gzip`) and this session's (B) alternately on the machine
# bench.sh ran on (warm Triton cache), quick -n 8 and full -n 16, ordered runs.
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-sixth/final/ab.sh
source benchmarks/h200_env.sh
mkdir -p /tmp/A && tar xzf old-tree.tgz -C /tmp/A
A=/tmp/A B=$PWD
bench $A q-warm-A 120 --profiles quick -n 8 --keep /tmp/keep/qA
for i in 1 2; do for t in B A; do bench ${!t} q-ordered-$t-$i 90 --profiles quick -n 8 --keep /tmp/keep/q$t; done; done
bench $A f-warm-A 120 --profiles full -n 16 --keep /tmp/keep/fA
for t in B A; do bench ${!t} f-ordered-$t 100 --profiles full -n 16 --keep /tmp/keep/f$t; done
