"""What a KV connector does to a paged cache (SPEC.md §11, CONN-*), from the offset map.

A connector moving blocks between engines registers the byte regions that hold them, slices
KV heads when the two engines' tensor-parallel sizes differ (hetero-TP), ships blocks in a
wire form, and re-blocks tokens when the two engines' block sizes differ. Each is a function
of :meth:`Layout.offsets`; nothing here writes a second address formula.

Heads passed to these functions are *local* to one rank's cache (``0 ≤ h < H``);
:func:`rank_heads` says which of the model's heads a rank holds. Values move as raw bits
(integer views) unless :func:`convert` is asked to re-encode them, so NaN codes and −0
survive every copy.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from . import fp8
from .geometry import Geometry, bits_dtype
from .layouts import Layout, permuted
from .offsets import offset_map
from .ops import storage_bits

# Per block: every layer, K then V, [N][H][D] — the order of canonical_block_bytes.
CANONICAL_WIRE = permuted("WIRE", "canonical", (("B",), ("L",), ("2",), ("N",), ("H",), ("D",)), range(6))


# ----------------------------------------------------------------------------- tensor parallelism
def rank_heads(total_heads: int, tp_size: int, rank: int) -> range:
    """The model's KV heads held by TP rank ``rank`` of ``tp_size``.

    vLLM splits the heads evenly; when ``tp_size`` exceeds the head count every rank holds one
    head, replicated over ``tp_size // total_heads`` consecutive ranks.
    """
    if not 0 <= rank < tp_size:
        raise ValueError(f"tp_rank {rank} outside [0, {tp_size})")
    if tp_size <= total_heads:
        if total_heads % tp_size:
            raise ValueError(f"{total_heads} KV heads do not split evenly over tp_size {tp_size}")
        per_rank = total_heads // tp_size
        return range(rank * per_rank, (rank + 1) * per_rank)
    if tp_size % total_heads:
        raise ValueError(f"tp_size {tp_size} is not a multiple of the {total_heads} KV heads it replicates")
    head = rank // (tp_size // total_heads)
    return range(head, head + 1)


@dataclasses.dataclass(frozen=True)
class HeadSlice:
    """Heads ``producer_heads`` of producer rank ``producer_rank`` land in ``consumer_heads``
    of the consumer rank (both local to their rank's cache)."""

    producer_rank: int
    producer_heads: range
    consumer_heads: range

    def text(self, consumer_rank: int) -> str:
        """``heads 0..1 of producer rank 1 → heads 2..3 of consumer rank 0``: a plan's line for it."""
        return (f"heads {_span(self.producer_heads)} of producer rank {self.producer_rank} → heads {_span(self.consumer_heads)} "
                f"of consumer rank {consumer_rank}")


def paired_rank(producer_tp: int, consumer_tp: int, consumer_rank: int) -> int:
    """The producer rank vLLM pairs consumer rank ``d`` with first: ``⌊d·P/D⌋`` — the one rank
    it reads from when ``D ≥ P``, the first of the ``P/D`` ranks ``d·P/D …`` it reads from when
    ``P > D`` (``TransferTopology.handshake_target_ranks``, NIXL ``compute_tp_mapping``)."""
    if not 0 <= consumer_rank < consumer_tp:
        raise ValueError(f"consumer rank {consumer_rank} outside [0, {consumer_tp})")
    return consumer_rank * producer_tp // consumer_tp


def holders(total_heads: int, tp_size: int, head: int) -> list[int]:
    """The TP ranks of ``tp_size`` that hold model head ``head`` (several when replicated)."""
    return [r for r in range(tp_size) if head in rank_heads(total_heads, tp_size, r)]


def head_source(total_heads: int, producer_tp: int, consumer_tp: int, consumer_rank: int, head: int) -> int:
    """The producer rank the default pairing takes model head ``head`` of consumer rank ``d``
    from: the first holder at or after :func:`paired_rank` (vLLM's choice wherever one TP size
    divides the other: NIXL, Mooncake and MoRIIO read a replicated head from that rank), else
    the first holder. Any other holder of a replica would do as well (CONN-HANDSHAKE)."""
    held = holders(total_heads, producer_tp, head)
    first = paired_rank(producer_tp, consumer_tp, consumer_rank)
    return next((p for p in held if p >= first), held[0])


def head_slices(total_heads: int, producer_tp: int, consumer_tp: int, consumer_rank: int) -> list[HeadSlice]:
    """Where consumer rank ``consumer_rank`` gets each of its heads from under the default
    pairing (:func:`head_source`): runs of consecutive heads held by one producer rank."""
    wanted = rank_heads(total_heads, consumer_tp, consumer_rank)
    slices: list[HeadSlice] = []
    for local, head in enumerate(wanted):
        p = head_source(total_heads, producer_tp, consumer_tp, consumer_rank, head)
        source = head - rank_heads(total_heads, producer_tp, p).start
        last = slices[-1] if slices else None
        if last and last.producer_rank == p and last.producer_heads.stop == source and last.consumer_heads.stop == local:
            slices[-1] = HeadSlice(p, range(last.producer_heads.start, source + 1), range(last.consumer_heads.start, local + 1))
        else:
            slices.append(HeadSlice(p, range(source, source + 1), range(local, local + 1)))
    return slices


def slice_problems(total_heads: int, producer_tp: int, consumer_tp: int, consumer_rank: int, slices) -> list[str]:
    """What is wrong with a consumer rank's slices from all producer ranks, one sentence each
    (empty: every consumer head receives the right model head once, from a rank holding it).
    Any holder of a replicated head is accepted (CONN-HANDSHAKE)."""
    wanted = rank_heads(total_heads, consumer_tp, consumer_rank)
    received: dict[int, list[str]] = {}
    problems = []
    for s in slices:
        if not 0 <= s.producer_rank < producer_tp:
            problems.append(f"a slice names producer rank {s.producer_rank}, outside TP {producer_tp}")
            continue
        held = rank_heads(total_heads, producer_tp, s.producer_rank)
        if len(s.producer_heads) != len(s.consumer_heads):
            problems.append(f"producer heads {_span(s.producer_heads)} of rank {s.producer_rank} are {len(s.producer_heads)}, "
                            f"consumer heads {_span(s.consumer_heads)} {len(s.consumer_heads)}")
            continue
        for ph, ch in zip(s.producer_heads, s.consumer_heads):
            if not (0 <= ph < len(held) and 0 <= ch < len(wanted)):
                problems.append(f"producer rank {s.producer_rank} head {ph} → consumer head {ch} lies outside the ranks' "
                                f"{len(held)} and {len(wanted)} heads")
                continue
            if held[ph] != wanted[ch]:
                problems.append(f"consumer head {ch} (model head {wanted[ch]}) would receive model head {held[ph]} "
                                f"(head {ph} of producer rank {s.producer_rank})")
            received.setdefault(ch, []).append(f"producer rank {s.producer_rank}")
    for ch, model_head in enumerate(wanted):
        sources = received.get(ch, [])
        if not sources:
            problems.append(f"consumer head {ch} (model head {model_head}) receives nothing; holders: producer ranks "
                            f"{holders(total_heads, producer_tp, model_head)}")
        elif len(sources) > 1:
            problems.append(f"consumer head {ch} (model head {model_head}) receives {len(sources)} times ({', '.join(sources)})")
    return problems


def _span(heads: range) -> str:
    return f"{heads.start}..{heads.stop - 1}"


# ----------------------------------------------------------------------------- regions
def byte_runs(element_offsets: torch.Tensor, element_size: int) -> list[tuple[int, int]]:
    """Maximal ascending byte ``(offset, length)`` runs covering a set of element offsets."""
    offs = torch.unique(element_offsets.flatten())  # sorted
    if offs.numel() == 0:
        return []
    breaks = torch.nonzero(offs[1:] != offs[:-1] + 1).flatten() + 1
    starts = torch.cat([offs[:1], offs[breaks]])
    ends = torch.cat([offs[breaks - 1], offs[-1:]]) + 1
    return [(int(s) * element_size, int(e - s) * element_size) for s, e in zip(starts, ends)]


def byte_regions(layout: Layout, g: Geometry, blocks, heads=None) -> list[tuple[int, int]]:
    """Byte ``(offset, length)`` runs, ascending and maximal, from the cache start, holding
    exactly the given blocks — every layer, K and V, every slot — of the given local heads
    (all when None): what a connector registers to ship them."""
    return byte_runs(offset_map(layout, g, blocks, heads), g.element_size)


def region_bytes(regions: list[tuple[int, int]], device=None) -> torch.Tensor:
    """The byte indices the regions cover, in region order."""
    if not regions:
        return torch.zeros(0, dtype=torch.int64, device=device)
    # Built on the CPU in a few ops and moved once: one arange per region on a GPU was a kernel
    # launch per region (hundreds for a head slice), each waiting on the other workers' contexts.
    offsets, lengths = torch.tensor(regions, dtype=torch.int64).T
    if bool((lengths < 0).any()):
        raise ValueError(f"region {regions[int(torch.nonzero(lengths < 0)[0])]} has a negative length")
    first = torch.cumsum(lengths, 0) - lengths  # where each region's bytes start in the result
    index = torch.arange(int(lengths.sum())) + torch.repeat_interleave(offsets - first, lengths)
    return index.to(device)


def copy_between_regions(src: torch.Tensor, src_regions, dst: torch.Tensor, dst_regions) -> None:
    """Ship the bytes of ``src_regions`` of ``src`` into ``dst_regions`` of ``dst`` as one
    stream (a connector's region-to-region transfer); both lists must hold as many bytes."""
    src_index, dst_index = region_bytes(src_regions, src.device), region_bytes(dst_regions, dst.device)
    if src_index.numel() != dst_index.numel():
        raise ValueError(f"source regions hold {src_index.numel()} bytes, destination regions {dst_index.numel()}")
    dst.view(torch.uint8)[dst_index] = src.view(torch.uint8)[src_index].to(dst.device)


# ----------------------------------------------------------------------------- wire form
@dataclasses.dataclass(frozen=True)
class Wire:
    """Blocks in a wire form: ``data`` (uint8) is a cache of ``geometry`` in ``layout`` whose
    block ``i`` is the i-th block shipped; its heads are the shipped head slice."""

    data: torch.Tensor
    layout: Layout
    geometry: Geometry

    @property
    def num_tokens(self) -> int:
        return self.geometry.num_blocks * self.geometry.block_size


def wire_geometry(g: Geometry, num_blocks: int, num_heads: int | None = None) -> Geometry:
    """The geometry of a wire holding ``num_blocks`` blocks of ``num_heads`` heads of ``g``."""
    return dataclasses.replace(g, num_blocks=num_blocks, num_kv_heads=num_heads or g.num_kv_heads)


def _heads(g: Geometry, heads) -> torch.Tensor:
    chosen = torch.arange(g.num_kv_heads) if heads is None else torch.as_tensor(heads, dtype=torch.int64).flatten()
    if chosen.numel() == 0 or int(chosen.min()) < 0 or int(chosen.max()) >= g.num_kv_heads:
        raise ValueError(f"heads {list(chosen.tolist())} must be a non-empty subset of this rank's [0, {g.num_kv_heads})")
    return chosen


def _blocks(g: Geometry, blocks) -> torch.Tensor:
    ids = torch.as_tensor(blocks, dtype=torch.int64).flatten().cpu()
    listed = ids.tolist()  # a few ids: Python's min, max and set beat a torch op apiece
    if listed and (min(listed) < 0 or max(listed) >= g.num_blocks):
        raise ValueError(f"block ids must lie in [0, {g.num_blocks}), got {listed}")
    if len(set(listed)) != len(listed):
        raise ValueError(f"block ids repeat: {listed}")
    return ids


def gather(storage: torch.Tensor, layout: Layout, g: Geometry, blocks, heads=None) -> torch.Tensor:
    """The blocks' elements as logical ``(L, len(blocks), 2, N, len(heads), D)`` integer bits."""
    bits = storage_bits(storage, g)
    return bits[offset_map(layout, g, _blocks(g, blocks), _heads(g, heads)).to(bits.device)]


def scatter(storage: torch.Tensor, layout: Layout, g: Geometry, blocks, values: torch.Tensor, heads=None) -> None:
    """Inverse of :func:`gather`: write logical bits into the blocks' (heads') elements."""
    bits = storage_bits(storage, g)
    omap = offset_map(layout, g, _blocks(g, blocks), _heads(g, heads))
    if tuple(values.shape) != tuple(omap.shape) or values.element_size() != bits.element_size():
        raise ValueError(f"values must be {tuple(omap.shape)} of {g.element_size}-byte elements, got {tuple(values.shape)} {values.dtype}")
    bits[omap.to(bits.device)] = values.view(bits.dtype).to(bits.device)


def export_blocks(storage: torch.Tensor, layout: Layout, g: Geometry, blocks, heads=None, wire_layout: Layout = CANONICAL_WIRE) -> Wire:
    """The blocks (heads) of a cache in ``wire_layout``, bit for bit."""
    values = gather(storage, layout, g, blocks, heads)
    wg = wire_geometry(g, values.shape[1], values.shape[4])
    data = torch.zeros(wire_layout.nbytes(wg), dtype=torch.uint8, device=storage.device)
    scatter(data, wire_layout, wg, range(wg.num_blocks), values)
    return Wire(data, wire_layout, wg)


def token_offsets(layout: Layout, g: Geometry, block_table, num_tokens: int, heads=None) -> torch.Tensor:
    """Element offsets of the first ``num_tokens`` tokens of a sequence stored in ``block_table``
    (token ``t`` in block ``block_table[t // N]``, slot ``t % N``): ``(L, T, 2, len(heads), D)``."""
    table = _blocks(g, block_table)
    if num_tokens > table.numel() * g.block_size:
        raise ValueError(f"{num_tokens} tokens do not fit in {table.numel()} blocks of {g.block_size}")
    t = torch.arange(num_tokens)
    head = _heads(g, heads)
    offsets = layout.offsets(
        g, layer=torch.arange(g.num_layers)[:, None, None, None, None], block=table[t // g.block_size][None, :, None, None, None],
        kv=torch.arange(2)[None, None, :, None, None], slot=(t % g.block_size)[None, :, None, None, None],
        head=head[None, None, None, :, None], dim=torch.arange(g.head_size),
    )
    return offsets.expand(g.num_layers, num_tokens, 2, head.numel(), g.head_size)


def import_blocks(storage: torch.Tensor, layout: Layout, g: Geometry, blocks, wire: Wire, heads=None, num_tokens: int | None = None) -> None:
    """Place a wire's tokens into ``blocks`` (heads ``heads``) of a cache, bit for bit.

    Token ``t`` of the wire (wire block ``t // N_wire``, slot ``t % N_wire``) lands in block
    ``blocks[t // N]``, slot ``t % N``: the same block for block when the block sizes agree,
    re-blocked when they differ. ``num_tokens`` (default: every token the wire holds) stops
    the copy inside a last, partial block; nothing else of the cache changes.
    """
    wg = wire.geometry
    for field in ("num_layers", "head_size"):
        if getattr(wg, field) != getattr(g, field):
            raise ValueError(f"wire {field}={getattr(wg, field)} but the cache has {getattr(g, field)}")
    if wg.dtype != g.dtype:
        raise ValueError(f"wire holds {wg.dtype}, the cache {g.dtype}: convert the wire first")
    head = _heads(g, heads)
    if head.numel() != wg.num_kv_heads:
        raise ValueError(f"wire carries {wg.num_kv_heads} heads, {head.numel()} heads were asked for")
    tokens = wire.num_tokens if num_tokens is None else num_tokens
    if tokens > wire.num_tokens:
        raise ValueError(f"{tokens} tokens asked for, the wire holds {wire.num_tokens}")
    src = storage_bits(wire.data, wg)[token_offsets(wire.layout, wg, range(wg.num_blocks), tokens).to(wire.data.device)]
    bits = storage_bits(storage, g)
    bits[token_offsets(layout, g, blocks, tokens, head).to(bits.device)] = src.to(bits.device)


# ----------------------------------------------------------------------------- value conversions
def decode_values(bits: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 values of raw elements (integer bits) of a cache dtype (unscaled)."""
    return bits.contiguous().view(dtype).float()


def encode_values(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values (fp32 or fp64) → elements of ``dtype`` (fp8: saturating, as the cache writers do), as bits."""
    if dtype in fp8.FP8_DTYPES:
        encoded = fp8.quantize(values, 1.0, dtype)
    else:
        encoded = values.to(dtype)
    return encoded.view(bits_dtype(dtype))


def values_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same value (−0 equals 0, NaN equals NaN)."""
    return (a == b) | (torch.isnan(a) & torch.isnan(b))


# A value ratio whose odd part has more bits than an fp32 mantissa (24), or that lies this far
# from 1, takes every non-zero value of every cache dtype (at most 24 significant bits, 2^±149)
# off every cache dtype: below it, ``value · ratio`` is exact in fp64 (≤ 48 significant bits).
RATIO_ODD_BITS, RATIO_EXPONENT = 24, 700


def ratio_is_scalable(ratio: float) -> bool:
    """Whether ``value · ratio`` is computed exactly in fp64 for every cache value."""
    if not (math.isfinite(ratio) and ratio > 0):
        return False
    numerator, _ = ratio.as_integer_ratio()
    odd = numerator >> ((numerator & -numerator).bit_length() - 1)
    return odd < (1 << RATIO_ODD_BITS) and abs(math.frexp(ratio)[1]) < RATIO_EXPONENT


def convert(bits: torch.Tensor, src: torch.dtype, dst: torch.dtype, ratio: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Re-encode ``src`` elements as ``dst`` elements of ``value · ratio`` (``ratio`` =
    source scale / destination scale keeps the dequantised value). Returns the bits and the
    mask of elements converted exactly — the stored value equals ``value · ratio`` exactly
    (computed in fp64, where it is exact: :func:`ratio_is_scalable`; any other ratio keeps no
    non-zero value). The same dtype at ratio 1 is a bit copy."""
    if src == dst and ratio == 1.0:
        return bits.clone(), torch.ones(bits.shape, dtype=torch.bool)
    source = decode_values(bits, src).double()
    values = source * ratio
    out = encode_values(values, dst)
    exact = values_equal(decode_values(out, dst).double(), values)
    if not ratio_is_scalable(ratio):
        exact &= (source == 0) | torch.isnan(source)
    return out, exact


def _all_codes(dtype: torch.dtype) -> torch.Tensor | None:
    width = torch.empty((), dtype=dtype).element_size()
    if width > 2:
        return None
    return torch.arange(1 << (8 * width), dtype=torch.int32).to(bits_dtype(dtype))


@functools.cache
def inexact_code(src: torch.dtype, dst: torch.dtype, ratio: float) -> int | None:
    """A raw ``src`` element that has no exact ``dst`` image at value ratio ``ratio``, or None
    when every element converts exactly. 8- and 16-bit types are enumerated code by code;
    32-bit types convert exactly only to themselves at ratio 1 (witness: their largest value
    or their smallest subnormal)."""
    if src == dst and ratio == 1.0:
        return None
    codes = _all_codes(src)
    if codes is None:
        finfo = torch.finfo(src)
        codes = torch.tensor([finfo.max, finfo.smallest_normal * finfo.eps, 1 + finfo.eps], dtype=src).view(bits_dtype(src))
    _, exact = convert(codes, src, dst, ratio)
    bad = torch.nonzero(~exact).flatten()
    if bad.numel() == 0:
        return None
    mask = (1 << (8 * torch.empty((), dtype=src).element_size())) - 1
    return int(codes[bad[0]]) & mask
