"""FlashInfer's own paged-KV code as a kvconform backend: ``--backend flashinfer:nhd`` / ``flashinfer:hnd``.

FlashInfer (github.com/flashinfer-ai/flashinfer, PyPI ``flashinfer-python``; verdicts measured on
0.7.2.post1) keeps a paged cache as one tensor ``[pages, 2, N, H, D]`` (``kv_layout="NHD"``) or
``[pages, 2, H, N, D]`` (``"HND"``), ``[:, 0]`` K and ``[:, 1]`` V (flashinfer/page.py:604-617):
kvconform's E1 blocks-first layout in either order. The adapter drives two of FlashInfer's ops on
it, both JIT-compiled with nvcc from the wheel's sources on first use:

- ``write`` — ``flashinfer.append_paged_kv_cache`` (csrc/page.cu:25-114, kernel
  ``AppendPagedKVCacheKernel``, include/flashinfer/page.cuh:398-424);
- ``decode`` — ``flashinfer.BatchDecodeWithPagedKVCacheWrapper`` with ``use_tensor_cores=False``,
  ``backend="fa2"``: FlashInfer's CUDA-core paged decode kernel (decode.py:2440-2466,
  csrc/batch_decode.cu). vLLM 0.33.0's FLASHINFER backend plans its decode wrapper with
  ``use_tensor_cores=True`` (vllm/v1/attention/backends/flashinfer.py:1497), which runs FlashInfer's
  batch *prefill* kernels instead; those are not driven here (their JIT build is several times
  the decode module's, beyond the GPU time this adapter was measured with).

vLLM keeps an HND cache as the logical ``[B, 2, N, H, D]`` with permuted strides and hands
FlashInfer ``kv_cache.permute(*stride_order)`` (flashinfer.py:2316-2317); so does the adapter:
:meth:`allocate` returns the logical view, :func:`kernel_cache` FlashInfer's physical order.

**Slot mappings.** FlashInfer appends by (request, position) over page tables; it has no slot
mapping. :func:`append_arguments` translates a mapping into the page tables of one request whose
block table is the distinct blocks the mapping touches, ascending, with token ``t`` at position
``page(t)·N + slot % N`` — the request for which vLLM's own rule ``slot = block_table[pos // N]·N
+ pos % N`` gives exactly this mapping. A ``-1`` (padding) slot has no such form: the kernel writes
every one of its ``nnz = append_key.size(0)`` rows (page.cu:48) at ``kv_indices[kv_indptr[b] +
pos // N]``, row ``pos % N`` (page.cuh:417-423), with no skip and no bounds check. So the backend
declares no padding slot (``Capabilities.padding_slots``): the padding check is not applicable and
the other checks send their mappings without ``-1`` (conformance/harness/ops.py
``declared_slots``). Dropping such rows here would make a padding check check the adapter, so a
mapping with ``-1`` that reaches it anyway raises ``OpUnavailable(this_input=True)``.
The index tensors keep the mapping's dtype: FlashInfer's own wrapper converts them to the
int32 its kernel reads (``.int()``, page.py:153-157; page.cu:95-106), so an int64 mapping takes
that path of FlashInfer's, as an engine holding int64 positions would.

Declared from FlashInfer's code, not from what passes: head sizes 64 and 128 of the
``DISPATCH_HEAD_DIM`` set {64, 128, 256, 512} (include/flashinfer/utils.cuh:200-227; each decode
head size is one more JIT module per dtype, so the larger two are left out); any page size
(``uint_fastdiv page_size``, page.cuh:39), declared 16, 32 and a non-power-of-two 48; bf16 and
fp16. Only ``kv_cache_dtype="auto"``: the append casts ``append_key``'s pointer to the *cache's*
element type and copies (page.cu:94-106, page.cuh:420-423) — it neither quantises nor applies a
scale, and nothing checks that the key's dtype is the cache's. Query heads per KV head: the decode
kernel dispatches 1, 2, 3, 4, 6, 8, 16 (utils.cuh:142-168), the read checks use 1 and 2.

FlashInfer runs on CUDA only: on a machine without a CUDA GPU, or without FlashInfer importable,
every check is not applicable with the reason (``BackendUnavailable``).
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from .contract import BackendUnavailable, Capabilities, OpUnavailable
from .kernel_library import KernelLibrary
from .triton_backends import device_arch

PINNED = "flashinfer-python==0.7.2.post1"  # what docs/REAL_KERNELS.md's verdicts were measured on
DECODE_WORKSPACE_BYTES = 32 << 20  # FlashInfer's split-k scratch; the read checks' batches need far less
NO_PADDING_SLOT = ("a slot mapping with -1 (padding): FlashInfer appends every row of append_key at its (request, position) "
                   "(csrc/page.cu:48, include/flashinfer/page.cuh:417-423) and has no padding slot to translate it to")
NOT_FLASHINFERS = {
    "split": "has no split op of its own: the cache's [:, 0] / [:, 1] are K and V (flashinfer/page.py:616)",
    "swap": "has no swap op of its own (the engine moves blocks)",
    "copy": "has no copy-blocks op of its own (the engine copies blocks)",
}


@dataclasses.dataclass(frozen=True)
class PageTables:
    """FlashInfer's page-table arguments (its kernels read int32: page.cu:95-106, the decode plan)."""

    kv_indptr: torch.Tensor  # [batch + 1]: request b's pages are kv_indices[kv_indptr[b]:kv_indptr[b + 1]]
    kv_indices: torch.Tensor  # [kv_indptr[-1]]: page (block) ids
    kv_last_page_len: torch.Tensor  # [batch]: tokens in each request's last page, 1 … N


