"""FlashInfer's paged-KV append on an E1 blocks-first cache, byte for byte against kvconform's reference.

    PYTHONPATH=FLASHINFER_TREE:TVM_FFI_SITE python -m tests.real_kernels_gpu.flashinfer_page   # on a GPU

``flashinfer.page.append_paged_kv_cache`` (flashinfer-python 0.7.2.post1; its ``page`` module is
JIT-compiled with nvcc from the wheel's csrc/page.cu on first use) takes the single-tensor cache
``[pages, 2, N, H, D]`` (NHD) or ``[pages, 2, H, N, D]`` (HND): kvconform's E1 blocks-first layout
in either order. Token ``i`` of request ``b`` at position ``p`` lands in page
``kv_indices[kv_indptr[b] + p // N]``, row ``p % N``: kvconform's slot ``page·N + p % N``. Two
requests over random initial cache bytes: pages [3, 1] with 20 tokens appended (positions 0-19),
pages [4, 0] with 5 (the last five of a 21-token sequence: positions 16-20, page 0); the whole storage is compared with ``reference.ops.reshape_and_cache`` of the same
tokens at those slots. A probe of item 4 of issue #24, not an adapter: slot mappings, padding and
fp8 have no FlashInfer counterpart here.
"""

from __future__ import annotations

import itertools
import time

import torch

from kvconform import reference as R

N, PAGES = 16, 6
KV_INDPTR, KV_INDICES, APPENDED = [0, 2, 4], [3, 1, 4, 0], [20, 5]


def appended_slots() -> list[int]:
    """Where FlashInfer's documented semantics put each appended token: the appended tokens are the
    last ones of their sequence, whose length is ``(pages − 1)·N + kv_last_page_len``."""
    slots = []
    for b, appended in enumerate(APPENDED):
        pages = KV_INDICES[KV_INDPTR[b]:KV_INDPTR[b + 1]]
        length = (len(pages) - 1) * N + (appended - 1) % N + 1
        slots += [pages[p // N] * N + p % N for p in range(length - appended, length)]
    return slots


def case(order: str, dtype: torch.dtype, heads: int, head_size: int) -> str:
    import flashinfer

    g = R.Geometry(num_blocks=PAGES, block_size=N, num_kv_heads=heads, head_size=head_size, dtype=dtype)
    layout = R.blocks_first(order)
    gen = torch.Generator().manual_seed(heads * head_size)
    initial = torch.randint(0, 256, (layout.nbytes(g),), dtype=torch.uint8, generator=gen)
    storage = initial.clone().cuda()
    physical = storage.view(dtype).view(PAGES, 2, *((N, heads) if order == "NHD" else (heads, N)), head_size)
    total = sum(APPENDED)
    key, value = ((torch.randn(total, heads, head_size, generator=gen) * 4).to(dtype).cuda() for _ in range(2))
    kv_indptr, kv_indices = torch.tensor(KV_INDPTR, dtype=torch.int32).cuda(), torch.tensor(KV_INDICES, dtype=torch.int32).cuda()
    kv_last_page_len = torch.tensor([(n - 1) % N + 1 for n in APPENDED], dtype=torch.int32).cuda()
    append_indptr = torch.tensor([0, *itertools.accumulate(APPENDED)], dtype=torch.int32).cuda()
    seq_lens = flashinfer.get_seq_lens(kv_indptr, kv_last_page_len, N)
    batch_indices, positions = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, total)
    flashinfer.append_paged_kv_cache(key, value, batch_indices, positions, physical, kv_indices, kv_indptr, kv_last_page_len, kv_layout=order)
    torch.cuda.synchronize()
    slots = torch.tensor(appended_slots())
    expected = initial.clone()
    R.ops.reshape_and_cache(key.cpu(), value.cpu(), expected, layout, g, slots)
    got = storage.cpu()
    differ = int((got.view(R.bits_dtype(dtype)) != expected.view(R.bits_dtype(dtype))).sum())
    verdict = "identical to the reference" if differ == 0 else f"{differ} elements differ from the reference"
    return f"append_paged_kv_cache {order} {str(dtype)[6:]:>8} H={heads} D={head_size}, {total} tokens: {verdict}"


def main() -> None:
    started = time.monotonic()
    for order, dtype, (heads, head_size) in itertools.product(("NHD", "HND"), (torch.bfloat16, torch.float16), ((2, 128), (3, 64))):
        print(case(order, dtype, heads, head_size), flush=True)
    print(f"{time.monotonic() - started:.0f} s, JIT build of flashinfer's page module included", flush=True)


if __name__ == "__main__":
    main()
