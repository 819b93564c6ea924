"""LMCache 0.5.6's paged-memory connector transfer as kvconform connector backends: ``lmcache:NAME``, ``lmcache_torch:NAME``.

LMCache (github.com/LMCache/LMCache, PyPI ``lmcache``) offloads a vLLM engine's KV cache into
its own memory objects and loads them back. Its in-process vLLM connector
(``VLLMPagedMemGPUConnectorV2``, lmcache/v1/gpu_connector/gpu_connectors.py:148) does it in
three steps, which this adapter repeats with LMCache's own code:

1. **Detection**: the per-layer cache tensors vLLM registers, with vLLM's ``kv_layout`` hint,
   go through ``kv_format.detect_format`` (lmcache/v1/gpu_connector/kv_format/detection.py:50),
   which permutes each tensor to its physical dim order and picks an ``EngineKVFormat`` *from
   the shape* (detectors/vllm.py:107-116: a 5-D tensor whose dim 0 is 2 is kv-first, else one
   whose dim 1 is 2 is blocks-first). Geometry is read back through ``kv_format.get_spec``.
2. **Slot mapping**: the vLLM adapter's ``block_offsets + block_ids · block_size``, flattened and
   cut to the token count (lmcache/integration/vllm/vllm_v1_adapter.py:394-401), int64.
3. **Transfer**: ``multi_layer_kv_transfer(memory_object, layer_pointers, slot_mapping, device,
   num_blocks · block_size, direction, format, block_size, head_size, 0, block_stride)``
   between the paged caches and a ``KV_2LTD`` memory object ``[2, L, T, H·D]`` in the cache
   dtype (gpu_connectors.py:327, :376, :427-430). Block stride 0: these formats are not
   "block-axis" formats (gpu_connector/utils.py:535-547), for which the connector passes 0.

``export_blocks`` is step 3 from the paged caches into a memory object (``D2H``, "paged →
LMCache"); the wire is that memory object, declared as what it is: ``[2, L, T = B·N, H, D]``
(:data:`LMCACHE_WIRE`). ``import_blocks`` scatters a memory object of the wire's first
``num_tokens`` tokens (LMCache keeps a chunk of exactly the tokens it stored) into the blocks
(``H2D``); tokens are addressed by slot, so another block size on the receiving side is
LMCache's ordinary path (``reblock``). ``layout_descriptor`` announces the layout LMCache's
detection read off the tensor, so the descriptor check judges LMCache's detection.

Two kernels, two names per cache layout (NAME: ``NHD``, ``HND`` blocks-first; ``kv_first_NHD``,
``kv_first_HND``):

| name | ``multi_layer_kv_transfer`` | where |
|---|---|---|
| ``lmcache:NAME`` | ``lmcache.cuda_ops`` (csrc/cuda/mem_kernels.cu:929), built from LMCache's sdist | CUDA only |
| ``lmcache_torch:NAME`` | LMCache's torch baseline (lmcache/v1/platform/torch_ops/mem_kernels.py:22), given the layer tensors as LMCache's own tests do ("tensor list mode") | any device |

What LMCache cannot do is not applicable, naming LMCache's code: a head slice (a memory object
holds every KV head of a token: ``scalars_per_token = key_value.size(3)``, mem_kernels.cu:647;
memory objects of other TP ranks are other keys, ``CacheEngineKey.world_size, worker_id``,
lmcache/utils.py:420-421), HND through the torch baseline (torch_ops/mem_kernels.py:50), the
CUDA kernel without ``lmcache.cuda_ops``. A memory object is also keyed by dtype
(``CacheEngineKey.dtype``, utils.py:423): a wire of another dtype is refused, as LMCache's
lookup would miss it.

LMCache is found in ``$KVCONFORM_LMCACHE`` (a directory holding LMCache's ``lmcache/`` package
with its ``lmcache_native`` extension built in place — ``cuda_ops`` too, for the CUDA kernel —
and the pure-Python ``cachetools`` its ``lmcache.utils`` imports), or installed.
``lmcache/__init__.py`` runs; ``lmcache.v1.gpu_connector``'s does not (it builds the connector
classes, importing LMCache's storage and config stack): that package is a bare package object
over LMCache's tree, as is ``lmcache.v1.platform.torch_ops`` (its ``__init__`` imports the
CacheGen kernels, which need numba).
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from kvconform import reference as R
from kvconform.reference import compat

from .contract import Backend, BackendUnavailable, Capabilities, OpUnavailable
from .reference_backend import view_over

LMCACHE_ENV = "KVCONFORM_LMCACHE"
PINNED = "lmcache==0.5.6"  # what docs/REAL_KERNELS.md's verdicts were measured on
LMCACHE = "LMCache 0.5.6"
# LMCache's KV_2LTD memory object [2, L, T, H·D] with T = B·N tokens, block after block.
LMCACHE_WIRE = R.layouts.permuted("WIRE", "lmcache-KV_2LTD", (("2",), ("L",), ("B",), ("N",), ("H",), ("D",)), range(6))
# The kvconform layout each EngineKVFormat LMCache's vLLM detector can pick for a 5-D layer tensor stands for (engine_kv_format.h).
FORMAT_LAYOUTS = {
    "NL_X_NB_TWO_BS_NH_HS": R.blocks_first("NHD"),
    "NL_X_NB_TWO_NH_BS_HS": R.blocks_first("HND"),
    "NL_X_TWO_NB_BS_NH_HS": R.kv_first("NHD"),
    "NL_X_TWO_NB_NH_BS_HS": R.kv_first("HND"),
}
HEAD_SLICE = ("a memory object holds every KV head of its tokens (scalars_per_token = key_value.size(3), csrc/cuda/mem_kernels.cu:647) and "
              "one of another TP rank is another key (CacheEngineKey.world_size, worker_id, lmcache/utils.py:420-421): no head slice")
NOT_LMCACHES = {
    "regions": ("LMCache", "registers no byte regions of blocks: its connector moves tokens through KV_2LTD memory objects"),
    "handshake": ("LMCache", "has no peer handshake: a memory object is found by its CacheEngineKey (model, world size, worker id, "
                             "chunk hash, dtype; lmcache/utils.py:418-423)"),
}


def lmcache_root() -> Path:
    """The directory holding LMCache's ``lmcache`` package: ``$KVCONFORM_LMCACHE``, or the installed one's parent."""
    if os.environ.get(LMCACHE_ENV):
        root = Path(os.environ[LMCACHE_ENV])
        if not (root / "lmcache" / "v1" / "gpu_connector" / "kv_format" / "detection.py").is_file():
            raise BackendUnavailable(f"${LMCACHE_ENV}={root} holds no lmcache/v1/gpu_connector/kv_format/detection.py")
        return root
    spec = importlib.util.find_spec("lmcache")
    if spec is None or not spec.submodule_search_locations:
        raise BackendUnavailable(f"LMCache is not installed: set ${LMCACHE_ENV} to LMCache's source tree with lmcache_native built in place "
                                 f"(tests/test_lmcache_adapter.py builds it from the {PINNED} sdist)")
    return Path(next(iter(spec.submodule_search_locations))).parent


def _bare_package(name: str, path: Path) -> None:
    if name not in sys.modules:
        module = types.ModuleType(name, "kvconform: a bare package object over LMCache's tree (its __init__ is not run)")
        module.__path__ = [str(path)]
        sys.modules[name] = module


@functools.cache
def lmcache() -> types.SimpleNamespace:
    """LMCache's detection and native enums, imported from :func:`lmcache_root`."""
    root = lmcache_root()
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    try:
        package = importlib.import_module("lmcache")
        _bare_package("lmcache.v1.gpu_connector", root / "lmcache" / "v1" / "gpu_connector")
        kv_format = importlib.import_module("lmcache.v1.gpu_connector.kv_format")
        native = importlib.import_module("lmcache.lmcache_native")
        engine_type = importlib.import_module("lmcache.utils").EngineType
    except ImportError as exc:
        raise BackendUnavailable(f"cannot import LMCache's kv_format detection from {root} ({exc})") from exc
    return types.SimpleNamespace(root=root, version=getattr(package, "__version__", "unknown"), kv_format=kv_format, native=native, vllm=engine_type.VLLM)


