"""``tl.flip`` and ``tl.xor_sum`` under Triton's interpreter, once with its own per-element loop and
once with ``triton_interpreter.exact_xor_reduction``: prints what each computed and the time it
took, as JSON (tests/test_triton_interpreter.py). Run as ``python -m tests.triton_xor_ops``."""

import json
import os
import time

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kvconform.backends_under_test import triton_interpreter  # noqa: E402

ROWS, COLS = 4, 64


@triton.jit
def flip_and_xor(x_ptr, flipped_ptr, by_row_ptr, by_col_ptr, whole_ptr, R: tl.constexpr, C: tl.constexpr):
    rows, cols = tl.arange(0, R), tl.arange(0, C)
    x = tl.load(x_ptr + rows[:, None] * C + cols[None, :])
    tl.store(flipped_ptr + rows[:, None] * C + cols[None, :], tl.flip(x, 1))
    tl.store(by_row_ptr + rows, tl.xor_sum(x.to(tl.int16, bitcast=True), 1))
    tl.store(by_col_ptr + cols, tl.xor_sum(x.to(tl.int16, bitcast=True), 0))
    tl.store(whole_ptr, tl.xor_sum(x.to(tl.int16, bitcast=True)))


def run() -> dict:
    # fp16 bit patterns of every kind: -0.0, infinities, NaN payloads, subnormals
    x = torch.randint(-2**15, 2**15, (ROWS, COLS), generator=torch.Generator().manual_seed(7), dtype=torch.int16).view(torch.float16)
    outs = [torch.zeros(ROWS, COLS, dtype=torch.float16), torch.zeros(ROWS, dtype=torch.int16), torch.zeros(COLS, dtype=torch.int16),
            torch.zeros(1, dtype=torch.int16)]
    start = time.perf_counter()
    flip_and_xor[(1,)](x, *outs, ROWS, COLS)
    seconds = time.perf_counter() - start
    bits = x.view(torch.int16)
    return {"flip": outs[0].view(torch.int16).tolist(), "by_row": outs[1].tolist(), "by_col": outs[2].tolist(), "whole": outs[3].tolist(),
            "expected_flip": torch.flip(bits, [1]).tolist(), "seconds": seconds,
            "expected_by_row": [_xor(r) for r in bits.tolist()], "expected_by_col": [_xor(c) for c in bits.T.tolist()],
            "expected_whole": [_xor(bits.flatten().tolist())]}


def _xor(values: list[int]) -> int:
    out = 0
    for v in values:
        out ^= v
    return out


if __name__ == "__main__":
    loop = run()
    installed = triton_interpreter.exact_xor_reduction()
    print(json.dumps({"loop": loop, "exact": run(), "installed": installed}))
