"""The KV-connector handshake check, usable at run time.

Two engines about to exchange KV blocks each describe their cache with a small versioned JSON
*layout descriptor* (:func:`describe`; docs/CONNECTOR.md has the schema). :func:`check` says
whether blocks of a producer rank can land exactly in a consumer rank, and how — the transfer
plan: which heads, region-to-region or through the canonical wire form, which conversions
(layout permutation, fp8 re-encoding at an exact scale ratio, re-blocking) — or names the
first mismatch in one sentence. :func:`execute` runs a plan with the reference ops.

    kvconform compat producer.json consumer.json      (or: python -m kvconform.compat …)

A descriptor without a ``cache`` section describes a K/V cache; with one, a latent (MLA) cache or a
quantised cache with its scales in the page (:mod:`kvconform.reference.compat_caches`).

A descriptor file holds one descriptor or a list of them (one per TP rank). This module needs
only the rest of the reference (and torch); a connector imports it as ``kvconform.compat``, without the test suite.
"""

from __future__ import annotations

import dataclasses
import fractions
import functools
import json
import math
import os
import stat
from collections import Counter

import torch

from kvconform.reference import Geometry, Layout, bits_dtype, fp8, offset_map
from kvconform.reference import compat_caches as caches
from kvconform.reference import connector as conn
from kvconform.reference import latent
from kvconform.reference import quant_layouts as QL
from kvconform.errors import InputError

SCHEMA = "kvconform-layout/1"
SYMBOLS = ("L", "B", "2", "N", "H", "D", "D/x", "x:d", "N/x", "x:n")
DTYPES = {str(d).removeprefix("torch."): d for d in (torch.bfloat16, torch.float16, torch.float32, *fp8.FP8_DTYPES)}
REQUIRED = ("schema", "dims", "strides", "dtype", "num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size",
            "total_kv_heads", "tp_rank", "tp_size")
# Bounds of the integer fields (a descriptor past them describes no cache any engine allocates,
# and the offsets of one would leave int64): field → largest value.
LIMITS = {"num_layers": 1 << 16, "num_blocks": 1 << 40, "block_size": 1 << 20, "num_kv_heads": 1 << 16, "head_size": 1 << 16,
          "total_kv_heads": 1 << 16, "tp_size": 1 << 16, "tp_rank": (1 << 16) - 1, "block_pad": 1 << 32}
MAX_CACHE_BYTES = 1 << 60
# Each logical coordinate of an element is addressed by one symbol, or by one (outer, inner) pair
# of a tiled dim; a side of a descriptor must spell each exactly once ("L" only with layers).
SPELLINGS = {"block": (("B",),), "kv": (("2",),), "slot": (("N",), ("N/x", "x:n")), "head": (("H",),), "dim": (("D",), ("D/x", "x:d"))}


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


def describe_latent(geometry: latent.LatentGeometry, *, tp_rank: int = 0, tp_size: int = 1, k_scale: float | None = None,
                    **identity) -> dict:
    """The descriptor of one rank's latent cache (a replica: no heads). ``k_scale``: the plain MLA
    fp8 cache's per-tensor scale (default 1.0 there; None on every other format)."""
    fmt = geometry.fmt
    fp8_entries = fmt.kind == "mla" and fmt.cache_dtype != "auto"
    descriptor = {
        "schema": SCHEMA, **identity, "cache": caches.latent_section(fmt), "kv_cache_dtype": fmt.cache_dtype,
        "k_scale": float(1.0 if k_scale is None else k_scale) if fp8_entries else None, "v_scale": None,
        "num_layers": geometry.num_layers, "num_blocks": geometry.num_blocks, "block_size": geometry.block_size,
        "tp_rank": tp_rank, "tp_size": tp_size,
    }
    parse(descriptor)
    return descriptor


