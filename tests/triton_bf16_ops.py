"""Which float ops Triton's interpreter runs on bfloat16 operands, per kernel run: the detector for
the interpreter's bfloat16 defect (backends_under_test/triton_interpreter.py).

    TRITON_INTERPRET=1 python -m tests.triton_bf16_ops builtin|aiter    # prints one JSON object

The interpreter keeps bfloat16 as uint16 bit patterns; its ``binary_op``, ``unary_op``,
``create_fma`` and ``create_dot`` (triton/runtime/interpreter.py) run numpy on that storage. Every
call of one with a bfloat16 operand is recorded by name. A kernel that widens bfloat16 before
arithmetic, or copies its bits, records nothing. Run in a fresh process: ``triton.jit`` picks the
interpreter when a kernel is defined, so TRITON_INTERPRET must be set before Triton is imported.
"""

from __future__ import annotations

import contextlib
import json
import sys
from unittest import mock

import torch


@contextlib.contextmanager
def bf16_float_ops():
    """The interpreter ops run on bfloat16 operands inside the block (``binary_op(multiply)`` …)."""
    from triton.runtime import interpreter

    seen: list[str] = []
    builder = interpreter.InterpreterBuilder

    def recording(name):
        original = getattr(builder, name)

        def op(self, *args, **kwargs):
            if any(isinstance(a, interpreter.TensorHandle) and str(a.dtype.scalar) == "bf16" for a in args):
                seen.append(f"{name}({getattr(args[-1], '__name__', '')})" if name in ("binary_op", "unary_op") else name)
            return original(self, *args, **kwargs)

        return mock.patch.object(builder, name, op)

    with contextlib.ExitStack() as stack:
        for name in ("binary_op", "unary_op", "create_fma", "create_dot"):
            stack.enter_context(recording(name))
        yield seen


def rows(tokens: int, heads: int, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return tuple((torch.randn(tokens, heads, head_size, generator=gen) * 4).to(torch.bfloat16) for _ in range(2))


def builtin() -> dict:
    """kvconform's Triton writers (every form, bf16 and fp8 caches fed bf16 rows) and paged decode."""
    from kvconform.backends_under_test import triton_interpreter
    from kvconform.backends_under_test import triton_kernels as K

    found = {"bf16_product": triton_interpreter.bf16_product(1.5, 1.0), "defect": triton_interpreter.bf16_arithmetic_defect()}
    with bf16_float_ops() as seen:
        triton_interpreter.bf16_product(1.5, 1.0)
    found["reproducer"] = seen
    B, N, H, D = 3, 16, 2, 64
    key, value = rows(5, H, D)
    for form in ("STRIDED", "X_TILES", "LEGACY"):
        for cache_dtype in (torch.bfloat16, torch.float8_e4m3fn):
            x = 16 // cache_dtype.itemsize
            shapes = {"STRIDED": ((B, N, H, D), (B, N, H, D)), "X_TILES": ((B, H, D // x, N, x), (B, H, N // x, D, x)),
                      "LEGACY": ((B, H, D // x, N, x), (B, H, D, N))}[form]
            k_cache, v_cache = (torch.zeros(shape, dtype=cache_dtype) for shape in shapes)
            with bf16_float_ops() as seen:
                K.reshape_and_cache(key, value, k_cache, v_cache, torch.tensor([0, 17, -1, 33, 47]), torch.tensor([0.5]), torch.tensor([2.0]),
                                    form=getattr(K, form).value, block_size=N, x=x)
            found[f"reshape_and_cache {form} {str(cache_dtype).removeprefix('torch.')}"] = seen
    k_cache, v_cache = (torch.randn(B, N, H, D).to(torch.bfloat16) for _ in range(2))
    with bf16_float_ops() as seen:
        K.paged_decode(torch.randn(2, 2 * H, D).to(torch.bfloat16), k_cache, v_cache, torch.tensor([[0, 2], [1, 0]]), torch.tensor([20, 9]),
                       torch.ones(1), torch.ones(1), scale=D**-0.5, num_kv_heads=H, form=K.STRIDED.value, block_size=N)
    found["paged_decode STRIDED bfloat16"] = seen
    return found


def aiter() -> dict:
    """AITER's fused_qk_rope_reshape_and_cache on bf16 rows, as the aiter: adapters call it (both layouts)."""
    from kvconform import reference as R
    from kvconform.backends_under_test import aiter_backend
    from kvconform.backends_under_test.contract import CacheSpec

    found = {}
    for backend in (aiter_backend.AiterFlash(), aiter_backend.AiterAsm()):
        layout = backend.capabilities.layouts[0]
        g = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        spec = CacheSpec(layout=layout, geometry=g, model_dtype=torch.bfloat16)
        cache = backend.allocate(torch.zeros(layout.nbytes(g), dtype=torch.uint8), spec)
        key, value = rows(3, 2, 64)
        k_cache, v_cache = backend.kernel_views(cache, spec)
        with bf16_float_ops() as seen:
            backend._kernel(torch.zeros(3, 4, 64, dtype=torch.bfloat16), key, value, k_cache, v_cache, torch.tensor([0, 17, 33]),
                            torch.zeros(3, dtype=torch.int64), *torch.tensor([[1.0] * 32 + [0.0] * 32]).to(torch.bfloat16).chunk(2, dim=-1),
                            torch.ones(1), torch.ones(1), True, flash_layout=backend.flash_layout, apply_scale=False, output_zeros=False)
        found[f"fused_qk_rope_reshape_and_cache flash_layout={backend.flash_layout}"] = sorted(set(seen))
    return found


if __name__ == "__main__":
    print(json.dumps({"builtin": builtin, "aiter": aiter}[sys.argv[1]]()))
