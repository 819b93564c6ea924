"""Quantised caches with scales in the page (SPEC §16 PTH-*, §16.1 NVFP4-*): where every data and
scale byte lives.

vLLM 0.33.0 TRITON_ATTN packs ``int8_per_token_head`` and ``fp8_per_token_head`` caches as one
logical tensor ``(B, H, N, C)`` of 1-byte elements per layer, ``C = 2·(D + 4)``: per (head, slot)
the cell is ``[K codes (D) | K scale (4) | V codes (D) | V scale (4)]``, each scale one float32
(little-endian) carved from the page (``TritonAttentionBackend.customize_spec`` adds the 8 bytes;
``TritonAttentionImpl._ensure_scale_caches`` views them). The physical order is HND
(``strides (H·N·C, N·C, C, 1)``) or NHD (``(N·H·C, C, H·C, 1)``); a page is one block of one
layer, ``H·N·C`` bytes, contiguous in both orders. Layer ``l`` starts at ``l · B · page``.

:func:`field_offsets` is the only address formula for these caches; every other module derives
from it (symbols of docs/SPEC.md §0: B blocks, N block size, H KV heads, D head size).

``nvfp4`` (FlashInfer, ``csrc/nvfp4_kv_cache_kernels.cu``) packs a page as ``[K side | V side]``,
each side ``[data (H·N·D/2) | e4m3 block scales (H·N·D/16)]`` with (head, slot) rows in HND or NHD
order inside each region; K's scales are linear, V's are swizzled in 4 × 4 (slot, scale) tiles by
vLLM's SM100 kernel and linear like K's by FlashInfer's writer on SM80/90/120 (``v_scales``, SPEC
NVFP4-SCALE-PLACEMENT: a page is read with the placement it was written in).
The logical tensor vLLM allocates is ``(B, 2H, N, D/2 + D/16)`` (K head slots, then V's); in NHD
its strides do not say where a byte lives (vLLM re-views the page, ``_nvfp4_kv_views``).
"""

from __future__ import annotations

import dataclasses
import functools

import torch

