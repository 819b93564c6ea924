"""The KV-connector handshake check, usable at run time.

Two engines about to exchange KV blocks each describe their cache with a small versioned JSON
*layout descriptor* (:func:`describe`; docs/CONNECTOR.md has the schema). :func:`check` says
whether blocks of a producer rank can land exactly in a consumer rank, and how — the transfer
plan: which heads, region-to-region or through the canonical wire form, which conversions
(layout permutation, fp8 re-encoding at an exact scale ratio, re-blocking) — or names the
first mismatch in one sentence. :func:`execute` runs a plan with the reference ops.

    kvconform compat producer.json consumer.json      (or: python -m kvconform.compat …)

A descriptor file holds one descriptor or a list of them (one per TP rank). This module needs
only the rest of the reference (and torch); a connector imports it as ``kvconform.compat``, without the test suite.
"""

from __future__ import annotations

import dataclasses
import json

import torch

from kvconform.reference import Geometry, Layout, bits_dtype, fp8
from kvconform.reference import connector as conn
from kvconform.reference.errors import InputError

SCHEMA = "kvconform-layout/1"
SYMBOLS = ("L", "B", "2", "N", "H", "D", "D/x", "x:d", "N/x", "x:n")
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.bfloat16, torch.float16, torch.float32, *fp8.FP8_DTYPES)}
REQUIRED = ("schema", "dims", "strides", "dtype", "num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size",
            "total_kv_heads", "tp_rank", "tp_size")


class DescriptorError(InputError):
    """A descriptor that cannot be read: the message names the field and what was expected."""


# ----------------------------------------------------------------------------- descriptors
def describe(layout: Layout, g: Geometry, *, tp_rank: int = 0, tp_size: int = 1, total_kv_heads: int | None = None,
             kv_cache_dtype: str = "auto", k_scale: float | None = None, v_scale: float | None = None, **identity) -> dict:
    """The descriptor of one rank's cache: ``layout`` holding ``g`` (``g.num_kv_heads`` = this
    rank's heads). ``identity`` (backend, platform, arch …) is carried along for people."""
    is_fp8 = g.dtype in fp8.FP8_DTYPES
    tiled = layout.is_tiled
    descriptor = {
        "schema": SCHEMA, **identity,
        "layout": str(layout), "era": layout.era, "alias": layout.alias,
        "dims": list(layout.k_dims), "strides": _strides(layout, g, 0),
        "v_dims": list(layout.v_dims) if tiled else None, "v_strides": _strides(layout, g, 1) if tiled else None,
        "block_pad": layout.block_pad,
        "tile": {"x": g.x, "k": _tile_name(layout.k_dims), "v": _tile_name(layout.v_dims)} if tiled else None,
        "dtype": _dtype_name(g.dtype), "fp8_format": _dtype_name(g.dtype) if is_fp8 else None, "kv_cache_dtype": kv_cache_dtype,
        "k_scale": float(1.0 if k_scale is None else k_scale) if is_fp8 else None,
        "v_scale": float(1.0 if v_scale is None else v_scale) if is_fp8 else None,
        "num_layers": g.num_layers, "num_blocks": g.num_blocks, "block_size": g.block_size,
        "num_kv_heads": g.num_kv_heads, "head_size": g.head_size,
        "total_kv_heads": total_kv_heads or g.num_kv_heads * tp_size, "tp_rank": tp_rank, "tp_size": tp_size,
    }
    parse(descriptor)  # a descriptor this module writes is one it reads
    return descriptor


def _strides(layout: Layout, g: Geometry, kv: int) -> dict[str, int]:
    strides = layout.strides(g, kv)
    return {symbol: strides[symbol] for symbol in (layout.v_dims if kv else layout.k_dims)}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tile_name(dims) -> str:
    tile = [s.replace("x:d", "x").replace("x:n", "x") for s in dims if s not in ("L", "B", "2")]
    return "[" + ",".join(tile) + "]"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """A parsed descriptor: the reference layout and geometry of one rank's cache."""

    layout: Layout
    geometry: Geometry
    tp_rank: int
    tp_size: int
    total_kv_heads: int
    k_scale: float
    v_scale: float
    label: str

    @property
    def heads(self) -> range:
        """The model's heads this rank holds."""
        return conn.rank_heads(self.total_kv_heads, self.tp_size, self.tp_rank)

    def scale(self, kv: int) -> float:
        return self.v_scale if kv else self.k_scale


