"""What Triton's CPU interpreter (``TRITON_INTERPRET=1``) computes wrongly, measured, not assumed.

The interpreter keeps bfloat16 tensors as ``numpy.uint16`` bit patterns (numpy has no bfloat16)
and runs float arithmetic with the numpy op on that storage (``triton/runtime/interpreter.py``:
``np_types[tl.bfloat16] = np.uint16``; ``create_fmul`` / ``create_fadd`` / ``create_fneg`` →
``binary_op`` / ``unary_op`` on ``.data``). So any ``*``, ``+``, ``-`` or comparison whose
operands are both bfloat16 multiplies, adds or negates the *integers*: ``1.5 · 1.0`` gives
``1.08e-19``. Conversions (``x.to(tl.float32)``, stores through a cast) are right, so a kernel
that widens bfloat16 before arithmetic, or copies its bits, is unaffected. Triton documents it
("does not support operations on bfloat16 numeric types", debugging guide; triton-lang/triton
#4972, PR #10945 closed unmerged, #11584 for ``tl.dot``, #11604 for ``tl.sum``); compiled
kernels compute in the value domain.

:func:`bf16_arithmetic_defect` runs the one-line reproducer and says what it saw, so adapters
declare a case not applicable exactly while the defect is there, and stop on the first Triton
that fixes it.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def bf16_product_kernel(x_ptr, y_ptr, out_ptr):
    """``out = x · y`` with both operands bfloat16: the reproducer of the defect."""
    tl.store(out_ptr, tl.load(x_ptr) * tl.load(y_ptr))


def bf16_product(x: float, y: float) -> float:
    """``x · y`` computed by :func:`bf16_product_kernel` (on the CPU tensors the interpreter takes)."""
    a, b = (torch.tensor([v], dtype=torch.bfloat16) for v in (x, y))
    out = torch.zeros(1, dtype=torch.bfloat16)
    bf16_product_kernel[(1,)](a, b, out)
    return float(out[0])


@functools.cache
def bf16_arithmetic_defect() -> str | None:
    """Why bfloat16 arithmetic inside a Triton kernel is wrong here, or None (compiled Triton,
    or an interpreter that computes it right)."""
    if not interpreted():
        return None
    got = bf16_product(1.5, 1.0)
    if got == 1.5:
        return None
    return (f"Triton {triton.__version__}'s interpreter (TRITON_INTERPRET=1) does bfloat16 arithmetic on the uint16 bit "
            f"patterns it stores bfloat16 in: 1.5 * 1.0 in bfloat16 gave {got:.3g} (triton-lang/triton#4972, PR #10945)")