PTH_MODES = ("int8_per_token_head", "fp8_per_token_head")
NVFP4 = "nvfp4"
MODES = PTH_MODES + (NVFP4,)
NVFP4_GROUP = 16  # values per e4m3 block scale
NVFP4_TILE = 4  # the V-scale swizzle's tile: 4 slots × 4 scale columns
ORDERS = ("HND", "NHD")
SCALE_BYTES = 4  # one float32 per (side, head, slot)
FIELDS = ("k_data", "k_scale", "v_data", "v_scale")
SWIZZLED, LINEAR = "swizzled", "linear"
V_SCALE_PLACEMENTS = (SWIZZLED, LINEAR)  # nvfp4's V block scales: vLLM's SM100 kernel, FlashInfer on SM80/90/120


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
    v_scales: str = SWIZZLED  # where nvfp4's V block scales are (NVFP4-SCALE-PLACEMENT); the other modes keep the default

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"QuantGeometry.mode: {self.mode!r}; expected one of {MODES}")
        if self.v_scales not in V_SCALE_PLACEMENTS or (self.v_scales != SWIZZLED and self.mode != NVFP4):
            raise ValueError(f"QuantGeometry.v_scales: {self.v_scales!r}; expected one of {V_SCALE_PLACEMENTS} (not swizzled: nvfp4 only)")
        if self.order not in ORDERS:
            raise ValueError(f"QuantGeometry.order: {self.order!r}; expected one of {ORDERS}")
        for name in ("num_blocks", "block_size", "num_kv_heads", "head_size", "num_layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"QuantGeometry.{name}: must be >= 1, got {getattr(self, name)}")
        if why := unmet(self.mode, self.block_size, self.head_size):
            raise ValueError(f"QuantGeometry: {why}")

    @property
    def data_bytes(self) -> int:
        """Code bytes of one (side, head, slot): D, or D/2 for nvfp4's two codes a byte."""
        return self.head_size // 2 if self.mode == NVFP4 else self.head_size

    @property
    def scale_count(self) -> int:
        """Scale bytes of one (side, head, slot): a float32, or nvfp4's D/16 e4m3 block scales."""
        return self.head_size // NVFP4_GROUP if self.mode == NVFP4 else SCALE_BYTES

    @property
    def padded_head(self) -> int:
        """Bytes of one side of a cell: D codes then the 4-byte scale."""
        return self.head_size + SCALE_BYTES

    @property
    def cell_bytes(self) -> int:
        """C: bytes per (head, slot), what ``customize_spec`` calls ``state_content_bytes``
        (nvfp4: per head *slot* of one side, ``D/2 + D/16``, vLLM's ``nvfp4_kv_cache_full_dim``)."""
        return self.data_bytes + self.scale_count if self.mode == NVFP4 else 2 * self.padded_head

    @property
    def side_bytes(self) -> int:
        """nvfp4: one side (K or V) of a page, ``H·N·(D/2 + D/16)``."""
        return self.num_kv_heads * self.block_size * self.cell_bytes

    @property
    def page_bytes(self) -> int:
        """One block of one layer (vLLM ``page_size_bytes``): ``H·N·C`` (nvfp4: both sides)."""
        return (2 if self.mode == NVFP4 else 1) * self.num_kv_heads * self.block_size * self.cell_bytes

    def nbytes(self) -> int:
        return self.num_layers * self.num_blocks * self.page_bytes

    def shape(self) -> tuple[int, int, int, int]:
        """The logical per-layer tensor ``(B, H, N, C)`` the backend receives (nvfp4: ``(B, 2H, N, C)``)."""
        return (self.num_blocks, self.head_slots, self.block_size, self.cell_bytes)

    @property
    def head_slots(self) -> int:
        return (2 if self.mode == NVFP4 else 1) * self.num_kv_heads

    def strides(self) -> tuple[int, int, int, int]:
        """Element (= byte) strides of :meth:`shape` in this order."""
        return _strides(self)

    def layer_bytes(self) -> int:
        return self.num_blocks * self.page_bytes

    def short(self) -> str:
        layers = f"L{self.num_layers}·" if self.num_layers > 1 else ""
        placed = f" V scales {self.v_scales}" if self.v_scales != SWIZZLED else ""
        return f"{self.mode}:{self.order}{placed} {layers}B{self.num_blocks}·N{self.block_size}·H{self.num_kv_heads}·D{self.head_size}"


def unmet(mode: str, block_size: int, head_size: int) -> str | None:
    """Why a mode cannot take this block and head size (SPEC PTH-LAYOUT, NVFP4-PAGE), or None."""
    if mode == NVFP4:
        if head_size % (NVFP4_GROUP * NVFP4_TILE):
            # 16 values a scale and 4 scale columns a swizzle tile: csrc/nvfp4_kv_cache_kernels.cu:44-46
            # divides by S/4 (0 for D < 64), and vLLM's test skips (D/16) % 4 != 0.
            return f"nvfp4 needs head_size % 64 == 0 (4 × 4 swizzle of D/16 scales), got {head_size}"
        if block_size % NVFP4_TILE:
            return f"nvfp4 needs block_size % 4 == 0 (4-slot swizzle tiles), got {block_size}"
        return None
    if head_size % SCALE_BYTES:
        # _ensure_scale_caches asserts every scale offset is a whole float32 (to_f32_units).
        return f"head_size {head_size} is not a multiple of 4 (the scale would be unaligned)"
    return None


@functools.lru_cache(maxsize=256)
def _strides(g: QuantGeometry) -> tuple[int, int, int, int]:
    N, H, C = g.block_size, g.head_slots, g.cell_bytes
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

    ``blocks``, ``slots``, ``heads`` broadcast to a shape ``S``; each field has shape ``S + (n,)``.
    Per-token-head modes: ``k_data``/``v_data`` n = D (byte d is dim d), ``k_scale``/``v_scale``
    n = 4 (the float32, little-endian); within the cell K codes at ``0``, K scale at ``D``, V codes
    at ``D + 4``, V scale at ``2·D + 4``. nvfp4: ``*_data`` n = D/2 (byte j holds dims 2j, 2j+1),
    ``*_scale`` n = D/16 (byte s is the scale of dims 16s … 16s+15), SPEC NVFP4-PAGE/-SWIZZLE; V's
    scales at :func:`swizzled` positions, or (``g.v_scales == "linear"``) at the row and column K's
    take in their region (NVFP4-SCALE-PLACEMENT).
    """
    if g.mode == NVFP4:
        return _nvfp4_field_offsets(g, blocks, slots, heads, layer)
    base = cell_offsets(g, blocks, slots, heads, layer)[..., None]
    dims, scale = torch.arange(g.head_size), torch.arange(SCALE_BYTES)
    return {
        "k_data": base + dims,
        "k_scale": base + g.head_size + scale,
        "v_data": base + g.padded_head + dims,
        "v_scale": base + g.padded_head + g.head_size + scale,
    }


def swizzled(slots: torch.Tensor, scales: torch.Tensor, scale_count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where V's scale ``s`` of slot ``t`` is stored, as (row, column) of the (slot, scale) plane
    (``swizzle_scale_offset``, csrc/nvfp4_kv_cache_kernels.cu:42-48): ``t' = (t/4)·4 + s/(S/4)``,
    ``s' = (s mod S/4)·4 + t mod 4``."""
    group = scale_count // NVFP4_TILE
    return (slots // NVFP4_TILE) * NVFP4_TILE + scales // group, (scales % group) * NVFP4_TILE + slots % NVFP4_TILE


def _nvfp4_field_offsets(g: QuantGeometry, blocks, slots, heads, layer: int) -> dict[str, torch.Tensor]:
    blocks, slots, heads = (torch.as_tensor(a, dtype=torch.int64) for a in (blocks, slots, heads))
    H, N, S = g.num_kv_heads, g.block_size, g.scale_count

    def row(t, h):  # index of the (head, slot) row within a side's data or scale region
        return h * N + t if g.order == "HND" else t * H + h

    page = (layer * g.layer_bytes() + blocks * g.page_bytes)[..., None]
    scales_at = H * N * g.data_bytes  # the scale region follows the data region in each side
    data = row(slots, heads)[..., None] * g.data_bytes + torch.arange(g.data_bytes)
    s = torch.arange(S)
    v_slot, v_col = swizzled(slots[..., None], s, S) if g.v_scales == SWIZZLED else (slots[..., None], s)
    return {
        "k_data": page + data,
        "k_scale": page + scales_at + row(slots, heads)[..., None] * S + s,
        "v_data": page + g.side_bytes + data,
        "v_scale": page + g.side_bytes + scales_at + row(v_slot, heads[..., None]) * S + v_col,
    }


@functools.lru_cache(maxsize=64)
def _page_map(g: QuantGeometry) -> tuple[torch.Tensor, ...]:
    """For each byte of one page: (field index in FIELDS, slot, head, byte within the field),
    by inverting :func:`field_offsets` over block 0 of layer 0."""
    slots, heads = torch.meshgrid(torch.arange(g.block_size), torch.arange(g.num_kv_heads), indexing="ij")
    fields = field_offsets(g, 0, slots, heads)
    table = torch.full((4, g.page_bytes), -1, dtype=torch.int64)
    for index, name in enumerate(FIELDS):
        offs = fields[name]
        n = offs.shape[-1]
        table[:, offs.flatten()] = torch.stack([torch.full_like(offs, index), slots[..., None].expand_as(offs),
                                                heads[..., None].expand_as(offs), torch.arange(n).expand_as(offs)]).reshape(4, -1)
    return tuple(table)


def coordinates_of(g: QuantGeometry, offset: int) -> dict:
    """The inverse of :func:`field_offsets` for one byte, for failure messages."""
    if not 0 <= offset < g.nbytes():
        return {"outside": offset}
    layer, rest = divmod(offset, g.layer_bytes())
    block, within = divmod(rest, g.page_bytes)
    field, slot, head, byte = (int(t[within]) for t in _page_map(g))
    return {"layer": layer, "block": block, "slot": slot, "head": head, "field": FIELDS[field], "byte": byte}


def block_byte_ranges(g: QuantGeometry, blocks, layer: int | None = None) -> list[tuple[int, int]]:
    """``(start, length)`` of each block's page (data and scales), one layer or every layer."""
    layers = range(g.num_layers) if layer is None else (layer,)
    return [(int(lay * g.layer_bytes() + b * g.page_bytes), g.page_bytes) for lay in layers for b in blocks]


def head_slice_ranges(g: QuantGeometry, blocks, heads: range) -> list[tuple[int, int]]:
    """The byte runs holding heads ``heads`` of ``blocks`` in every layer, scales included: the
    slice's bytes by :func:`field_offsets`, as maximal runs (SPEC PTH-HEAD-SLICE, NVFP4-HEAD-SLICE).

    Per-token-head HND: one run of ``len(heads)·N·C`` bytes per block; NHD: one run of
    ``len(heads)·C`` per (block, slot) — a scale lives in its head's cell. nvfp4 HND: four runs per
    block (K data, K scales, V data, V scales); NHD: four per (block, slot). Runs that touch (all
    heads of neighbouring blocks) come back as one."""
    b = torch.as_tensor(list(blocks), dtype=torch.int64)[:, None, None]
    t, h = torch.arange(g.block_size)[:, None], torch.tensor(list(heads))
    at = torch.cat([f.flatten() for layer in range(g.num_layers) for f in field_offsets(g, b, t, h, layer).values()]).sort().values
    breaks = torch.nonzero(at[1:] != at[:-1] + 1).flatten() + 1
    starts = torch.cat([torch.tensor([0]), breaks])
    ends = torch.cat([breaks, torch.tensor([len(at)])])
    return [(int(at[s]), int(e - s)) for s, e in zip(starts, ends)]
