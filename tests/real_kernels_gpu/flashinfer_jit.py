"""Build FlashInfer's JIT modules that the flashinfer:* backends use, in parallel, before the suite's
workers start (each worker would otherwise wait on FlashInfer's per-module file lock in turn):

    PYTHONPATH=FLASHINFER_TREE:TVM_FFI_SITE:. python3 -m tests.real_kernels_gpu.flashinfer_jit   # on a GPU

One tiny write and decode through the adapter per declared (model dtype, head size) — the exact
calls the suite makes, so the modules built are the ones it loads: the ``page`` module
(csrc/page.cu) and one batch-decode module per dtype and head size (csrc/batch_decode.cu; the
kv_layout and page size are runtime arguments). Prints each one's wall time and whether the
decode of one token returned its value row.
"""

from __future__ import annotations

import concurrent.futures
import time

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.backends_under_test.flashinfer_backend import FlashInferNHD


def write_and_decode_one_token(backend, dtype: torch.dtype, head_size: int) -> str:
    started = time.monotonic()
    g = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=1, head_size=head_size, dtype=dtype)
    spec = CacheSpec(layout=backend.capabilities.layouts[0], geometry=g, model_dtype=dtype)
    cache = backend.allocate(torch.zeros(spec.layout.nbytes(g), dtype=torch.uint8, device="cuda"), spec)
    key, value = (torch.full((1, 1, head_size), x, dtype=dtype, device="cuda") for x in (1.0, 3.0))
    one = torch.ones(1, device="cuda")
    backend.write(cache, key, value, torch.tensor([2 * 16 + 5], device="cuda"), spec, k_scale=one, v_scale=one)
    out = backend.decode(cache, key, torch.tensor([[0, 2]], device="cuda"), torch.tensor([16 + 6], device="cuda"), spec,
                         scale=head_size ** -0.5, k_scale=one, v_scale=one)
    # 22 tokens: 21 zero rows and the written one; the output is a softmax mix of their values.
    return f"{str(dtype)[6:]:>8} D={head_size}: {time.monotonic() - started:5.0f} s, decode out[0, 0, 0] = {float(out[0, 0, 0]):.4f}"


def main() -> None:
    started = time.monotonic()
    backend = FlashInferNHD()
    caps = backend.capabilities
    with concurrent.futures.ThreadPoolExecutor(len(caps.dtypes) * len(caps.head_sizes)) as pool:
        jobs = [pool.submit(write_and_decode_one_token, backend, dtype, head) for dtype in caps.dtypes for head in caps.head_sizes]
        for job in jobs:
            print(job.result(), flush=True)
    print(f"FlashInfer {backend.versions()['flashinfer']}: page and decode modules ready in {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