def describe_quant(g: QL.QuantGeometry, *, tp_rank: int = 0, tp_size: int = 1, total_kv_heads: int | None = None,
                   k_scale: float | None = None, v_scale: float | None = None,
                   platform: str = "cpu", arch: str = "", **identity) -> dict:
    """The descriptor of one rank's quantised cache (``g.num_kv_heads`` = this rank's heads; nvfp4's
    V-scale placement ``g.v_scales``, NVFP4-SCALE-PLACEMENT); ``platform``/``arch`` decide fp8 codes."""
    nvfp4 = g.mode == QL.NVFP4
    descriptor = {
        "schema": SCHEMA, **identity, "platform": platform, "arch": arch,
        "cache": caches.quant_section(g.mode, g.order, caches.quant_codes(g.mode, platform, arch), g.v_scales), "kv_cache_dtype": g.mode,
        "k_scale": float(1.0 if k_scale is None else k_scale) if nvfp4 else None,
        "v_scale": float(1.0 if v_scale is None else v_scale) if nvfp4 else None,
        "num_layers": g.num_layers, "num_blocks": g.num_blocks, "block_size": g.block_size,
        "num_kv_heads": g.num_kv_heads, "head_size": g.head_size,
        "total_kv_heads": total_kv_heads or g.num_kv_heads * tp_size, "tp_rank": tp_rank, "tp_size": tp_size,
    }
    parse(descriptor)
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

    def cache_text(self) -> str:
        return "a K/V cache"


AnyEndpoint = Endpoint | caches.LatentEndpoint | caches.QuantEndpoint


def _integer(d: dict, name: str, source: str, smallest: int = 1) -> int:
    value = d.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or not smallest <= value <= LIMITS[name]:
        raise DescriptorError(f"{source}: field {name!r} must be an integer in [{smallest}, {LIMITS[name]}], got {value!r}")
    return value


def _dims(d: dict, name: str, source: str) -> tuple[str, ...]:
    """A side's physical dims: known symbols, each logical coordinate addressed exactly once."""
    value = d.get(name)
    if not isinstance(value, list) or any(not isinstance(s, str) or s not in SYMBOLS for s in value):
        raise DescriptorError(f"{source}: field {name!r} must list dimension symbols out of {list(SYMBOLS)}, got {value!r}")
    repeated = sorted(s for s, n in Counter(value).items() if n > 1)
    if repeated:
        raise DescriptorError(f"{source}: field {name!r} lists {repeated} more than once: {value!r}")
    if "2" not in value:
        raise DescriptorError(f"{source}: field {name!r} has no K/V dimension '2' (K and V would share every address): {value!r}")
    for coordinate, spellings in SPELLINGS.items():
        used = [sp for sp in spellings if any(s in value for s in sp)]
        if len(used) != 1 or not all(s in value for s in used[0]):
            wanted = " or ".join("+".join(sp) for sp in spellings)
            raise DescriptorError(f"{source}: field {name!r} must address the {coordinate} coordinate exactly once ({wanted}), got {value!r}")
    return tuple(value)


def _scale(d: dict, name: str, fp8_cache: bool, source: str) -> float:
    value = d.get(name)
    if not fp8_cache:
        if value is not None:
            raise DescriptorError(f"{source}: {name} is for fp8 caches; a {d['dtype']} cache has none (null), got {value!r}")
        return 1.0
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise DescriptorError(f"{source}: an fp8 cache needs a finite positive {name}, got {value!r}")
    return float(value)


