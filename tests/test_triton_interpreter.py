"""The Triton interpreter's bfloat16 defect (backends_under_test/triton_interpreter.py) is still
there, the detector of tests/triton_bf16_ops.py sees it, and kvconform's own Triton kernels never
meet it: their bf16 paths copy bits or widen to fp32 before any arithmetic."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .suite_runs import ROOT


@pytest.fixture(scope="module")
def ops():
    proc = subprocess.run([sys.executable, "-m", "tests.triton_bf16_ops", "builtin"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_the_interpreter_still_multiplies_bf16_bit_patterns(ops):
    """When this fails, Triton fixed it: the AITER adapter's bf16 writes run again by themselves
    (they ask triton_interpreter.bf16_arithmetic_defect); update docs/REAL_KERNELS.md."""
    assert ops["bf16_product"] != 1.5
    assert "1.5 * 1.0 in bfloat16 gave" in ops["defect"]


def test_the_detector_sees_the_reproducers_bf16_multiplication(ops):
    assert ops["reproducer"] == ["binary_op(multiply)"]


def test_kvconforms_own_writers_and_decode_do_no_bf16_arithmetic(ops):
    runs = {name: seen for name, seen in ops.items() if name.startswith(("reshape_and_cache", "paged_decode"))}
    assert len(runs) == 7 and all(seen == [] for seen in runs.values()), runs


@pytest.fixture(scope="module")
def xor_ops():
    proc = subprocess.run([sys.executable, "-m", "tests.triton_xor_ops"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("path", ["loop", "exact"])
def test_flip_and_xor_sum_give_the_same_bits_with_the_interpreters_loop_and_numpys_reduction(xor_ops, path):
    """fp16 bit patterns of every kind flipped along a row, xor-reduced by row, by column and whole."""
    assert xor_ops["installed"], "exact_xor_reduction no longer fits this Triton's interpreter: AITER's interpreted runs take minutes again"
    got = xor_ops[path]
    for what in ("flip", "by_row", "by_col", "whole"):
        assert got[what] == got[f"expected_{what}"], f"{path}: {what} differs"
