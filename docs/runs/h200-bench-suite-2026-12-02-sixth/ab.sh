#!/bin/bash
# kvconform #25, 2026-12-02 sixth session, on one 1 x H200 machine, alternately:
#   A  2abdb4c, the fifth session's last tree (carried as old-tree.tgz: `git archive 2abdb4c | gzip`)
#   B  this tree: private probe mappings, CPU-only seeding, cached grid aranges
#   C  B with the pinned probe buffer over a private mapping too (carried as big_caches_C.py)
# quick -n 8 (first run, then ordered second runs) and full -n 16, ordered.
# Run from the repository root: bash docs/runs/h200-bench-suite-2026-12-02-sixth/ab.sh
source benchmarks/h200_env.sh
mkdir -p /tmp/A /tmp/C
tar xzf old-tree.tgz -C /tmp/A
cp -r . /tmp/C && cp big_caches_C.py /tmp/C/conformance/harness/big_caches.py
A=/tmp/A B=$PWD C=/tmp/C
bench $B q-first-B 120 --profiles quick -n 8 --keep /tmp/keep/qb
for i in 1 2; do
  for t in B A C; do bench ${!t} q-ordered-$t-$i 90 --profiles quick -n 8 --keep /tmp/keep/q$t; done
done
bench $B f-first-B 120 --profiles full -n 16 --keep /tmp/keep/fB
for t in B A C; do bench ${!t} f-ordered-$t 100 --profiles full -n 16 --keep /tmp/keep/f$t; done