def parse(d: dict, source: str = "descriptor") -> AnyEndpoint:
    """Validate a descriptor and build its reference layout; DescriptorError names what is wrong.

    Schema: the fields of docs/CONNECTOR.md, integers positive and bounded (``LIMITS``), every
    side's dims addressing each logical coordinate exactly once (one K/V dimension ``2``), dense
    strides, K and V elements at distinct addresses, finite positive scales on fp8 caches (null
    on others), and ``num_kv_heads`` what the rank holds of ``total_kv_heads``. A descriptor with
    a ``cache`` section is validated by :func:`compat_caches.parse_section` instead of the K/V fields."""
    if not isinstance(d, dict):
        raise DescriptorError(f"{source}: a descriptor is a JSON object, got {type(d).__name__}")
    if d.get("schema") != SCHEMA:
        raise DescriptorError(f"{source}: schema {d.get('schema')!r} is not {SCHEMA!r}; produce it with this kvconform version")
    if d.get("cache") is not None:
        return _parse_section(d, source)
    missing = [f for f in REQUIRED if f not in d]
    if missing:
        raise DescriptorError(f"{source}: missing field(s) {', '.join(missing)}")
    if not isinstance(d["dtype"], str) or d["dtype"] not in DTYPES:
        raise DescriptorError(f"{source}: dtype {d['dtype']!r} is not one of {sorted(DTYPES)}")
    dtype = DTYPES[d["dtype"]]
    if (d.get("fp8_format") or None) != (d["dtype"] if dtype in fp8.FP8_DTYPES else None):
        raise DescriptorError(f"{source}: fp8_format {d.get('fp8_format')!r} does not match dtype {d['dtype']!r}")
    ints = {f: _integer(d, f, source) for f in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_size", "total_kv_heads", "tp_size")}
    ints["tp_rank"] = _integer(d, "tp_rank", source, smallest=0)
    ints["block_pad"] = _integer(d, "block_pad", source, smallest=0) if d.get("block_pad") is not None else 0
    if ints["tp_rank"] >= ints["tp_size"]:
        raise DescriptorError(f"{source}: tp_rank {ints['tp_rank']} is not a rank of tp_size {ints['tp_size']}")
    k_dims = _dims(d, "dims", source)
    v_dims = _dims(d, "v_dims", source) if d.get("v_dims") is not None else k_dims
    if ("L" in k_dims) != ("L" in v_dims):
        raise DescriptorError(f"{source}: dims {list(k_dims)} and v_dims {list(v_dims)} disagree on the layer dimension")
    try:
        g = Geometry(num_blocks=ints["num_blocks"], block_size=ints["block_size"], num_kv_heads=ints["num_kv_heads"],
                     head_size=ints["head_size"], dtype=dtype, num_layers=ints["num_layers"])
        layout = Layout(era=str(d.get("era") or "DESC"), alias=str(d.get("alias") or "descriptor"), k_dims=k_dims, v_dims=v_dims,
                        native=tuple((s,) for s in k_dims), block_pad=ints["block_pad"])
        layout.validate(g)
        heads = conn.rank_heads(ints["total_kv_heads"], ints["tp_size"], ints["tp_rank"])
    except ValueError as exc:
        raise DescriptorError(f"{source}: {exc}") from exc
    if layout.nbytes(g) > MAX_CACHE_BYTES:
        raise DescriptorError(f"{source}: the cache would span {layout.nbytes(g)} bytes, past the {MAX_CACHE_BYTES} a descriptor may describe")
    for side, dims, key in ((0, k_dims, "strides"), (1, v_dims, "v_strides")):
        if side and d.get("v_dims") is None:
            continue
        _check_strides(d, layout, g, side, dims, key, source)
    _check_distinct_addresses(layout, g, source)
    if len(heads) != g.num_kv_heads:
        raise DescriptorError(f"{source}: tp_rank {ints['tp_rank']} of {ints['tp_size']} holds {len(heads)} of the "
                              f"{ints['total_kv_heads']} KV heads, but num_kv_heads is {g.num_kv_heads}")
    is_fp8 = dtype in fp8.FP8_DTYPES
    scales = [_scale(d, name, is_fp8, source) for name in ("k_scale", "v_scale")]
    label = d.get("label") or " ".join(str(x) for x in (d.get("backend"), d.get("layout") or layout.name) if x)
    return Endpoint(layout, g, ints["tp_rank"], ints["tp_size"], ints["total_kv_heads"], scales[0], scales[1], str(label))


SECTION_REQUIRED = ("schema", "cache", "num_layers", "num_blocks", "block_size", "tp_rank", "tp_size")


def _parse_section(d: dict, source: str) -> caches.LatentEndpoint | caches.QuantEndpoint:
    missing = [f for f in SECTION_REQUIRED if f not in d]
    if missing:
        raise DescriptorError(f"{source}: missing field(s) {', '.join(missing)}")
    ints = {f: _integer(d, f, source) for f in ("num_layers", "num_blocks", "block_size", "tp_size")}
    ints["tp_rank"] = _integer(d, "tp_rank", source, smallest=0)
    ints |= {f: _integer(d, f, source) for f in caches.HEAD_FIELDS if d.get(f) is not None}
    if ints["tp_rank"] >= ints["tp_size"]:
        raise DescriptorError(f"{source}: tp_rank {ints['tp_rank']} is not a rank of tp_size {ints['tp_size']}")
    try:
        endpoint = caches.parse_section(d, ints)
        heads = endpoint.heads if isinstance(endpoint, caches.QuantEndpoint) else None
    except ValueError as exc:
        raise DescriptorError(f"{source}: {exc}") from exc
    if endpoint.geometry.nbytes() > MAX_CACHE_BYTES:
        raise DescriptorError(f"{source}: the cache would span {endpoint.geometry.nbytes()} bytes, past the {MAX_CACHE_BYTES} a descriptor may describe")
    if heads is not None and len(heads) != ints["num_kv_heads"]:
        raise DescriptorError(f"{source}: tp_rank {ints['tp_rank']} of {ints['tp_size']} holds {len(heads)} of the "
                              f"{ints['total_kv_heads']} KV heads, but num_kv_heads is {ints['num_kv_heads']}")
    return endpoint


def _check_distinct_addresses(layout: Layout, g: Geometry, source: str) -> None:
    """Every element of a small cache of this layout at its own address inside the allocation
    (K and V sides of a tiled layout may not overlap)."""
    if not _distinct_addresses(layout.k_dims, layout.v_dims, layout.block_pad, g.dtype):
        raise DescriptorError(f"{source}: dims {list(layout.k_dims)} and v_dims {list(layout.v_dims)} put two elements at one address")


@functools.lru_cache(maxsize=4096)
def _distinct_addresses(k_dims: tuple, v_dims: tuple, block_pad: int, dtype: torch.dtype) -> bool:
    layout = Layout(era="DESC", alias="probe", k_dims=k_dims, v_dims=v_dims, native=tuple((s,) for s in k_dims), block_pad=block_pad)
    x = Geometry(num_blocks=1, block_size=1, num_kv_heads=1, head_size=1, dtype=dtype).x
    probe = Geometry(num_blocks=2, block_size=2 * x, num_kv_heads=2, head_size=2 * x, dtype=dtype, num_layers=2 if "L" in k_dims else 1)
    offsets = offset_map(layout, probe).flatten()
    return torch.unique(offsets).numel() == offsets.numel() and int(offsets.max()) < layout.numel(probe)


def _check_strides(d, layout, g, side, dims, key, source):
    given = d.get(key)
    want = layout.strides(g, side)
    if not isinstance(given, dict) or set(given) != set(dims) or any(not isinstance(v, int) or isinstance(v, bool) for v in given.values()):
        raise DescriptorError(f"{source}: field {key!r} must give the element stride of each of {list(dims)}, got {given!r}")
    for symbol in dims:
        if given[symbol] != want[symbol]:
            raise DescriptorError(f"{source}: {key}[{symbol!r}] is {given[symbol]!r}, but dims {list(dims)} (dense, block_pad "
                                  f"{layout.block_pad}) put it at {want[symbol]}; kvconform descriptors describe dense layouts")


DESCRIPTOR_FILE_LIMIT = 64 << 20  # bytes: a descriptor is about 1 KiB, one per TP rank


def load(path: str, role: str | None = None) -> list[dict]:
    """The descriptors in a file (one object, or a list of them: one per TP rank), validated.

    A list holds ranks of one TP group (the same ``tp_size`` and model), each once. The
    producer side (``role="producer"``) must describe every rank: a consumer head whose holders
    are all missing would have no source."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opened so does not wait for a writer
        with open(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):  # /dev/zero would be read without end
                raise DescriptorError(f"{path}: not a regular file; expected a layout descriptor file")
            raw = fh.read(DESCRIPTOR_FILE_LIMIT + 1)
        if len(raw) > DESCRIPTOR_FILE_LIMIT:
            raise DescriptorError(f"{path}: larger than {DESCRIPTOR_FILE_LIMIT} bytes; expected a layout descriptor file")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DescriptorError(f"{path}: not a readable descriptor file ({exc})") from exc
    if isinstance(data, list) and not data:
        raise DescriptorError(f"{path}: an empty list describes no rank; give one descriptor per TP rank")
    descriptors = data if isinstance(data, list) else [data]
    endpoints = [parse(d, f"{path}[{i}]" if isinstance(data, list) else path) for i, d in enumerate(descriptors)]
    check_group(endpoints, path, complete=role == "producer")
    return descriptors


def check_group(endpoints: list[AnyEndpoint], source: str, complete: bool) -> None:
    """Ranks of one TP group, each once (and, when ``complete``, every rank of it)."""
    first = endpoints[0]
    for e in endpoints[1:]:
        if type(e) is not type(first):
            raise DescriptorError(f"{source}: rank {e.tp_rank} describes {e.cache_text()}, rank {first.tp_rank} "
                                  f"{first.cache_text()}: one file describes one TP group")
        if (e.tp_size, _model_heads(e)) != (first.tp_size, _model_heads(first)):
            raise DescriptorError(f"{source}: rank {e.tp_rank} is of TP {e.tp_size} over {e.total_kv_heads} KV heads, rank "
                                  f"{first.tp_rank} of TP {first.tp_size} over {first.total_kv_heads}: one file describes one TP group")
    ranks = Counter(e.tp_rank for e in endpoints)
    twice = sorted(r for r, n in ranks.items() if n > 1)
    if twice:
        raise DescriptorError(f"{source}: rank(s) {twice} described more than once")
    missing = [r for r in range(first.tp_size) if r not in ranks]
    if complete and missing:
        total = _model_heads(first)
        orphans = [] if total is None else sorted({h for r in missing for h in conn.rank_heads(total, first.tp_size, r)} -
                                                  {h for e in endpoints if not isinstance(e, caches.LatentEndpoint) for h in e.heads})
        lost = f": model heads {orphans} would have no source" if orphans else ""
        raise DescriptorError(f"{source}: the producer is TP {first.tp_size}, but rank(s) {missing} are not described{lost}; "
                              f"describe every producer rank (a list, one per rank)")


def _model_heads(e: AnyEndpoint) -> int | None:
    """The model's KV heads (None for a latent cache: replicated, no heads)."""
    return None if isinstance(e, caches.LatentEndpoint) else e.total_kv_heads


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
    limits: tuple[str, ...] = ()  # known engines that refuse this pairing, for people

    @property
    def identical(self) -> bool:
        """No conversion at all: the consumer receives the producer's bytes."""
        return self.mode == "regions"

    @property
    def sends(self) -> bool:
        """This producer rank contributes heads to this consumer rank."""
        return bool(self.slices)

    def lines(self) -> list[str]:
        out = []
        for s in self.slices:
            regions = ""
            if self.mode == "regions":
                count = len(conn.byte_regions(self.producer.layout, self.producer.geometry, [0], s.producer_heads))
                regions = f", {count} region{'s' if count != 1 else ''} per block"
            out.append(f"{s.text(self.consumer.tp_rank)} ({self.mode}{regions})")
        if not self.slices:
            out.append(self._nothing_to_send())
        out += [f"convert: {c}" for c in self.conversions]
        out += [f"limit: {limit}" for limit in self.limits]
        return out

    def _nothing_to_send(self) -> str:
        p, c = self.producer, self.consumer
        replicas = [h for h in c.heads if h in p.heads]
        if not replicas:
            return f"producer rank {p.tp_rank} holds none of consumer rank {c.tp_rank}'s heads: nothing to send"
        sources = sorted({conn.head_source(p.total_kv_heads, p.tp_size, c.tp_size, c.tp_rank, h) for h in replicas})
        return (f"producer rank {p.tp_rank} holds a replica of model head(s) {_heads_text(replicas)} of consumer rank {c.tp_rank}; "
                f"the default pairing (vLLM's) takes them from producer rank(s) {', '.join(map(str, sources))}: nothing to send from this rank "
                f"(any replica would do)")


@dataclasses.dataclass(frozen=True)
class Verdict:
    compatible: bool
    reason: str | None = None  # the first mismatch, one sentence
    kind: str | None = None  # what mismatched: layers | head_size | heads | dtype | cache (a cache section field: its name)
    plan: Plan | caches.LatentPlan | caches.QuantPlan | None = None

    @property
    def summary(self) -> str:
        if not self.compatible:
            return f"incompatible: {self.reason}"
        if self.plan is None:
            raise ValueError("a compatible verdict without its plan (check makes both together)")
        if not self.plan.sends:
            return "compatible: nothing to send"
        return "compatible: identical bytes" if self.plan.identical else f"compatible: converted ({', '.join(self.plan.steps)})"

    @property
    def limits(self) -> tuple[str, ...]:
        """Known engines that refuse this pairing although the bytes would land exactly."""
        return self.plan.limits if self.plan else ()

    def __str__(self) -> str:
        return "\n".join([self.summary] + (["  " + line for line in self.plan.lines()] if self.plan else []))


def check(producer: dict, consumer: dict) -> Verdict:
    """May the producer rank's blocks land, exactly, in the consumer rank? (the first mismatch, or the plan)"""
    p, c = parse(producer, "producer"), parse(consumer, "consumer")
    if not (isinstance(p, Endpoint) and isinstance(c, Endpoint)):
        return _check_sections(p, c)
    gp, gc = p.geometry, c.geometry
    if gp.num_layers != gc.num_layers:
        return Verdict(False, f"the producer's cache holds {gp.num_layers} layers, the consumer's {gc.num_layers}", "layers")
    mismatch = caches.heads_mismatch(p, c)
    if mismatch:
        return Verdict(False, *mismatch)
    ratios = (value_ratio(p.k_scale, c.k_scale), value_ratio(p.v_scale, c.v_scale))
    for kv, ratio in enumerate(ratios):
        code = conn.inexact_code(gp.dtype, gc.dtype, ratio)
        if code is not None:
            return Verdict(False, _inexact_reason(p, c, kv, ratio, code), "dtype")
    slices = caches.producer_slices(p, c)
    steps = {}
    if (p.layout.k_dims, p.layout.v_dims) != (c.layout.k_dims, c.layout.v_dims):
        steps["layout"] = f"layout {p.layout.name} → {c.layout.name}"
    if gp.dtype != gc.dtype or ratios != (1.0, 1.0):
        steps["dtype"] = _conversion_text(p, c, ratios)
    if gp.block_size != gc.block_size:
        steps["re-block"] = f"re-block {gp.block_size} → {gc.block_size} tokens per block"
    mode = "wire" if steps else "regions"
    return Verdict(True, plan=Plan(p, c, slices, mode, tuple(steps), tuple(steps.values()), ratios, engine_limits(p, c)))


def _check_sections(p: AnyEndpoint, c: AnyEndpoint) -> Verdict:
    """A latent or quantised cache on either side: the same kind of cache, then its section's rules."""
    if type(p) is not type(c) or isinstance(p, Endpoint) or isinstance(c, Endpoint):
        return Verdict(False, f"the producer's cache is {p.cache_text()}, the consumer's {c.cache_text()}: their bytes mean different things", "cache")
    judged = caches.judge(p, c)
    if isinstance(judged, caches.Refusal):
        return Verdict(False, judged.reason, judged.kind)
    return Verdict(True, plan=judged)


def value_ratio(producer_scale: float, consumer_scale: float) -> float:
    """``producer_scale / consumer_scale``: what a value is multiplied by to keep its dequantised
    value. A quotient that is not exactly a float (0.3 / 0.1) keeps no non-zero value exactly;
    it is returned as NaN, which :func:`kvconform.reference.connector.convert` treats so."""
    ratio = producer_scale / consumer_scale
    exact = fractions.Fraction(producer_scale) / fractions.Fraction(consumer_scale)
    return ratio if math.isfinite(ratio) and fractions.Fraction(ratio) == exact else math.nan


def engine_limits(p: Endpoint, c: Endpoint) -> tuple[str, ...]:
    """Known engines' refusals of a TP pairing whose bytes would land exactly (vLLM 0.33.0)."""
    P, D, K = p.tp_size, c.tp_size, p.total_kv_heads
    if max(P, D) % min(P, D):
        return (f"vLLM 0.33.0's connectors (NIXL, Mooncake, MoRIIO) need one TP size to divide the other; TP {P} → {D} does not",)
    if P > D and P > K:
        return (f"vLLM 0.33.0's NIXL connector refuses TP {P} → {D} over {K} KV heads (the producer replicates heads and "
                f"has more ranks than the consumer: nixl/base_worker.py); Mooncake and MoRIIO read each head from its first replica, as planned",)
    return ()


def _heads_text(heads) -> str:
    heads = list(heads)
    return f"{heads[0]}..{heads[-1]}" if heads == list(range(heads[0], heads[-1] + 1)) and len(heads) > 1 else ", ".join(map(str, heads))


def _inexact_reason(p: Endpoint, c: Endpoint, kv: int, ratio: float, code: int) -> str:
    src, dst = _dtype_name(p.geometry.dtype), _dtype_name(c.geometry.dtype)
    value = float(conn.decode_values(torch.tensor([code]).to(bits_dtype(p.geometry.dtype)), p.geometry.dtype)[0])
    scaled = fp8.FP8_DTYPES & {p.geometry.dtype, c.geometry.dtype}
    shown = f"{ratio:g}" if math.isfinite(ratio) else f"{p.scale(kv)!r}/{c.scale(kv)!r}, not a float"
    scales = f" at {'kv'[kv]}_scale {p.scale(kv):g} → {c.scale(kv):g} (value ratio {shown})" if scaled else ""
    becomes = f"{value * ratio:g}" if math.isfinite(ratio) else f"{value:g}·{p.scale(kv)!r}/{c.scale(kv)!r}"
    return f"{src} → {dst} is not exact{scales}: {src} code 0x{code:0{2 * p.geometry.element_size}x} ({value:g}) becomes {becomes}, which {dst} cannot hold"


def _conversion_text(p: Endpoint, c: Endpoint, ratios) -> str:
    src, dst = _dtype_name(p.geometry.dtype), _dtype_name(c.geometry.dtype)
    if ratios == (1.0, 1.0):
        return f"{src} → {dst} (every value exact)"
    return f"{src} → {dst}, values × {ratios[0]:g} (K) / × {ratios[1]:g} (V): scales {p.k_scale:g}/{p.v_scale:g} → {c.k_scale:g}/{c.v_scale:g}, every value exact"


def check_ranks(producers: list[dict], consumers: list[dict]) -> list[list[Verdict]]:
    """``check`` for every (consumer rank, producer rank) pair, consumer ranks outermost. The
    producers must be every rank of one TP group, the consumers ranks of one (DescriptorError)."""
    for side, descriptors in (("producer", producers), ("consumer", consumers)):
        if not descriptors:
            raise DescriptorError(f"{side}: no descriptor given")
        check_group([parse(d, f"{side}[{i}]") for i, d in enumerate(descriptors)], side, complete=side == "producer")
    return [[check(p, c) for p in producers] for c in consumers]


# ----------------------------------------------------------------------------- executing a plan
def execute(plan: Plan | caches.LatentPlan | caches.QuantPlan, producer_storage: torch.Tensor, producer_blocks,
            consumer_storage: torch.Tensor, consumer_blocks, num_tokens: int | None = None) -> None:
    """Move the plan's heads of ``producer_blocks`` into ``consumer_blocks`` with the reference ops.

    Regions mode ships whole blocks (block ``producer_blocks[i]`` → ``consumer_blocks[i]``);
    wire mode ships the first ``num_tokens`` tokens of the sequence (default: every token of
    the producer's blocks), re-blocked into the consumer's block table. Latent and quantised
    caches' plans execute themselves (``compat_caches``).
    """
    if not isinstance(plan, Plan):
        plan.execute(producer_storage, producer_blocks, consumer_storage, consumer_blocks, num_tokens)
        return
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
