"""Latent (MLA) caches: the plain MLA cache, DeepSeek's ``fp8_ds_mla`` records and the DSA indexer
key cache (SPEC §17), as vLLM 0.33.0 writes and reads them — writers, readers, MLA decode, block
copy/swap, the TP source rule and the connector descriptor.

Formats, geometry and the address formula are in :mod:`reference.latent_layout`, the bytes of one
record and its scale policy in :mod:`reference.latent_records`; both are re-exported here, so
``reference.latent`` is the whole surface. Every op addresses bytes through :func:`field_offsets`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from . import fp8
from .connector import paired_rank
from .latent_layout import (
    INDEXER_LAYOUTS,
    INDEXER_SCALE_FORMATS,
    KINDS,
    MLA_CACHE_DTYPES,
    LatentFormat,
    LatentGeometry,
    _check_layer,
    _positive,
    coordinates_of,
    field_offsets,
    field_widths,
    record_offsets,
)
from .latent_records import (
    DS_MLA_RANK,
    DS_MLA_ROPE,
    INDEXER_GROUP,
    ScalePolicy,
    decode_groups,
    ds_mla_fields,
    ds_mla_records,
    fp8_scale_divisor,
    indexer_quantize,
    indexer_scales,
    upconvert_ds_mla,
)


def _check_region(region: torch.Tensor, geom: LatentGeometry, name: str = "region") -> None:
    if (not isinstance(region, torch.Tensor) or region.dtype != torch.uint8 or region.dim() != 1
            or not region.is_contiguous() or region.numel() != geom.nbytes()):
        got = (region.dtype, tuple(region.shape)) if isinstance(region, torch.Tensor) else type(region).__name__
        raise ValueError(f"{name} must be a contiguous 1-D uint8 tensor of {geom.nbytes()} bytes ({geom.short()}), got {got}")


def _check_kind(geom: LatentGeometry, *kinds: str, op: str) -> None:
    if not isinstance(geom, LatentGeometry):
        raise ValueError(f"{op}: geom must be a LatentGeometry, got {type(geom).__name__}")
    if geom.fmt.kind not in kinds:
        raise ValueError(f"{op}: geom.fmt.kind must be {' or '.join(kinds)}, got {geom.fmt.kind!r}")


# ---------------------------------------------------------------------------------------------
# Writers (MLA-WRITE-*, DSMLA-*, IDX-*): tokens with slot < 0 are skipped; the rest are written.

def _written_tokens(slot_mapping, geom: LatentGeometry, tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(token indices, blocks, rows)`` of the slots ``>= 0`` among the first ``tokens`` of ``slot_mapping``."""
    if not isinstance(slot_mapping, torch.Tensor) or slot_mapping.dim() != 1 or slot_mapping.dtype not in (torch.int32, torch.int64):
        got = (slot_mapping.dtype, tuple(slot_mapping.shape)) if isinstance(slot_mapping, torch.Tensor) else type(slot_mapping).__name__
        raise ValueError(f"slot_mapping must be a 1-D int32/int64 tensor, got {got}")
    slots = slot_mapping.to(torch.int64).cpu()
    if tokens is not None:
        if slots.numel() < tokens:
            raise ValueError(f"slot_mapping has {slots.numel()} entries for {tokens} tokens")
        slots = slots[:tokens]
    capacity = geom.num_blocks * geom.block_size
    if slots.numel() and int(slots.max()) >= capacity:
        raise ValueError(f"slot_mapping holds slots >= num_blocks*block_size = {capacity}")
    token = torch.nonzero(slots >= 0).flatten()
    written = slots[token]
    if torch.unique(written).numel() != written.numel():
        raise ValueError("slot_mapping repeats a slot; the written value would be undefined")
    return token, written // geom.block_size, written % geom.block_size


def _rows(x, name: str, tokens: int, width: int | tuple, dtype: torch.dtype) -> torch.Tensor:
    """``x[:tokens]`` after checking it is ``[>= tokens, width]`` of ``dtype`` (read through its strides)."""
    widths = width if isinstance(width, tuple) else (width,)
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] not in widths or x.shape[0] < tokens:
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be [>= {tokens} tokens, {' or '.join(map(str, widths))}], got {got}")
    if x.dtype != dtype:
        raise ValueError(f"{name} must be {dtype} (the format's model_dtype), got {x.dtype}")
    return x[:tokens].cpu()


