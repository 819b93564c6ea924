"""What a backend with quantised caches that carry their scales in the page declares and does
(SPEC §16 PTH-*: per-token-head modes; §16.1 NVFP4-*: nvfp4).

``Capabilities.quant`` holds a :class:`QuantCapabilities`; the backend implements the ``quant_*``
methods of :class:`QuantOps` for the ops it lists. A backend with only these caches declares
``layouts=()``: the K/V checks are then not applicable to it by declaration.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform.reference import quant_layouts as QL

QUANT_OPS = frozenset({"quant_write", "quant_decode", "quant_copy", "quant_swap", "quant_regions", "quant_reblock"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantCapabilities:
    modes: tuple[str, ...]  # of quant_layouts.MODES
    orders: tuple[str, ...] = QL.ORDERS  # the physical orders the backend's caches take
    # Where its nvfp4 writer puts V's block scales (NVFP4-SCALE-PLACEMENT): vLLM's SM100 kernel swizzles
    # them, FlashInfer's writer on SM80/90/120 stores them linearly; a model may take both.
    v_scales: tuple[str, ...] = (QL.SWIZZLED,)
    ops: frozenset[str] = QUANT_OPS
    block_sizes: tuple[int, ...] = (16,)
    head_sizes: tuple[int, ...] = (64, 128)
    num_kv_heads: tuple[int, ...] = (1, 2, 3)
    num_layers: tuple[int, ...] = (1, 2)
    padding_slots: bool = True

    def __post_init__(self):
        for name, values, allowed in (("modes", self.modes, QL.MODES), ("orders", self.orders, QL.ORDERS), ("ops", self.ops, QUANT_OPS),
                                      ("v_scales", self.v_scales, QL.V_SCALE_PLACEMENTS)):
            if not values or set(values) - set(allowed):
                raise ValueError(f"QuantCapabilities.{name}: {sorted(values)}; expected a non-empty subset of {sorted(allowed)}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantSpec:
    geometry: QL.QuantGeometry
    layer: int = 0  # the layer per-layer ops (allocate, write, decode) act on
    model_dtype: torch.dtype = torch.bfloat16
    # The checkpoint's per-tensor K and V scales (layer._k_scale): nvfp4's second level (global
    # scale 1 / k_scale, SPEC NVFP4-SCALE); the per-token-head modes do not read them.
    k_scale: float = 1.0
    v_scale: float = 1.0


class QuantOps:
    """The ops of a per-token-head cache; every tensor on the backend's device."""

    def quant_allocate(self, buffer: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
        """The allocation ``(L, B, H, N, C)`` over ``buffer`` (uint8, ``spec.geometry.nbytes()``) in the
        declared order; per-layer ops act on ``cache[spec.layer]``. Layer ``spec.layer`` is left as
        the backend's first use leaves it (its scale views built: PTH-SCALE-INIT), others untouched."""
        raise NotImplementedError

    def quant_write(self, cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor, spec: QuantSpec) -> None:
        """``key``/``value`` ``[T, H, D]`` (model dtype, rows possibly strided) into ``slot_mapping``'s slots (-1: padding)."""
        raise NotImplementedError

    def quant_decode(self, cache: torch.Tensor, query: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, spec: QuantSpec, *,
                     scale: float) -> torch.Tensor:
        """Paged decode over the quantised cache: ``query [S, Hq, D]`` → ``[S, Hq, D]``."""
        raise NotImplementedError

    def quant_copy(self, cache: torch.Tensor, block_mapping: torch.Tensor, spec: QuantSpec) -> None:
        """Every ``[src, dst]`` row copies a whole block, every layer."""
        raise NotImplementedError

    def quant_swap(self, src_cache: torch.Tensor, src_spec: QuantSpec, dst_cache: torch.Tensor, dst_spec: QuantSpec,
                   src_ids: torch.Tensor, dst_ids: torch.Tensor) -> None:
        """``dst[dst_ids[i]] = src[src_ids[i]]``, whole blocks, every layer."""
        raise NotImplementedError

    def quant_reblock(self, src_cache: torch.Tensor, src_spec: QuantSpec, dst_cache: torch.Tensor, dst_spec: QuantSpec,
                      src_table: list[int], dst_table: list[int], num_tokens: int) -> None:
        """A sequence's first ``num_tokens`` tokens, every layer, codes and scales, from blocks of
        one size to blocks of another: token ``t`` of ``src_table[t // N_src]`` slot ``t % N_src``
        lands in ``dst_table[t // N_dst]`` slot ``t % N_dst`` (a connector's re-blocking)."""
        raise NotImplementedError

    def quant_regions(self, cache: torch.Tensor, spec: QuantSpec, block_ids: list[int], heads: range) -> list[tuple[int, int]]:
        """The byte ``(offset, length)`` runs, from the allocation's first byte, that a connector
        registers for KV heads ``heads`` of ``block_ids`` in every layer: codes and scales."""
        raise NotImplementedError
