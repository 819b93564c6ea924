"""tests/test_triton_latent_kernels.py calls the latent kernels on CPU tensors, so it needs Triton's
interpreter from the moment triton is first imported; `./kvc test` runs without TRITON_INTERPRET (the
suite sets it only in its own runs), and that module skipped all of its tests in CI. Here it runs in
a pytest of its own, interpreted, and every one of its tests must pass."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kvconform.backends_under_test.triton_interpreter import interpreted

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(interpreted(), reason="this process is interpreted: test_triton_latent_kernels.py runs here itself")
def test_latent_kernel_tests_all_pass_under_the_interpreter():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_triton_latent_kernels.py"],
                          cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"}, capture_output=True, text=True, timeout=1800)
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0 and re.fullmatch(r"=* ?\d+ passed in .*", summary), f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
