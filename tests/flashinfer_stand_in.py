"""A CPU STAND-IN for FlashInfer's paged-KV append and decode, for the adapter's own tests only.

FlashInfer runs on CUDA alone, so on the CPU the adapter (backends_under_test/flashinfer_backend.py)
is driven through this stand-in, written from FlashInfer 0.7.2.post1's code: what passes here says
the adapter's translation is right, never that FlashInfer is (the H200 run says that).

- ``append_paged_kv_cache``: csrc/page.cu:25-114 and ``AppendPagedKVCacheKernel``
  (include/flashinfer/page.cuh:398-424): every row ``i`` of ``append_key`` goes to page
  ``kv_indices[page_iter]``, row ``entry``, where ``(page_iter, entry) = divmod(kv_indptr[b]·N +
  positions[i], N)`` and ``b = batch_indices[i]``; the index tensors are converted to int32 first (page.py:153-157).
- ``BatchDecodeWithPagedKVCacheWrapper``: request ``b`` attends to the first
  ``(pages − 1)·N + kv_last_page_len[b]`` tokens of its pages ``kv_indices[kv_indptr[b]:kv_indptr[b + 1]]``
  (``paged_kv_t::get_length``, page.cuh:185-190), softmax in fp32.
"""

from __future__ import annotations

import torch

from kvconform.backends_under_test.flashinfer_backend import FlashInferHND, FlashInferNHD

INT32 = "the decode plan takes int32 page tables (flashinfer/decode.py:1851-1856)"


def physical_planes(paged_kv_cache: torch.Tensor, kv_layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V as ``[pages, N, H, D]`` whatever the kv_layout (HND's planes are ``[pages, H, N, D]``)."""
    k, v = paged_kv_cache.unbind(1)
    return (k, v) if kv_layout == "NHD" else (k.transpose(1, 2), v.transpose(1, 2))


def tokens_of(kv_indptr, kv_indices, kv_last_page_len, b: int, block_size: int) -> tuple[torch.Tensor, int]:
    """Request ``b``'s pages and its length."""
    pages = kv_indices[int(kv_indptr[b]):int(kv_indptr[b + 1])]
    return pages, (len(pages) - 1) * block_size + int(kv_last_page_len[b])


class StandIn:
    __version__ = "CPU stand-in"

    @staticmethod
    def append_paged_kv_cache(append_key, append_value, batch_indices, positions, paged_kv_cache, kv_indices, kv_indptr, kv_last_page_len, kv_layout):
        # FlashInfer's wrapper converts the index tensors to the int32 its kernel reads (page.py:153-157).
        batch_indices, positions, kv_indices, kv_indptr = (t.int() for t in (batch_indices, positions, kv_indices, kv_indptr))
        assert len(batch_indices) == len(positions) == append_key.shape[0]  # page.cu:48-52: nnz is append_key's row count
        k, v = physical_planes(paged_kv_cache, kv_layout)
        N = k.shape[1]
        for i in range(append_key.shape[0]):
            page_iter, entry = divmod(int(kv_indptr[batch_indices[i]]) * N + int(positions[i]), N)
            page = int(kv_indices[page_iter])
            k[page, entry] = append_key[i]
            v[page, entry] = append_value[i]

    class BatchDecodeWithPagedKVCacheWrapper:
        def __init__(self, float_workspace_buffer, kv_layout, use_tensor_cores, backend):
            self.kv_layout = kv_layout

        def plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size, *, q_data_type, kv_data_type, sm_scale):
            assert all(t.dtype == torch.int32 for t in (indptr, indices, last_page_len)), INT32
            self.tables, self.page_size, self.sm_scale = (indptr, indices, last_page_len), page_size, sm_scale

        def run(self, q, paged_kv_cache):
            k_planes, v_planes = physical_planes(paged_kv_cache, self.kv_layout)
            out = torch.empty_like(q)
            for b in range(q.shape[0]):
                pages, length = tokens_of(*self.tables, b, self.page_size)
                k, v = (planes[pages.long()].flatten(0, 1)[:length].float() for planes in (k_planes, v_planes))  # [T, H, D]
                group = q.shape[1] // k.shape[1]
                scores = torch.einsum("hd,thd->ht", q[b].float(), k.repeat_interleave(group, 1)) * self.sm_scale
                out[b] = torch.einsum("ht,thd->hd", scores.softmax(-1), v.repeat_interleave(group, 1)).to(q.dtype)
            return out


class StandInOnCpu:
    """The adapter on the CPU with the stand-in in FlashInfer's place (for ``--kvc-backend``)."""

    platform = "cpu"
    device = "cpu"

    def __init__(self):
        super().__init__(flashinfer=StandIn)


class NHD(StandInOnCpu, FlashInferNHD):
    pass


class HND(StandInOnCpu, FlashInferHND):
    pass