def _field(d: dict, name: str, kind, source: str):
    value = d.get(name)
    if kind is int and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise DescriptorError(f"{source}: field {name!r} must be a non-negative integer, got {value!r}")
    if kind is list and (not isinstance(value, list) or any(s not in SYMBOLS for s in value)):
        raise DescriptorError(f"{source}: field {name!r} must list dimension symbols out of {list(SYMBOLS)}, got {value!r}")
    return value


def parse(d: dict, source: str = "descriptor") -> Endpoint:
    """Validate a descriptor and build its reference layout; DescriptorError names what is wrong."""
    if not isinstance(d, dict):
        raise DescriptorError(f"{source}: a descriptor is a JSON object, got {type(d).__name__}")
    if d.get("schema") != SCHEMA:
        raise DescriptorError(f"{source}: schema {d.get('schema')!r} is not {SCHEMA!r}; produce it with this kvconform version")
    missing = [f for f in REQUIRED if f not in d]
    if missing:
        raise DescriptorError(f"{source}: missing field(s) {', '.join(missing)}")
    if d["dtype"] not in DTYPES:
        raise DescriptorError(f"{source}: dtype {d['dtype']!r} is not one of {sorted(DTYPES)}")
    dtype = DTYPES[d["dtype"]]
    if (d.get("fp8_format") or None) != (d["dtype"] if dtype in fp8.FP8_DTYPES else None):
        raise DescriptorError(f"{source}: fp8_format {d.get('fp8_format')!r} does not match dtype {d['dtype']!r}")
    ints = {f: _field(d, f, int, source) for f in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size", "total_kv_heads", "tp_rank", "tp_size", "block_pad") if f in d}
    k_dims = tuple(_field(d, "dims", list, source))
    v_dims = tuple(_field(d, "v_dims", list, source)) if d.get("v_dims") else k_dims
    try:
        g = Geometry(num_blocks=ints["num_blocks"], block_size=ints["block_size"], num_kv_heads=ints["num_kv_heads"],
                     head_size=ints["head_size"], dtype=dtype, num_layers=ints["num_layers"])
        layout = Layout(era=str(d.get("era") or "DESC"), alias=str(d.get("alias") or "descriptor"), k_dims=k_dims, v_dims=v_dims,
                        native=tuple((s,) for s in k_dims), block_pad=ints.get("block_pad", 0))
        layout.validate(g)
        heads = conn.rank_heads(ints["total_kv_heads"], ints["tp_size"], ints["tp_rank"])
    except ValueError as exc:
        raise DescriptorError(f"{source}: {exc}") from exc
    for side, dims, key in ((0, k_dims, "strides"), (1, v_dims, "v_strides")):
        if side and not d.get("v_dims"):
            continue
        _check_strides(d, layout, g, side, dims, key, source)
    if len(heads) != g.num_kv_heads:
        raise DescriptorError(f"{source}: tp_rank {ints['tp_rank']} of {ints['tp_size']} holds {len(heads)} of the "
                              f"{ints['total_kv_heads']} KV heads, but num_kv_heads is {g.num_kv_heads}")
    scales = []
    for name in ("k_scale", "v_scale"):
        value = d.get(name)
        if dtype in fp8.FP8_DTYPES and (not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0):
            raise DescriptorError(f"{source}: an fp8 cache needs a positive {name}, got {value!r}")
        scales.append(float(value) if dtype in fp8.FP8_DTYPES else 1.0)
    label = d.get("label") or " ".join(str(x) for x in (d.get("backend"), d.get("layout") or layout.name) if x)
    return Endpoint(layout, g, ints["tp_rank"], ints["tp_size"], ints["total_kv_heads"], scales[0], scales[1], label)


def _check_strides(d, layout, g, side, dims, key, source):
    given = d.get(key)
    want = layout.strides(g, side)
    if not isinstance(given, dict) or set(given) != set(dims):
        raise DescriptorError(f"{source}: field {key!r} must give the element stride of each of {list(dims)}, got {given!r}")
    for symbol in dims:
        if given[symbol] != want[symbol]:
            raise DescriptorError(f"{source}: {key}[{symbol!r}] is {given[symbol]!r}, but dims {list(dims)} (dense, block_pad "
                                  f"{layout.block_pad}) put it at {want[symbol]}; kvconform descriptors describe dense layouts")


def load(path: str) -> list[dict]:
    """The descriptors in a file (one object, or a list of them: one per TP rank)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, json.JSONDecodeError) as exc:
        raise DescriptorError(f"{path}: not a readable descriptor file ({exc})") from exc
    descriptors = data if isinstance(data, list) else [data]
    for i, d in enumerate(descriptors):
        parse(d, f"{path}[{i}]" if isinstance(data, list) else path)
    return descriptors


# ----------------------------------------------------------------------------- verdicts
@dataclasses.dataclass(frozen=True)
class Plan:
    """How one producer rank's blocks land in one consumer rank.

    ``mode`` ``regions``: byte regions of the producer's blocks go as they are into the
    consumer's regions (same layout, dtype, scales and block size; NIXL-style). ``wire``: the
    producer exports its heads in the canonical wire form, elements are re-encoded when the
    dtypes or scales differ (``ratios``: value ratio per K, V), and the consumer imports them,
    re-blocking when the block sizes differ.
    """

    producer: Endpoint
    consumer: Endpoint
    slices: tuple[conn.HeadSlice, ...]
    mode: str
    steps: tuple[str, ...]  # short names of the conversions: layout, dtype, re-block
    conversions: tuple[str, ...]  # what each step does, for people
    ratios: tuple[float, float]

    @property
    def identical(self) -> bool:
        """No conversion at all: the consumer receives the producer's bytes."""
        return self.mode == "regions"

    def lines(self) -> list[str]:
        out = []
        for s in self.slices:
            p, c = s.producer_heads, s.consumer_heads
            regions = ""
            if self.mode == "regions":
                count = len(conn.byte_regions(self.producer.layout, self.producer.geometry, [0], p))
                regions = f", {count} region{'s' if count != 1 else ''} per block"
            out.append(f"heads {p.start}..{p.stop - 1} of producer rank {self.producer.tp_rank} → heads {c.start}..{c.stop - 1} "
                       f"of consumer rank {self.consumer.tp_rank} ({self.mode}{regions})")
        if not self.slices:
            out.append(f"producer rank {self.producer.tp_rank} holds none of consumer rank {self.consumer.tp_rank}'s heads: nothing to send")
        out += [f"convert: {c}" for c in self.conversions]
        return out


@dataclasses.dataclass(frozen=True)
class Verdict:
    compatible: bool
    reason: str | None = None  # the first mismatch, one sentence
    kind: str | None = None  # what mismatched: layers | head_size | heads | dtype
    plan: Plan | None = None

    @property
    def summary(self) -> str:
        if not self.compatible:
            return f"incompatible: {self.reason}"
        if not self.plan.slices:
            return "compatible: nothing to send"
        return "compatible: identical bytes" if self.plan.identical else f"compatible: converted ({', '.join(self.plan.steps)})"

    def __str__(self) -> str:
        return "\n".join([self.summary] + (["  " + line for line in self.plan.lines()] if self.plan else []))


def check(producer: dict, consumer: dict) -> Verdict:
    """May the producer rank's blocks land, exactly, in the consumer rank? (the first mismatch, or the plan)"""
    p, c = parse(producer, "producer"), parse(consumer, "consumer")
    gp, gc = p.geometry, c.geometry
    if gp.num_layers != gc.num_layers:
        return Verdict(False, f"the producer's cache holds {gp.num_layers} layers, the consumer's {gc.num_layers}", "layers")
    if gp.head_size != gc.head_size:
        return Verdict(False, f"head_size {gp.head_size} (producer) differs from {gc.head_size} (consumer): a head has no counterpart", "head_size")
    if p.total_kv_heads != c.total_kv_heads:
        return Verdict(False, f"the producer's model has {p.total_kv_heads} KV heads, the consumer's {c.total_kv_heads}", "heads")
    ratios = (p.k_scale / c.k_scale, p.v_scale / c.v_scale)
    for kv, ratio in enumerate(ratios):
        code = conn.inexact_code(gp.dtype, gc.dtype, ratio)
        if code is not None:
            return Verdict(False, _inexact_reason(p, c, kv, ratio, code), "dtype")
    slices = tuple(s for s in conn.head_slices(p.total_kv_heads, p.tp_size, c.tp_size, c.tp_rank) if s.producer_rank == p.tp_rank)
    steps = {}
    if (p.layout.k_dims, p.layout.v_dims) != (c.layout.k_dims, c.layout.v_dims):
        steps["layout"] = f"layout {p.layout.name} → {c.layout.name}"
    if gp.dtype != gc.dtype or ratios != (1.0, 1.0):
        steps["dtype"] = _conversion_text(p, c, ratios)
    if gp.block_size != gc.block_size:
        steps["re-block"] = f"re-block {gp.block_size} → {gc.block_size} tokens per block"
    mode = "wire" if steps else "regions"
    return Verdict(True, plan=Plan(p, c, slices, mode, tuple(steps), tuple(steps.values()), ratios))


def _inexact_reason(p: Endpoint, c: Endpoint, kv: int, ratio: float, code: int) -> str:
    src, dst = _dtype_name(p.geometry.dtype), _dtype_name(c.geometry.dtype)
    value = float(conn.decode_values(torch.tensor([code]).to(bits_dtype(p.geometry.dtype)), p.geometry.dtype)[0])
    scaled = fp8.FP8_DTYPES & {p.geometry.dtype, c.geometry.dtype}
    scales = f" at {'kv'[kv]}_scale {p.scale(kv):g} → {c.scale(kv):g} (value ratio {ratio:g})" if scaled else ""
    return f"{src} → {dst} is not exact{scales}: {src} code 0x{code:0{2 * p.geometry.element_size}x} ({value:g}) becomes {value * ratio:g}, which {dst} cannot hold"


def _conversion_text(p: Endpoint, c: Endpoint, ratios) -> str:
    src, dst = _dtype_name(p.geometry.dtype), _dtype_name(c.geometry.dtype)
    if ratios == (1.0, 1.0):
        return f"{src} → {dst} (every value exact)"
    return f"{src} → {dst}, values × {ratios[0]:g} (K) / × {ratios[1]:g} (V): scales {p.k_scale:g}/{p.v_scale:g} → {c.k_scale:g}/{c.v_scale:g}, every value exact"


def check_ranks(producers: list[dict], consumers: list[dict]) -> list[list[Verdict]]:
    """``check`` for every (consumer rank, producer rank) pair, consumer ranks outermost."""
    return [[check(p, c) for p in producers] for c in consumers]


# ----------------------------------------------------------------------------- executing a plan
def execute(plan: Plan, producer_storage: torch.Tensor, producer_blocks, consumer_storage: torch.Tensor, consumer_blocks,
            num_tokens: int | None = None) -> None:
    """Move the plan's heads of ``producer_blocks`` into ``consumer_blocks`` with the reference ops.

    Regions mode ships whole blocks (block ``producer_blocks[i]`` → ``consumer_blocks[i]``);
    wire mode ships the first ``num_tokens`` tokens of the sequence (default: every token of
    the producer's blocks), re-blocked into the consumer's block table.
    """
    p, c = plan.producer, plan.consumer
    for s in plan.slices:
        if plan.mode == "regions":
            if len(producer_blocks) != len(consumer_blocks):
                raise ValueError(f"regions mode moves block for block: {len(producer_blocks)} producer blocks, {len(consumer_blocks)} consumer blocks")
            for pb, cb in zip(producer_blocks, consumer_blocks):
                conn.copy_between_regions(producer_storage, conn.byte_regions(p.layout, p.geometry, [pb], s.producer_heads),
                                          consumer_storage, conn.byte_regions(c.layout, c.geometry, [cb], s.consumer_heads))
            continue
        wire = conn.export_blocks(producer_storage, p.layout, p.geometry, producer_blocks, s.producer_heads)
        wire = convert_wire(wire, c.geometry.dtype, plan.ratios)
        conn.import_blocks(consumer_storage, c.layout, c.geometry, consumer_blocks, wire, s.consumer_heads, num_tokens)


def convert_wire(wire: conn.Wire, dtype: torch.dtype, ratios: tuple[float, float]) -> conn.Wire:
    """The wire re-encoded as ``dtype`` with K values × ``ratios[0]``, V values × ``ratios[1]``."""
    g = wire.geometry
    if dtype == g.dtype and ratios == (1.0, 1.0):
        return wire
    blocks = range(g.num_blocks)
    values = conn.gather(wire.data, wire.layout, g, blocks)
    out = torch.stack([conn.convert(values[:, :, kv], g.dtype, dtype, ratios[kv])[0] for kv in (0, 1)], dim=2)
    wg = dataclasses.replace(g, dtype=dtype)
    data = torch.zeros(wire.layout.nbytes(wg), dtype=torch.uint8, device=wire.data.device)
    conn.scatter(data, wire.layout, wg, blocks, out)
    return conn.Wire(data, wire.layout, wg)