@functools.cache
def transfer_function(kernel: str):
    """LMCache's ``multi_layer_kv_transfer``: the CUDA op, or the torch baseline; OpUnavailable says why not."""
    lmc = lmcache()
    if kernel == "cuda":
        try:
            return importlib.import_module("lmcache.cuda_ops").multi_layer_kv_transfer
        except ImportError as exc:
            raise OpUnavailable(f"lmcache.cuda_ops does not import from {lmc.root} ({exc}); it is built from LMCache's sdist on a CUDA machine "
                                f"(tests/real_kernels_gpu/lmcache_build.sh)", who="this machine's LMCache build") from exc
    _bare_package("lmcache.v1.platform.torch_ops", lmc.root / "lmcache" / "v1" / "platform" / "torch_ops")
    return importlib.import_module("lmcache.v1.platform.torch_ops.mem_kernels").multi_layer_kv_transfer


class LMCacheConnector(Backend):
    """LMCache's detection, slot mapping and ``multi_layer_kv_transfer`` on one vLLM cache layout."""

    layout: R.Layout
    kernel: str = "cuda"  # or "torch"

    def __init__(self):
        self._lmc = lmcache()
        self.platform = "cuda" if torch.cuda.is_available() and self.kernel == "cuda" else "cpu"
        self.device = self.platform
        self._capabilities = Capabilities(
            layouts=(self.layout,), ops=frozenset({"wire", "reblock"}), dtypes=(torch.bfloat16, torch.float16),
            kv_cache_dtypes=("auto", *R.fp8.KV_CACHE_DTYPES), head_sizes=(64, 128), block_sizes=(16, 32), num_kv_heads=(1, 2, 3),
        )

    @property
    def capabilities(self):
        return self._capabilities

    def versions(self):
        kernel = {"cuda": "lmcache.cuda_ops.multi_layer_kv_transfer (csrc/cuda/mem_kernels.cu)",
                  "torch": "lmcache.v1.platform.torch_ops.mem_kernels.multi_layer_kv_transfer"}[self.kernel]
        return {"torch": torch.__version__, "lmcache": self._lmc.version, "lmcache_kernel": kernel}

    def undeclared_op(self, op):
        return NOT_LMCACHES.get(op, ("kvconform's LMCache adapter", f"drives only LMCache's connector transfer, not '{op}' (LMCache has no cache kernels of its own)"))

    def allocate(self, buffer, spec):
        return view_over(buffer, spec)  # vLLM's logical shape with the layout's strides: what vLLM registers with LMCache

    # ------------------------------------------------------------------ LMCache's steps
    def discover(self, cache):
        """``(EngineKVFormat, normalized layer tensors)``: LMCache's detection of the per-layer
        list vLLM registers (one layer per allocation here), with vLLM's ``kv_layout`` hint."""
        return self._lmc.kv_format.detect_format([cache], self._lmc.vllm, {"kv_layout": self.layout.alias})

    def _transfer(self, cache, block_ids, memory_object, direction: str, num_tokens: int) -> None:
        run = transfer_function(self.kernel)
        fmt, layers = self.discover(cache)
        geometry = self._lmc.kv_format.get_spec(layers, fmt)
        block_size = geometry.block_size()
        ids = torch.as_tensor(list(block_ids), dtype=torch.long)
        slots = (torch.arange(block_size, dtype=torch.long)[None, :] + ids[:, None] * block_size).flatten()[:num_tokens]
        args = (geometry.num_blocks() * block_size, getattr(self._lmc.native.TransferDirection, direction), fmt)
        if self.kernel == "cuda":
            pointers = torch.tensor([t.data_ptr() for t in layers], dtype=torch.int64).to(cache.device)
            run(memory_object, pointers, slots.to(cache.device), cache.device, args[0], int(args[1]), int(args[2]),
                block_size, geometry.head_size(), 0, 0)
            torch.cuda.synchronize(cache.device)
            return
        try:
            run(memory_object, [_rows(t, geometry.is_two_major) for t in layers], slots, cache.device, *args, block_size, geometry.head_size(), 0, 0)
        except NotImplementedError as exc:  # HND (torch_ops/mem_kernels.py:50); a torch op without an fp8 kernel on this device
            raise OpUnavailable(f"LMCache's torch baseline multi_layer_kv_transfer ({_lmcache_frame(exc)}): {exc}", who=LMCACHE) from exc

    # ------------------------------------------------------------------ connector ops
    def wire_layout(self, spec):
        return LMCACHE_WIRE

    def export_blocks(self, cache, spec, block_ids, heads=None):
        g = spec.geometry
        _whole(g, heads)
        wg = R.connector.wire_geometry(g, len(block_ids))
        memory_object = torch.zeros((2, g.num_layers, len(block_ids) * g.block_size, g.num_kv_heads * g.head_size), dtype=g.dtype, device=cache.device)
        self._transfer(cache, block_ids, memory_object, "D2H", memory_object.shape[2])
        return R.connector.Wire(memory_object.view(torch.uint8).flatten(), LMCACHE_WIRE, wg)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        g, wg = spec.geometry, wire.geometry
        _whole(g, heads)
        if wg.dtype != g.dtype:
            raise ValueError(f"LMCache keys a memory object by dtype (CacheEngineKey.dtype, lmcache/utils.py:423): one stored from a {wg.dtype} cache "
                             f"is not found for a {g.dtype} cache")
        if (wg.num_layers, wg.num_kv_heads, wg.head_size) != (g.num_layers, g.num_kv_heads, g.head_size):
            raise ValueError(f"a memory object of {wg.short()} does not fit a cache of {g.short()}")
        data = wire.data if wire.layout == LMCACHE_WIRE else R.connector.export_blocks(wire.data, wire.layout, wg, range(wg.num_blocks), None, LMCACHE_WIRE).data
        tokens = wire.num_tokens if num_tokens is None else num_tokens
        memory_object = data.view(g.dtype).view(2, g.num_layers, wire.num_tokens, g.num_kv_heads * g.head_size)[:, :, :tokens].contiguous()
        self._transfer(cache, block_ids, memory_object.to(cache.device), "H2D", tokens)

    def layout_descriptor(self, cache, spec, *, tp_rank=0, tp_size=1, total_kv_heads=None, k_scale=None, v_scale=None):
        """The layout LMCache's detection reads off the tensor, with the geometry its format spec reads back."""
        fmt, layers = self.discover(cache)
        if fmt.name not in FORMAT_LAYOUTS:
            raise ValueError(f"LMCache detected {fmt.name} for a {spec.layout} cache of shape {tuple(cache.shape)}: no 5-D vLLM layout")
        read = self._lmc.kv_format.get_spec(layers, fmt)
        g = R.Geometry(num_blocks=read.num_blocks(), block_size=read.block_size(), num_kv_heads=read.num_heads(), head_size=read.head_size(),
                       dtype=read.dtype(), num_layers=read.num_layers())
        return compat.describe(FORMAT_LAYOUTS[fmt.name], g, tp_rank=tp_rank, tp_size=tp_size, total_kv_heads=total_kv_heads, kv_cache_dtype=spec.kv_cache_dtype,
                               k_scale=k_scale, v_scale=v_scale, backend=self.name, platform=self.platform, arch=self.arch(), lmcache_format=fmt.name)