def append_arguments(slot_mapping: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor, PageTables]:
    """``(batch_indices, positions, tables)`` for ``append_paged_kv_cache``: one request whose pages
    are the distinct blocks of ``slot_mapping`` in ascending order; token ``t`` at position
    ``page(t)·N + slot % N``. The request covers its pages whole (last page length N), so every
    position lies inside it, as page.py:687-689 asks. All in the mapping's dtype (int32 or int64)."""
    if bool((slot_mapping < 0).any()):
        raise OpUnavailable(NO_PADDING_SLOT, who="FlashInfer's append_paged_kv_cache", this_input=True)
    pages, page_of_token = torch.unique(slot_mapping // block_size, return_inverse=True)
    positions = (page_of_token * block_size + slot_mapping % block_size).to(slot_mapping.dtype)
    index = dict(dtype=slot_mapping.dtype, device=slot_mapping.device)
    tables = PageTables(kv_indptr=torch.tensor([0, len(pages)], **index), kv_indices=pages, kv_last_page_len=torch.tensor([block_size], **index))
    return torch.zeros_like(positions), positions, tables


def decode_tables(block_table: torch.Tensor, seq_lens: torch.Tensor, block_size: int) -> PageTables:
    """The page tables vLLM's FLASHINFER backend builds from a block table
    (``_compute_flashinfer_kv_metadata``, vllm/v1/attention/backends/flashinfer.py:1511-1550):
    ``ceil(len / N)`` pages per sequence, its block-table row's first ones, last page ``len % N``
    (``N`` when that is 0)."""
    pages = (seq_lens + block_size - 1) // block_size
    indptr = torch.zeros(len(seq_lens) + 1, dtype=torch.int32, device=seq_lens.device)
    indptr[1:] = torch.cumsum(pages, 0)
    indices = torch.cat([block_table[s, :n] for s, n in enumerate(pages.tolist())])
    last = seq_lens % block_size
    last = torch.where((last == 0) & (seq_lens != 0), torch.full_like(last, block_size), last)
    return PageTables(kv_indptr=indptr, kv_indices=indices.to(torch.int32), kv_last_page_len=last.to(torch.int32))


def kernel_cache(cache: torch.Tensor, order: str) -> torch.Tensor:
    """The tensor FlashInfer gets: the logical ``[B, 2, N, H, D]`` view in FlashInfer's physical
    order (HND: ``[B, 2, H, N, D]``), as vLLM's ``kv_cache.permute(*stride_order)``."""
    return cache if order == "NHD" else cache.permute(0, 1, 3, 2, 4)


def load_flashinfer():
    """The ``flashinfer`` package, on a machine where it can run."""
    if not torch.cuda.is_available() or torch.version.hip:
        raise BackendUnavailable("FlashInfer's paged-KV append and decode are CUDA kernels JIT-compiled with nvcc "
                                 "(flashinfer/data/csrc/page.cu, batch_decode.cu): this machine has no CUDA GPU")
    try:
        import flashinfer
    except ImportError as exc:
        raise BackendUnavailable(f"FlashInfer is not importable ({exc}): install {PINNED}, or put its Python tree on "
                                 "PYTHONPATH (tests/real_kernels_gpu/run.sh)") from exc
    return flashinfer


class FlashInferBackend(KernelLibrary):
    """``append_paged_kv_cache`` and the CUDA-core paged decode on one E1 order (``NHD``/``HND``).
    ``flashinfer``: the package (default: the installed one); CPU tests pass a stand-in."""

    order: str
    platform = "cuda"
    device = "cuda"

    def __init__(self, flashinfer=None):
        self._fi = flashinfer or load_flashinfer()
        self._version = getattr(self._fi, "__version__", "unknown")
        self._workspaces: dict[torch.device, torch.Tensor] = {}
        self._capabilities = Capabilities(
            layouts=(R.blocks_first(self.order),), ops=frozenset({"write", "decode"}), dtypes=(torch.bfloat16, torch.float16),
            kv_cache_dtypes=("auto",), head_sizes=(64, 128), block_sizes=(16, 32, 48), num_kv_heads=(1, 2, 3),
            padding_slots=False,
        )

    @property
    def capabilities(self):
        return self._capabilities

    def versions(self):
        return {"torch": torch.__version__, "cuda": torch.version.cuda or "", "flashinfer": self._version, "kv_layout": self.order,
                "flashinfer_write": "flashinfer.append_paged_kv_cache",
                "flashinfer_decode": "flashinfer.BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=False, backend='fa2')"}

    def arch(self):
        return device_arch(self.platform)

    def undeclared_op(self, op):
        return self.library, NOT_FLASHINFERS.get(op, f"has no {op} op of its own (a kernel library)")

    @property
    def library(self):
        return f"FlashInfer {self._version}"

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        batch_indices, positions, tables = append_arguments(slot_mapping, spec.geometry.block_size)
        rows = len(slot_mapping)  # FlashInfer appends every row it is given (nnz = append_key.size(0), page.cu:48)
        self._fi.append_paged_kv_cache(key[:rows], value[:rows], batch_indices, positions, kernel_cache(cache, self.order),
                                       tables.kv_indices, tables.kv_indptr, tables.kv_last_page_len, kv_layout=self.order)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        g = spec.geometry
        tables = decode_tables(block_table, seq_lens, g.block_size)
        wrapper = self._fi.BatchDecodeWithPagedKVCacheWrapper(self._workspace(query.device), self.order, use_tensor_cores=False, backend="fa2")
        wrapper.plan(tables.kv_indptr, tables.kv_indices, tables.kv_last_page_len, query.shape[1], g.num_kv_heads, g.head_size, g.block_size,
                     q_data_type=query.dtype, kv_data_type=cache.dtype, sm_scale=scale)
        return wrapper.run(query, kernel_cache(cache, self.order))

    def _workspace(self, device) -> torch.Tensor:
        """One zeroed float workspace per device, shared by every plan (FlashInfer asks for zeros at first use)."""
        if device not in self._workspaces:
            self._workspaces[device] = torch.zeros(DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        return self._workspaces[device]


class FlashInferNHD(FlashInferBackend):
    order = "NHD"


class FlashInferHND(FlashInferBackend):
    order = "HND"