def _per_tensor_scale(scale, name: str = "scale") -> float:
    """A per-tensor scale: one positive float32 element (``None`` = 1.0, vLLM's ``skip_scale``)."""
    if scale is None:
        return 1.0
    value = torch.as_tensor(scale, dtype=torch.float32)
    if value.numel() != 1 or not bool(value.reshape(()) > 0):
        raise ValueError(f"{name} must be one positive float (per-tensor), got {value.tolist()}")
    return float(value.reshape(()))


def encode_mla_entries(kv_c: torch.Tensor, k_pe: torch.Tensor, fmt: LatentFormat, scale) -> torch.Tensor:
    """uint8 ``[T, entry_bytes]`` of plain MLA entries: ``kv_c ‖ k_pe`` as the model dtype's bits
    (auto) or ``cast(x / scale)`` to the cache's fp8 (MLA-WRITE-FP8)."""
    entries = torch.cat([kv_c, k_pe], dim=1)
    if fmt.cache_dtype != "auto":
        entries = fp8.quantize(entries, _per_tensor_scale(scale), fmt.storage_dtype())
    return entries.contiguous().view(torch.uint8)


def _put(region: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> None:
    """``region[index] = values`` wherever the region lives (a device probe's twin, a host cache):
    the bytes are computed on the inputs' device and moved."""
    region[index.to(region.device)] = values.to(region.device)


def concat_and_cache_mla(kv_c, k_pe, region, geom: LatentGeometry, slot_mapping, *, scale, layer: int = 0) -> None:
    """Write ``kv_c[t] ‖ k_pe[t]`` to slot ``slot_mapping[t]`` for ``t < len(slot_mapping)`` (MLA-WRITE-SLOT)."""
    _check_kind(geom, "mla", op="concat_and_cache_mla")
    _check_region(region, geom)
    fmt = geom.fmt
    token, blocks, rows = _written_tokens(slot_mapping, geom)
    T = slot_mapping.shape[0]
    kv_c = _rows(kv_c, "kv_c", T, fmt.kv_lora_rank, fmt.model_dtype)
    k_pe = _rows(k_pe, "k_pe", T, fmt.rope_dim, fmt.model_dtype)
    entries = encode_mla_entries(kv_c[token], k_pe[token], fmt, scale)
    _put(region, field_offsets(geom, blocks, rows, layer)["latent"], entries)


def concat_and_cache_ds_mla(kv_c, k_pe, region, geom: LatentGeometry, slot_mapping, *, policy: ScalePolicy | None = None,
                            layer: int = 0) -> None:
    """Write 656-byte records (DSMLA-RECORD) of ``kv_c [T, 512]`` and ``k_pe [T, 64]`` (``[T, 0]`` writes a
    zero RoPE tail). ``policy`` defaults to the format's platform policy (DSMLA-SCALE)."""
    _check_kind(geom, "fp8_ds_mla", op="concat_and_cache_ds_mla")
    _check_region(region, geom)
    fmt = geom.fmt
    policy = policy or ScalePolicy.ds_mla("0.33.0", fmt.platform, fmt.arch)
    token, blocks, rows = _written_tokens(slot_mapping, geom)
    T = slot_mapping.shape[0]
    kv_c = _rows(kv_c, "kv_c", T, DS_MLA_RANK, fmt.model_dtype)
    k_pe = _rows(k_pe, "k_pe", T, (DS_MLA_ROPE, 0), fmt.model_dtype)
    records = ds_mla_records(kv_c[token], k_pe[token], policy, fmt.e4m3)
    _put(region, record_offsets(geom, blocks, rows, layer), records)


def indexer_k_quant_and_cache(k, region, geom: LatentGeometry, slot_mapping, *, policy: ScalePolicy | None = None,
                              layer: int = 0) -> None:
    """Quantise indexer keys ``k [T, D]`` into the per-block indexer cache (IDX-LAYOUT, IDX-SCALE, IDX-MX). Tokens are
    ``k.shape[0]`` (vLLM reads ``k.size(0)``, cache_kernels.cu:1957); ``slot_mapping`` needs at least as many."""
    _check_kind(geom, "indexer", op="indexer_k_quant_and_cache")
    _check_region(region, geom)
    fmt = geom.fmt
    policy = policy or ScalePolicy.indexer(fmt.scale_format, fmt.platform, fmt.arch)
    if not isinstance(k, torch.Tensor) or k.dim() != 2:
        raise ValueError(f"k must be a 2-D [tokens, {fmt.kv_lora_rank}] tensor, got {getattr(k, 'shape', type(k).__name__)}")
    T = k.shape[0]
    token, blocks, rows = _written_tokens(slot_mapping, geom, tokens=T)
    k = _rows(k, "k", T, fmt.kv_lora_rank, fmt.model_dtype)
    codes, scale_bytes = indexer_quantize(k[token], policy, fmt.scale_format, fmt.e4m3)
    offsets = field_offsets(geom, blocks, rows, layer)
    _put(region, offsets["values"], codes)
    _put(region, offsets["scales"], scale_bytes)


def concat_and_cache_mla_grouped(kv_cs, k_pes, regions, geoms, slot_mappings, *, scales) -> None:
    """The multi-layer writer (MLA-GROUPED): layer ``l`` writes ``kv_cs[l]``, ``k_pes[l]`` at
    ``slot_mappings[l]`` into ``regions[l]`` with ``scales[l]``. As vLLM's kernel: bf16 inputs only, tokens
    ``= kv_cs.size(1)``, one block size and record width for all layers, fp8 needs a scale per layer."""
    L = len(regions)
    if not (len(kv_cs) == len(k_pes) == len(geoms) == len(slot_mappings) == L):
        raise ValueError(f"kv_cs, k_pes, regions, geoms, slot_mappings need one entry per layer ({L})")
    if len({(g.fmt, g.block_size) for g in geoms}) > 1:
        raise ValueError("geoms must share one format and block size (one block_stride/entry_stride in vLLM)")
    for g in geoms:
        _check_kind(g, "mla", op="concat_and_cache_mla_grouped")
    if L and geoms[0].fmt.model_dtype != torch.bfloat16:
        raise ValueError("concat_and_cache_mla_grouped takes bfloat16 inputs only (cache_kernels.cu:1070-1073)")
    fp8_cache = L and geoms[0].fmt.cache_dtype != "auto"
    if fp8_cache and (scales is None or torch.as_tensor(scales).numel() != L):
        raise ValueError(f"scales must hold one float32 scale per layer ({L}) for an fp8 cache")
    if not fp8_cache and scales is not None:
        raise ValueError("scales must be None for a bf16 (auto) cache, as vLLM requires")
    for l in range(L):
        tokens = kv_cs[l].shape[0]
        slots = slot_mappings[l]
        if not isinstance(slots, torch.Tensor) or slots.dim() != 1 or slots.shape[0] < tokens:
            raise ValueError(f"slot_mappings[{l}] must be 1-D with >= {tokens} entries")
        concat_and_cache_mla(kv_cs[l], k_pes[l], regions[l], geoms[l], slots[:tokens],
                             scale=torch.as_tensor(scales)[l] if fp8_cache else None)


# ---------------------------------------------------------------------------------------------
# Readers (LATENT-GATHER, DSMLA-UPCONVERT, MLA-DECODE)

def _sequence_tokens(geom: LatentGeometry, block_table, seq_lens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(blocks, rows, sequence)`` of every token of every sequence, in order: token ``t`` of sequence
    ``s`` lives in block ``block_table[s, t // N]`` at row ``t % N``."""
    block_table = torch.as_tensor(block_table).cpu()
    seq_lens = torch.as_tensor(seq_lens).cpu()
    if block_table.dim() != 2 or block_table.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"block_table must be a 2-D int tensor [sequences, max_blocks], got {block_table.dtype} {tuple(block_table.shape)}")
    if seq_lens.dim() != 1 or seq_lens.numel() != block_table.shape[0] or seq_lens.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"seq_lens must be 1-D int with one entry per block_table row ({block_table.shape[0]}), "
                         f"got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    seq_lens = seq_lens.to(torch.int64)
    if seq_lens.numel() and (int(seq_lens.min()) < 0 or int(seq_lens.max()) > block_table.shape[1] * geom.block_size):
        raise ValueError(f"seq_lens must lie in [0, {block_table.shape[1] * geom.block_size}] (block_table width x block_size)")
    sequence = torch.repeat_interleave(torch.arange(seq_lens.numel()), seq_lens)
    starts = torch.cumsum(seq_lens, 0) - seq_lens
    position = torch.arange(sequence.numel()) - starts[sequence]
    blocks = block_table.to(torch.int64)[sequence, position // geom.block_size]
    if blocks.numel() and (int(blocks.min()) < 0 or int(blocks.max()) >= geom.num_blocks):
        raise ValueError(f"block_table names blocks outside [0, {geom.num_blocks}) within seq_lens")
    return blocks, position % geom.block_size, sequence


def gather_records(region, geom: LatentGeometry, block_table, seq_lens, layer: int = 0) -> torch.Tensor:
    """uint8 ``[sum(seq_lens), entry_bytes]``: each token's stored bytes, sequences one after another
    (``cp_gather_cache``: a byte copy, no dequantisation). Not for the indexer (see :func:`gather_indexer`)."""
    _check_kind(geom, "mla", "fp8_ds_mla", op="gather_records")
    _check_region(region, geom)
    blocks, rows, _ = _sequence_tokens(geom, block_table, seq_lens)
    return region[record_offsets(geom, blocks, rows, layer)]


def gather_latent(region, geom: LatentGeometry, block_table, seq_lens, *, scale=None, layer: int = 0) -> torch.Tensor:
    """``[sum(seq_lens), kv_lora_rank + rope_dim]`` in the model dtype, sequences one after another:
    plain auto the stored bits; plain fp8 ``round(float(code) · scale)`` (``gather_and_maybe_dequant_cache``);
    fp8_ds_mla the upconverted record (DSMLA-UPCONVERT)."""
    _check_kind(geom, "mla", "fp8_ds_mla", op="gather_latent")
    _check_region(region, geom)
    fmt = geom.fmt
    raw = gather_records(region, geom, block_table, seq_lens, layer)
    if fmt.kind == "fp8_ds_mla":
        return upconvert_ds_mla(raw, fmt.model_dtype, fmt.e4m3)
    stored = raw.view(fmt.storage_dtype())
    if fmt.cache_dtype == "auto":
        return stored
    return fp8.dequantize(stored, _per_tensor_scale(scale)).to(fmt.model_dtype)


def gather_indexer(region, geom: LatentGeometry, block_table, seq_lens, layer: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values uint8 [T, D], scale bytes uint8 [T, D/32])`` of every token, sequences in order
    (``cp_gather_indexer_k_quant_cache``: bytes as stored, no dequantisation)."""
    _check_kind(geom, "indexer", op="gather_indexer")
    _check_region(region, geom)
    blocks, rows, _ = _sequence_tokens(geom, block_table, seq_lens)
    offsets = field_offsets(geom, blocks, rows, layer)
    return region[offsets["values"]], region[offsets["scales"]]


def dequantize_indexer(values: torch.Tensor, scale_bytes: torch.Tensor, fmt: LatentFormat) -> torch.Tensor:
    """float32 ``[T, D]`` keys of gathered indexer bytes: ``float(code) · scale`` per 128 values."""
    return decode_groups(values, indexer_scales(scale_bytes, fmt.scale_format), INDEXER_GROUP, fmt.e4m3)


def mla_decode(query, region, geom: LatentGeometry, block_table, seq_lens, *, scale=None, softmax_scale: float,
               layer: int = 0) -> torch.Tensor:
    """One MLA decode step (MLA-DECODE): query ``[S, Hq, R+P]``; K = each token's whole dequantised latent,
    V = its first ``R`` values; float32 scores ``softmax_scale · q·k``, softmax over the sequence → ``[S, Hq, R]``
    in the model dtype. Every sequence needs at least one token."""
    _check_kind(geom, "mla", "fp8_ds_mla", op="mla_decode")
    fmt = geom.fmt
    seq_lens = torch.as_tensor(seq_lens).cpu()
    if not isinstance(query, torch.Tensor) or query.dim() != 3 or query.shape[2] != fmt.width() or query.shape[0] != seq_lens.numel():
        raise ValueError(f"query must be [sequences ({seq_lens.numel()}), heads, {fmt.width()}], got {getattr(query, 'shape', query)}")
    if seq_lens.numel() and int(seq_lens.min()) < 1:
        raise ValueError("seq_lens must be >= 1 for decode (an empty sequence has no softmax)")
    latent = gather_latent(region, geom, block_table, seq_lens, scale=scale, layer=layer).float()
    _, _, sequence = _sequence_tokens(geom, block_table, seq_lens)
    S, T_max = seq_lens.numel(), int(seq_lens.max()) if seq_lens.numel() else 0
    position = torch.arange(sequence.numel()) - (torch.cumsum(seq_lens, 0) - seq_lens)[sequence]
    dense = torch.zeros(S, T_max, fmt.width())
    dense[sequence, position] = latent
    valid = torch.arange(T_max)[None, :] < seq_lens[:, None]
    scores = torch.einsum("shd,std->sht", query.float().cpu(), dense) * softmax_scale
    scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
    out = torch.einsum("sht,std->shd", torch.softmax(scores, dim=-1), dense[..., :fmt.kv_lora_rank])
    return out.to(fmt.model_dtype)


# ---------------------------------------------------------------------------------------------
# Blocks (LATENT-BLOCK): a block of one layer is one contiguous byte range in every format.

def _block_ids(geom: LatentGeometry, ids, name: str) -> torch.Tensor:
    ids = torch.as_tensor(ids, dtype=torch.int64).flatten().cpu()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= geom.num_blocks):
        raise ValueError(f"{name} must lie in [0, {geom.num_blocks}), got {ids.tolist()}")
    return ids


def block_byte_ranges(geom: LatentGeometry, blocks, layer: int | None = None) -> list[tuple[int, int]]:
    """``(start, length)`` of each block, block by block; every layer in order when ``layer`` is None."""
    ids = _block_ids(geom, blocks, "blocks")
    layers = range(geom.num_layers) if layer is None else [layer]
    if layer is not None:
        _check_layer(geom, layer)
    size = geom.block_bytes()
    return [(l * geom.layer_bytes() + b * size, size) for b in ids.tolist() for l in layers]


def _block_bytes_index(geom: LatentGeometry, ids: torch.Tensor) -> torch.Tensor:
    """Byte offsets of whole blocks ``ids`` in every layer: ``int64 [L, n, block_bytes]``."""
    layer_base = torch.arange(geom.num_layers)[:, None, None] * geom.layer_bytes()
    return layer_base + ids[None, :, None] * geom.block_bytes() + torch.arange(geom.block_bytes())


def copy_latent_blocks(region, geom: LatentGeometry, block_mapping) -> None:
    """For each ``[src, dst]`` row, copy the whole block (every layer; records, indexer values and scales
    alike). All sources are read before any destination is written; a destination may not repeat."""
    _check_region(region, geom)
    mapping = torch.as_tensor(block_mapping, dtype=torch.int64).cpu()
    if mapping.dim() != 2 or mapping.shape[1] != 2:
        raise ValueError(f"block_mapping must be [pairs, 2], got {tuple(mapping.shape)}")
    swap_latent_blocks(region, geom, region, geom, mapping[:, 0], mapping[:, 1])


def swap_latent_blocks(src_region, src_geom: LatentGeometry, dst_region, dst_geom: LatentGeometry, src_ids, dst_ids) -> None:
    """``dst[dst_ids[i]] = src[src_ids[i]]`` for whole blocks of every layer (device ↔ host swaps)."""
    if (src_geom.fmt, src_geom.block_size, src_geom.num_layers) != (dst_geom.fmt, dst_geom.block_size, dst_geom.num_layers):
        raise ValueError(f"dst_geom must hold the same format, block size and layers as src_geom: "
                         f"{src_geom.short()} vs {dst_geom.short()}")
    _check_region(src_region, src_geom, "src_region")
    _check_region(dst_region, dst_geom, "dst_region")
    src = _block_ids(src_geom, src_ids, "src_ids")
    dst = _block_ids(dst_geom, dst_ids, "dst_ids")
    if src.numel() != dst.numel():
        raise ValueError(f"{src.numel()} src_ids but {dst.numel()} dst_ids")
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(f"dst_ids repeat: {dst.tolist()}")
    values = src_region[_block_bytes_index(src_geom, src)]
    _put(dst_region, _block_bytes_index(dst_geom, dst), values)


# ---------------------------------------------------------------------------------------------
# Connector (LATENT-TP-SOURCE, LATENT-COMPAT)

def replicated_block_sources(producer_tp: int, consumer_tp: int, consumer_rank: int, blocks: Sequence[int]) -> dict[int, int]:
    """Block → the one producer rank consumer ``d`` pulls it from: ``⌊d·P/D⌋`` for every block, for P > D
    and P < D alike (NIXL ``compute_tp_mapping``, nixl/tp_mapping.py:104-117: the latent is replicated)."""
    for name, value in (("producer_tp", producer_tp), ("consumer_tp", consumer_tp)):
        if not _positive(value):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not isinstance(consumer_rank, int) or not 0 <= consumer_rank < consumer_tp:
        raise ValueError(f"consumer_rank must be an int in [0, {consumer_tp}), got {consumer_rank!r}")
    source = paired_rank(producer_tp, consumer_tp, consumer_rank)
    return {int(b): source for b in blocks}


_SCALE_GRANULARITY = {"mla": "per-tensor", "fp8_ds_mla": "per-128-value-tile", "indexer": "per-128-values"}


def record_descriptor(fmt: LatentFormat) -> dict:
    """What a connector handshake must agree on for a latent cache (LATENT-COMPAT): equal dicts,
    or the peers' bytes mean different things."""
    policy = None
    if fmt.kind == "fp8_ds_mla":
        policy = ScalePolicy.ds_mla("0.33.0", fmt.platform, fmt.arch)
    elif fmt.kind == "indexer":
        policy = ScalePolicy.indexer(fmt.scale_format, fmt.platform, fmt.arch)
    fp8_variant = None
    if fmt.kind != "mla" or fmt.cache_dtype != "auto":
        fp8_variant = fp8.fp8_format(fmt.storage_dtype()).name if fmt.kind == "mla" else fmt.e4m3.name
    rope_dtype = None
    if fmt.rope_dim:
        rope_dtype = str(fmt.model_dtype if fmt.kind == "fp8_ds_mla" else fmt.storage_dtype()).removeprefix("torch.")
    return {
        "kind": fmt.kind,
        "entry_bytes": fmt.entry_bytes(),
        "kv_lora_rank": fmt.kv_lora_rank,
        "rope_dim": fmt.rope_dim,
        "rope_dtype": rope_dtype,
        "storage_dtype": str(fmt.storage_dtype()).removeprefix("torch."),
        "fp8_variant": fp8_variant,
        "scale": _SCALE_GRANULARITY[fmt.kind] if fp8_variant else None,
        "scale_policy": dataclasses.asdict(policy) if policy else None,
        "scale_format": fmt.scale_format if fmt.kind == "indexer" else None,
        "block_layout": {"rows": "values-then-scales", "shuffle": "16x16-tiled-values-then-scales"}[fmt.indexer_layout]
        if fmt.kind == "indexer" else "per-token",
    }


__all__ = [  # the record codecs of latent_records are part of this module's surface
    "KINDS", "MLA_CACHE_DTYPES", "INDEXER_SCALE_FORMATS", "INDEXER_LAYOUTS", "ScalePolicy", "LatentFormat", "LatentGeometry",
    "field_widths", "field_offsets", "record_offsets", "coordinates_of", "encode_mla_entries",
    "concat_and_cache_mla", "concat_and_cache_ds_mla", "indexer_k_quant_and_cache", "concat_and_cache_mla_grouped",
    "gather_records", "gather_latent", "gather_indexer", "dequantize_indexer", "mla_decode", "block_byte_ranges",
    "copy_latent_blocks", "swap_latent_blocks", "replicated_block_sources", "record_descriptor", "ds_mla_records",
    "ds_mla_fields", "upconvert_ds_mla", "indexer_quantize", "indexer_scales", "fp8_scale_divisor",
]  # fmt: skip
