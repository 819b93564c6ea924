"""Per-token-head quantised caches (SPEC §16 PTH-*): where every data and scale byte lives.

vLLM 0.33.0 TRITON_ATTN packs ``int8_per_token_head`` and ``fp8_per_token_head`` caches as one
logical tensor ``(B, H, N, C)`` of 1-byte elements per layer, ``C = 2·(D + 4)``: per (head, slot)
the cell is ``[K codes (D) | K scale (4) | V codes (D) | V scale (4)]``, each scale one float32
(little-endian) carved from the page (``TritonAttentionBackend.customize_spec`` adds the 8 bytes;
``TritonAttentionImpl._ensure_scale_caches`` views them). The physical order is HND
(``strides (H·N·C, N·C, C, 1)``) or NHD (``(N·H·C, C, H·C, 1)``); a page is one block of one
layer, ``H·N·C`` bytes, contiguous in both orders. Layer ``l`` starts at ``l · B · page``.

:func:`field_offsets` is the only address formula for these caches; every other module derives
from it (symbols of docs/SPEC.md §0: B blocks, N block size, H KV heads, D head size).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

MODES = ("int8_per_token_head", "fp8_per_token_head")
ORDERS = ("HND", "NHD")
SCALE_BYTES = 4  # one float32 per (side, head, slot)
FIELDS = ("k_data", "k_scale", "v_data", "v_scale")


@dataclasses.dataclass(frozen=True, kw_only=True)
class QuantGeometry:
    """One per-token-head cache allocation: ``num_layers`` layers of ``(B, H, N, C)`` bytes."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    mode: str = "int8_per_token_head"
    order: str = "HND"
    num_layers: int = 1

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"QuantGeometry.mode: {self.mode!r}; expected one of {MODES}")
        if self.order not in ORDERS:
            raise ValueError(f"QuantGeometry.order: {self.order!r}; expected one of {ORDERS}")
        for name in ("num_blocks", "block_size", "num_kv_heads", "head_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"QuantGeometry.{name}: must be >= 1, got {getattr(self, name)}")
        if self.head_size % SCALE_BYTES:
            # _ensure_scale_caches asserts every scale offset is a whole float32 (to_f32_units).
            raise ValueError(f"QuantGeometry.head_size: {self.head_size} is not a multiple of 4 (the scale would be unaligned)")

    @property
    def padded_head(self) -> int:
        """Bytes of one side of a cell: D codes then the 4-byte scale."""
        return self.head_size + SCALE_BYTES

    @property
    def cell_bytes(self) -> int:
        """C: bytes per (head, slot), what ``customize_spec`` calls ``state_content_bytes``."""
        return 2 * self.padded_head

    @property
    def page_bytes(self) -> int:
        """One block of one layer (vLLM ``page_size_bytes``): ``H·N·C``."""
        return self.num_kv_heads * self.block_size * self.cell_bytes

    def nbytes(self) -> int:
        return self.num_layers * self.num_blocks * self.page_bytes

    def shape(self) -> tuple[int, int, int, int]:
        """The logical per-layer tensor ``(B, H, N, C)`` the backend receives."""
        return (self.num_blocks, self.num_kv_heads, self.block_size, self.cell_bytes)

    def strides(self) -> tuple[int, int, int, int]:
        """Element (= byte) strides of :meth:`shape` in this order."""
        return _strides(self)

    def layer_bytes(self) -> int:
        return self.num_blocks * self.page_bytes

    def short(self) -> str:
        layers = f"L{self.num_layers}·" if self.num_layers > 1 else ""
        return f"{self.mode}:{self.order} {layers}B{self.num_blocks}·N{self.block_size}·H{self.num_kv_heads}·D{self.head_size}"


@functools.lru_cache(maxsize=256)
def _strides(g: QuantGeometry) -> tuple[int, int, int, int]:
    N, H, C = g.block_size, g.num_kv_heads, g.cell_bytes
    if g.order == "HND":
        return (H * N * C, N * C, C, 1)
    return (N * H * C, C, H * C, 1)


def cell_offsets(g: QuantGeometry, blocks, slots, heads, layer: int = 0) -> torch.Tensor:
    """Byte offset of the first byte of cell (layer, block, head, slot); arguments broadcast."""
    sb, sh, sn, _ = g.strides()
    blocks, slots, heads = (torch.as_tensor(a, dtype=torch.int64) for a in (blocks, slots, heads))
    return layer * g.layer_bytes() + blocks * sb + heads * sh + slots * sn


def field_offsets(g: QuantGeometry, blocks, slots, heads, layer: int = 0) -> dict[str, torch.Tensor]:
    """THE address formula: byte offsets of every byte of each field of (layer, block, slot, head).

    ``blocks``, ``slots``, ``heads`` broadcast to a shape ``S``; each field has shape ``S + (n,)``:
    ``k_data``/``v_data`` n = D (byte d is dim d), ``k_scale``/``v_scale`` n = 4 (the float32,
    little-endian). Within the cell: K codes at ``0``, K scale at ``D``, V codes at ``D + 4``,
    V scale at ``2·D + 4``.
    """
    base = cell_offsets(g, blocks, slots, heads, layer)[..., None]
    dims, scale = torch.arange(g.head_size), torch.arange(SCALE_BYTES)
    return {
        "k_data": base + dims,
        "k_scale": base + g.head_size + scale,
        "v_data": base + g.padded_head + dims,
        "v_scale": base + g.padded_head + g.head_size + scale,
    }


def coordinates_of(g: QuantGeometry, offset: int) -> dict:
    """The inverse of :func:`field_offsets` for one byte, for failure messages."""
    if not 0 <= offset < g.nbytes():
        return {"outside": offset}
    layer, rest = divmod(offset, g.layer_bytes())
    sb, sh, sn, _ = g.strides()
    block, rest = divmod(rest, sb)
    if g.order == "HND":
        head, rest = divmod(rest, sh)
        slot, byte = divmod(rest, sn)
    else:
        slot, rest = divmod(rest, sn)
        head, byte = divmod(rest, sh)
    side, within = divmod(byte, g.padded_head)
    field = ("k_" if side == 0 else "v_") + ("data" if within < g.head_size else "scale")
    return {"layer": layer, "block": block, "slot": slot, "head": head, "field": field,
            "byte": within if within < g.head_size else within - g.head_size}


def block_byte_ranges(g: QuantGeometry, blocks, layer: int | None = None) -> list[tuple[int, int]]:
    """``(start, length)`` of each block's page (data and scales), one layer or every layer."""
    layers = range(g.num_layers) if layer is None else (layer,)
    return [(int(lay * g.layer_bytes() + b * g.page_bytes), g.page_bytes) for lay in layers for b in blocks]


def head_slice_ranges(g: QuantGeometry, blocks, heads: range) -> list[tuple[int, int]]:
    """The byte runs holding heads ``heads`` of ``blocks`` in every layer, scales included.

    HND: per (layer, block) one run of ``len(heads)·N·C`` bytes; NHD: per (layer, block, slot)
    one run of ``len(heads)·C`` bytes. A scale lives in its head's cell, so a run of cells
    carries its scales (SPEC PTH-HEAD-SLICE)."""
    runs = []
    for layer in range(g.num_layers):
        for b in blocks:
            if g.order == "HND":
                start = int(cell_offsets(g, b, 0, heads.start, layer))
                runs.append((start, len(heads) * g.block_size * g.cell_bytes))
            else:
                runs += [(int(cell_offsets(g, b, n, heads.start, layer)), len(heads) * g.cell_bytes) for n in range(g.block_size)]
    return runs