def _whole(g: R.Geometry, heads) -> None:
    if heads is not None and list(heads) != list(range(g.num_kv_heads)):
        raise OpUnavailable(HEAD_SLICE, who=LMCACHE)


def _lmcache_frame(exc: BaseException) -> str:
    """``path:line`` of the innermost frame of LMCache's tree the exception passed through."""
    where, tb = "LMCache", exc.__traceback__
    while tb is not None:
        path = tb.tb_frame.f_code.co_filename
        if "/lmcache/" in path:
            where = f"{path[path.rindex('/lmcache/') + 1:]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return where


def _rows(layer: torch.Tensor, two_major: bool) -> torch.Tensor:
    """A normalized (dense) layer tensor as the torch baseline's tensor-list mode takes it: one row
    of H·D per slot — ``[2, B·N, H·D]`` kv-first, ``[B, 2, N, H·D]`` blocks-first (torch_ops/mem_kernels.py:94-102)."""
    rows = layer.flatten(-2)
    return rows.flatten(1, 2) if two_major else rows


def _backend(name: str, layout: R.Layout, kernel: str) -> type:
    return type(name, (LMCacheConnector,), {"layout": layout, "kernel": kernel, "__doc__": f"LMCache's {kernel} transfer on {layout}."})


LMCacheNHD = _backend("LMCacheNHD", R.blocks_first("NHD"), "cuda")
LMCacheHND = _backend("LMCacheHND", R.blocks_first("HND"), "cuda")
LMCacheKvFirstNHD = _backend("LMCacheKvFirstNHD", R.kv_first("NHD"), "cuda")
LMCacheKvFirstHND = _backend("LMCacheKvFirstHND", R.kv_first("HND"), "cuda")
LMCacheTorchNHD = _backend("LMCacheTorchNHD", R.blocks_first("NHD"), "torch")
LMCacheTorchHND = _backend("LMCacheTorchHND", R.blocks_first("HND"), "torch")
LMCacheTorchKvFirstNHD = _backend("LMCacheTorchKvFirstNHD", R.kv_first("NHD"), "torch")
LMCacheTorchKvFirstHND = _backend("LMCacheTorchKvFirstHND", R.kv_first("HND"), "torch")
