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

It is also slow where it need not be: a reduction whose combine function it does not know runs
element by element in Python, and ``tl.flip`` is ``log2(n)`` xor-reductions — AITER's rope reaches
it on every key row (70 % of an interpreted AITER suite run). :func:`exact_xor_reduction` gives the
interpreter numpy's integer xor-reduction for ``xor_sum``, bit for bit what its own loop computes.
"""

from __future__ import annotations

import functools
import os

import numpy as np
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


def exact_xor_reduction() -> bool:
    """Make the interpreter reduce ``xor_sum`` with ``numpy.bitwise_xor.reduce`` instead of its
    per-element Python loop (exact: integer xor is associative and commutative). True when in
    place; False where this Triton's interpreter is not the one this was written against (it then
    keeps its own loop)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    reduce_ops, combine = getattr(interpreter, "ReduceOps", None), getattr(tl.standard, "_xor_combine", None)
    if reduce_ops is None or combine is None or not hasattr(reduce_ops, "apply_impl"):
        return False
    if getattr(reduce_ops.apply_impl, "exact_xor", False):
        return True
    loop = reduce_ops.apply_impl

    def apply_impl(self, input):
        if self.combine_fn is not combine or len(input) != 1:
            return loop(self, input)
        data = input[0].handle.data
        return self.to_tensor(np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims), input[0].dtype)

    apply_impl.exact_xor = True  # type: ignore[attr-defined]
    reduce_ops.apply_impl = apply_impl
    return True
