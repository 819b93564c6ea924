"""The backend contract: what a vendor implements so kvconform can check a backend.

A backend is a small adapter (ONNX ``Backend``-sized). It *declares* — identity,
capabilities, the layouts it produces as reference descriptors — and it *does* — allocate
its cache over a buffer the suite provides, split it, and run its own cache kernels exactly
as the real backend calls them. The suite decides everything else from the reference.

Every op receives the :class:`CacheSpec` the cache was allocated with; a real backend may
ignore it (its kernels read shapes and strides from the tensors).
"""

from __future__ import annotations

import abc
import dataclasses

import torch

from kvconform.reference import compat
from kvconform.reference import Geometry, Layout, fp8
from kvconform.reference import connector as conn

from .latent_contract import LATENT_OPS, LatentCapabilities, LatentSpec
from .quant_contract import QuantCapabilities

# What a connector-facing backend may declare besides (docs/CONNECTOR.md): byte regions of
# blocks and head slices, a wire form (export + import), import across block sizes, and its
# own handshake verdict on a peer.
CONNECTOR_OPS = frozenset({"regions", "wire", "reblock", "handshake"})
OPS = frozenset({"write", "split", "swap", "copy", "decode"}) | CONNECTOR_OPS | LATENT_OPS
STANDARDS = frozenset({"e1", "e3"})
CONNECTOR_NOT_SUPPORTED = "KV connector not supported"


class BackendUnavailable(Exception):
    """Raised while constructing a backend whose library is absent here (e.g. vLLM not
    installed): every check of it is *not applicable* with this message, never a failure."""


class BackendOutOfScope(BackendUnavailable):
    """Raised while constructing a backend that exists here but keeps no cache kvconform
    specifies (vLLM's MLA backends: one latent cache, no K/V planes): every check of it is *not
    applicable* as a fact of the backend (kind ``declaration``), never a failure."""


class OpUnavailable(Exception):
    """Raised by an op whose real code path needs something this machine lacks (a compiled
    extension, a GPU-only kernel): that check is *not applicable* with this message.

    ``who`` names what lacks it when that is not simply "this machine" (e.g. "this machine's
    vLLM build", or the library's own code rejecting this device). ``this_input``: only these
    arguments cannot run (a slot mapping with padding, where the library has no padding slot),
    not every case of the cache spec: a generated check's later examples of the same spec still
    run (conformance/harness/examples.py)."""

    def __init__(self, message: str, who: str | None = None, *, this_input: bool = False):
        super().__init__(message)
        self.who = who
        self.this_input = this_input


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a backend supports; the suite generates cases only inside these sets."""

    layouts: tuple[Layout, ...]
    ops: frozenset[str]
    standards: frozenset[str] = frozenset()
    dtypes: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16)
    kv_cache_dtypes: tuple[str, ...] = ("auto",)
    head_sizes: tuple[int, ...] = (64, 128)
    block_sizes: tuple[int, ...] = (16,)
    num_kv_heads: tuple[int, ...] = (1, 2, 3)
    scale_types: tuple[str, ...] = ("tensor",)  # "tensor" and/or "head" (per-KV-head [H])
    num_layers: tuple[int, ...] = (1,)  # layers per allocation the ops accept (layouts with a layer dim)
    # The writer skips slot -1 (vLLM's padding token, SPEC WRITE-PAD-1). False for a library that
    # appends every row it is given (FlashInfer): the suite then sends no -1 at all.
    padding_slots: bool = True
    latent: LatentCapabilities | None = None  # latent caches (MLA, fp8_ds_mla, indexer; latent_contract.py)
    quant: QuantCapabilities | None = None  # per-token-head quantised caches (quant_contract.py, SPEC §16)

    def __post_init__(self):
        unknown = set(self.ops) - OPS
        if unknown:
            raise ValueError(f"Capabilities.ops: unknown ops {sorted(unknown)}; expected a subset of {sorted(OPS)}")
        unknown = set(self.standards) - STANDARDS
        if unknown:
            raise ValueError(f"Capabilities.standards: unknown {sorted(unknown)}; expected a subset of {sorted(STANDARDS)}")
        if not self.layouts and self.latent is None and self.quant is None:
            raise ValueError("Capabilities.layouts: declare at least one layout (or latent caches only: latent=LatentCapabilities(...))")
        if set(self.scale_types) - {"tensor", "head"}:
            raise ValueError(f"Capabilities.scale_types: expected 'tensor'/'head', got {self.scale_types}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class CacheSpec:
    """One cache: its reference layout, geometry (cache dtype included) and dtype strings."""

    layout: Layout
    geometry: Geometry
    kv_cache_dtype: str = "auto"
    model_dtype: torch.dtype = torch.bfloat16
    layer: int = 0  # the layer of a multi-layer allocation that per-layer ops (write, split, decode) act on


# The backend's declarations: fixed for its life, asked thousands of times a run. The suite asks
# each question (the same arguments) once and keeps a hashable answer (conformance/harness/oracle_guard.py).
DECLARATIONS = ("arch", "cache_dtype", "path_block_sizes")


class Backend(abc.ABC):
    """Implement the abstract members (about 50 lines for a real backend).

    Optional ops raise ``NotImplementedError`` unless listed in ``capabilities.ops``.
    """

    name: str
    platform: str = "cpu"  # "cuda" | "rocm" | "cpu"
    device: str = "cpu"
    default_timeout: float | None = None  # seconds per test when the run gives no --kvc-timeout

    def __repr__(self) -> str:  # stable across runs (results must not differ by object address)
        return f"<backend {getattr(self, 'name', type(self).__name__)}>"

    @property
    @abc.abstractmethod
    def capabilities(self) -> Capabilities: ...

    def versions(self) -> dict[str, str]:
        """Versions worth recording with every result (library, kernels, driver)."""
        return {"torch": torch.__version__}

    def arch(self) -> str:
        """Device architecture, e.g. ``sm90``, ``gfx942``; empty on CPU."""
        return ""

    def cache_dtype(self, kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
        """Storage dtype for ``kv_cache_dtype`` on this platform (fnuz only on gfx94x)."""
        return fp8.cache_dtype_for(kv_cache_dtype, model_dtype, self.platform, self.arch())

    # ---------------------------------------------------------------- cache ops
    # Every tensor argument lives on the backend's device unless said otherwise; "model dtype" is
    # ``spec.model_dtype``, "cache dtype" ``spec.geometry.dtype``; T tokens, H KV heads, D head
    # size, N block size (docs/VENDOR_CI.md, "The adapter's arguments", has the same as a table).
    @abc.abstractmethod
    def allocate(self, buffer: torch.Tensor, spec: CacheSpec) -> torch.Tensor:
        """Build the cache tensor the backend's kernels receive, as a view of ``buffer``.

        ``buffer``: uint8, 1-D, ``spec.layout.nbytes(spec.geometry)`` bytes, on the device
        (host memory for swap targets: pinned where a GPU is present); guard bytes surround it.
        Return a view of it in the cache dtype, in the backend's own shape and strides.
        """

    def split(self, cache: torch.Tensor, spec: CacheSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """The K and V tensors the kernels receive, views of ``cache`` (E1: ``cache.unbind(1)``)."""
        raise NotImplementedError

    def write(self, cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, spec: CacheSpec, *,
              k_scale: torch.Tensor, v_scale: torch.Tensor) -> None:
        """``reshape_and_cache``: token ``t`` of ``key``/``value`` into slot ``slot_mapping[t]``.

        - ``key``, ``value``: ``[T, H, D]`` in the model dtype, T ≥ ``len(slot_mapping)`` (rows
          past it are not written); not necessarily contiguous: rows of one ``qkv`` tensor (row
          stride ``3·H·D``), a size-1 head dim with stride 1.
        - ``slot_mapping``: int32 or int64 ``[T']``; slot ``b·N + s`` is block ``b``, row ``s``;
          ``-1`` is padding (write nothing).
        - ``k_scale``, ``v_scale``: float32 of shape ``[1]`` (per tensor) or ``[H]`` (per KV head,
          when ``capabilities.scale_types`` has ``"head"``); an fp8 cache stores ``x / scale``,
          an ``auto`` cache ignores them.
        """
        raise NotImplementedError

    def swap_out(self, cache: torch.Tensor, host_cache: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor, spec: CacheSpec) -> None:
        """``swap_out_blocks_to_host``: ``host[dst_ids] = cache[src_ids]`` (whole blocks, every layer).

        ``host_cache``: the same layout in host memory (pinned where a GPU is present);
        ``src_ids``: int64 ``[M]`` on the device; ``dst_ids``: int64 ``[M]`` on the host.
        """
        raise NotImplementedError

    def swap_in(self, host_cache: torch.Tensor, cache: torch.Tensor, src_ids: torch.Tensor, dst_ids: torch.Tensor, spec: CacheSpec) -> None:
        """``insert_blocks_to_device``: ``cache[dst_ids] = host[src_ids]`` (whole blocks, every layer).

        ``src_ids``: int64 ``[M]`` on the host; ``dst_ids``: int64 ``[M]`` on the device.
        """
        raise NotImplementedError

    def copy_blocks(self, cache: torch.Tensor, block_mapping: torch.Tensor, spec: CacheSpec) -> None:
        """``copy_blocks``: every ``[src, dst]`` row of ``block_mapping`` (int64 ``[M, 2]``)
        copies a whole block (both planes, every layer) within ``cache``."""
        raise NotImplementedError

    def decode(self, cache: torch.Tensor, query: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, spec: CacheSpec, *,
               scale: float, k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
        """Paged decode attention over the cache, layer ``spec.layer``: ``query [S, Hq, D]`` → ``[S, Hq, D]``.

        - ``query``: ``[S, Hq, D]`` in the model dtype, one token per sequence; Hq = G·H, and
          query heads ``h·G … h·G + G − 1`` read KV head ``h``.
        - ``block_table``: int64 ``[S, max_blocks]``, the blocks of each sequence in order;
          ``seq_lens``: int64 ``[S]``, tokens in each sequence.
        - ``scale``: the softmax scale (a Python float, ``D ** -0.5``); ``k_scale``, ``v_scale``:
          float32 ``[1]`` or ``[H]``, as for :meth:`write`.
        """
        raise NotImplementedError

    # ---------------------------------------------------------------- latent ops (SPEC §17; latent_contract.py)
    # T tokens; R kv_lora_rank, P rope_dim (``spec.fmt``); slot ``b·N + s`` as for :meth:`write`, -1 padding.
    def latent_allocate(self, buffer: torch.Tensor, spec: LatentSpec) -> torch.Tensor:
        """The latent cache over ``buffer`` (uint8, 1-D, ``spec.geometry.nbytes()`` bytes): a view in
        ``spec.fmt.storage_dtype()`` with the backend's shape (``spec.geometry.shape()``: one record per row)."""
        raise NotImplementedError

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec: LatentSpec, *, scale) -> None:
        """``concat_and_cache_mla`` (``fp8_ds_mla``: ``concat_and_cache_ds_mla``) into layer ``spec.layer``:
        ``kv_c [T, R]``, ``k_pe [T, P]`` in the model dtype, rows through their strides; ``scale``
        float32 ``[1]`` (a plain fp8 cache stores ``x / scale``; ignored otherwise)."""
        raise NotImplementedError

    def latent_grouped_write(self, per_layer_cache, kv_cs, k_pes, slot_mappings, specs, *, scales) -> None:
        """``concat_and_cache_mla_grouped``: layer ``l`` writes ``kv_cs[l]``, ``k_pes[l]`` at
        ``slot_mappings[l]`` into ``per_layer_cache[l]`` (each layer's own cache tensor, ``specs[l]``);
        ``scales``: float32 ``[L]`` for an fp8 cache, None otherwise."""
        raise NotImplementedError

    def indexer_write(self, cache, k, slot_mapping, spec: LatentSpec) -> None:
        """``indexer_k_quant_and_cache``: ``k [T, D]`` in the model dtype, quantised per token with the
        format's scale policy, values region then scales region per block."""
        raise NotImplementedError

    def latent_gather(self, cache, block_table, seq_lens, spec: LatentSpec, *, scale) -> torch.Tensor:
        """The sequences' records, dequantised: ``[sum(seq_lens), R + P]`` in the model dtype."""
        raise NotImplementedError

    def indexer_gather(self, cache, block_table, seq_lens, spec: LatentSpec) -> tuple[torch.Tensor, torch.Tensor]:
        """``cp_gather_indexer_k_quant_cache``: (value bytes ``[T, D]``, scale bytes ``[T, 4 or D/32]``), uint8."""
        raise NotImplementedError

    def latent_decode(self, query, cache, block_table, seq_lens, spec: LatentSpec, *, scale, softmax_scale: float) -> torch.Tensor:
        """MLA decode: ``query [S, Hq, R + P]`` → ``[S, Hq, R]``; K is the whole latent, V its first R values."""
        raise NotImplementedError

    def latent_copy(self, cache, block_mapping, spec: LatentSpec) -> None:
        """Every ``[src, dst]`` row of ``block_mapping`` (int64 ``[M, 2]``) copies a whole block, every layer."""
        raise NotImplementedError

    def latent_swap(self, src_cache, src_spec: LatentSpec, dst_cache, dst_spec: LatentSpec, src_ids, dst_ids) -> None:
        """``dst[dst_ids] = src[src_ids]``, whole blocks of every layer, between device and host caches."""
        raise NotImplementedError

    def latent_regions(self, spec: LatentSpec, blocks, heads: range | None = None) -> list[tuple[int, int]]:
        """Connector byte regions ``(offset, length)`` from the cache's first byte holding ``blocks``,
        every layer. A latent cache is replicated across TP ranks: a head slice (``heads``) is refused
        with ``ValueError``."""
        raise NotImplementedError

    def latent_transfer_plan(self, producer_tp: int, consumer_tp: int, consumer_rank: int, blocks) -> list[tuple[int, int]]:
        """``latent_plan``: the ``(block, producer_rank)`` pulls consumer rank ``consumer_rank`` makes for ``blocks``."""
        raise NotImplementedError

    def latent_descriptor(self, spec: LatentSpec) -> dict:
        """What this backend's connector announces of a latent cache at handshake; a peer whose
        descriptor differs is refused (default: the reference's ``record_descriptor``)."""
        from kvconform.reference import latent

        return latent.record_descriptor(spec.fmt)

    def supports_kv_connector(self) -> bool:
        """vLLM ``AttentionBackend.supports_kv_connector()`` (default True, SPEC GATE-SUPPORT)."""
        return True

    def selection_name(self) -> str:
        """The name the code under test calls this backend by (what ``selection_order`` lists;
        vLLM: the ``AttentionBackendEnum`` member, not ``vllm:NAME``). Every comparison of the
        backend with a name from the code under test goes through this."""
        return self.name

    def undeclared_op(self, op: str) -> tuple[str, str]:
        """(who, what) when ``op`` is not in ``capabilities.ops``: an adapter that does not drive
        an op the library has says so, instead of blaming the library."""
        return f"backend {self.name}", f"does not declare op '{op}'"

    def path_block_sizes(self, op: str, layout: Layout) -> tuple[int, ...]:
        """The declared block sizes at which ``op`` takes different code paths on ``layout``;
        fixed (non-generated) checks of that op run at each. Default: the first declared."""
        return self.capabilities.block_sizes[:1]

    # ---------------------------------------------------------------- connector ops (docs/CONNECTOR.md)
    def block_regions(self, cache, spec: CacheSpec, block_ids, heads: range | None = None) -> list[tuple[int, int]]:
        """``regions``: the byte ``(offset, length)`` runs, from the cache's first byte, that hold
        ``block_ids`` — every layer, K and V, every slot — of this rank's KV heads ``heads``
        (all when None), as a connector registers them for a transfer."""
        raise NotImplementedError

    def wire_layout(self, spec: CacheSpec) -> Layout:
        """The layout of this backend's wire form (default: canonical bytes, per block every
        layer, K then V, ``[N][H][D]``)."""
        return conn.CANONICAL_WIRE

    def export_blocks(self, cache, spec: CacheSpec, block_ids, heads: range | None = None) -> conn.Wire:
        """``wire``: the blocks (heads ``heads`` only, when given) in this backend's wire form,
        bit for bit."""
        raise NotImplementedError

    def import_blocks(self, cache, spec: CacheSpec, block_ids, wire: conn.Wire, heads: range | None = None, num_tokens: int | None = None) -> None:
        """``wire``: place the wire's tokens into ``block_ids`` (heads ``heads``), in place, bit
        for bit; ``reblock``: also when the wire's block size differs (token ``t`` of the wire
        lands in ``block_ids[t // N]``, slot ``t % N``), stopping after ``num_tokens``."""
        raise NotImplementedError

    def layout_descriptor(self, cache, spec: CacheSpec, *, tp_rank: int = 0, tp_size: int = 1, total_kv_heads: int | None = None,
                          k_scale: float | None = None, v_scale: float | None = None) -> dict:
        """The ``kvconform.compat`` descriptor of ``cache``, as this rank's connector announces it
        at handshake (default: from the declared layout)."""
        return compat.describe(spec.layout, spec.geometry, tp_rank=tp_rank, tp_size=tp_size, total_kv_heads=total_kv_heads,
                               kv_cache_dtype=spec.kv_cache_dtype, k_scale=k_scale, v_scale=v_scale,
                               backend=getattr(self, "name", type(self).__name__), platform=self.platform, arch=self.arch())

    def handshake(self, local: dict, remote: dict) -> compat.Verdict:
        """``handshake``: this engine's (the consumer's) verdict on receiving blocks from the
        peer ``remote`` — its connector's own compatibility check."""
        raise NotImplementedError

    def selection_order(self, *, use_kv_connector: bool) -> list[str] | None:
        """The platform selector's backend priority list for this configuration, by the names
        backends report (``selection_name``; vLLM ``_get_backend_priorities``, §C.3); None: no
        selector to check."""
        return None

    def connector_layouts(self) -> tuple[Layout, ...]:
        """The layouts this backend may run with while a KV connector is configured (default:
        every declared layout; E3 backends: what vLLM's layout resolution picks, SPEC §14)."""
        return self.capabilities.layouts

    def validate_configuration(self, *, head_size: int, dtype, kv_cache_dtype: str, block_size: int, use_kv_connector: bool) -> list[str]:
        """Reasons this configuration is invalid (vLLM ``validate_configuration``, SPEC GATE-REJECT, GATE-VALID)."""
        caps = self.capabilities
        reasons = []
        if head_size not in caps.head_sizes:
            reasons.append("head_size not supported")
        if dtype not in caps.dtypes:
            reasons.append("dtype not supported")
        if kv_cache_dtype not in caps.kv_cache_dtypes:
            reasons.append("kv_cache_dtype not supported")
        if block_size not in caps.block_sizes:
            reasons.append("block_size not supported")
        if use_kv_connector and not self.supports_kv_connector():
            reasons.append(CONNECTOR_NOT_SUPPORTED)
        return reasons
