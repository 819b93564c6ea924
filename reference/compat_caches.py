"""The optional ``cache`` section of a ``kvconform.compat`` descriptor: latent (MLA) caches and
quantised caches whose scales live in the page. Without it a descriptor is a K/V cache
(:mod:`kvconform.reference.compat`); with it, these functions validate the section, judge a pair
of peers and plan the transfer.

- ``"kind": "latent"`` (SPEC LATENT-TP-SOURCE, LATENT-COMPAT): the record format
  (``latent.record_descriptor``) must be equal on both sides; the latent is replicated, so it
  has no heads and no head slice, and consumer rank ``d`` takes whole blocks of every layer from
  exactly one producer rank, ``⌊d·P/D⌋``.
- ``"kind": "quant"`` (PTH-*, NVFP4-*): the mode, code format and K scale placement must be
  equal; a head slice moves as ``head_slice_ranges`` — its scale bytes with its data — and another
  order, block size or nvfp4 V-scale placement (swizzled or linear, NVFP4-SCALE-PLACEMENT) is
  converted field by field through both offset maps (each scale byte to its slot's place: exact).

Every byte range comes from the reference's offset maps (``latent.block_byte_ranges``,
``quant_layouts.field_offsets`` / ``head_slice_ranges``); none is computed here.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from kvconform.reference import connector as conn
from kvconform.reference import latent
from kvconform.reference.latent_layout import MODEL_DTYPES as LATENT_MODEL_DTYPES
from kvconform.reference import quant_layouts as QL
from kvconform.reference.quant_codecs import code_dtype

KINDS = ("latent", "quant")
# The fields of a LatentFormat a latent section names (its record is derived from them).
FORMAT_FIELDS = ("kind", "kv_lora_rank", "rope_dim", "cache_dtype", "scale_format", "indexer_layout", "model_dtype", "platform", "arch")
MODEL_DTYPES = {str(d).removeprefix("torch."): d for d in LATENT_MODEL_DTYPES}
QUANT_CODES = {"int8_per_token_head": ("int8",), "fp8_per_token_head": ("float8_e4m3fn", "float8_e4m3fnuz"), QL.NVFP4: ("e2m1",)}
# Section fields whose difference no conversion bridges (the same bytes would mean other values).
QUANT_REFUSED = ("mode", "codes", "scale_dtype", "scale_granularity", "scale_placement", "k_scales")
# Top-level fields of a K/V descriptor that a section descriptor leaves out: its offset map places every byte.
KV_ONLY = ("dims", "strides", "v_dims", "v_strides", "tile", "block_pad", "dtype", "fp8_format")
HEAD_FIELDS = ("num_kv_heads", "head_size", "total_kv_heads")


# ----------------------------------------------------------------------------- sections
def latent_section(fmt: latent.LatentFormat) -> dict:
    """The ``cache`` section of a latent cache: its format and the record it stores."""
    fields = {name: getattr(fmt, name) for name in FORMAT_FIELDS}
    fields["model_dtype"] = str(fmt.model_dtype).removeprefix("torch.")
    return {"kind": "latent", "format": fields, "record": latent.record_descriptor(fmt)}


def quant_codes(mode: str, platform: str = "cpu", arch: str = "") -> str:
    """What a code byte holds: int8, the platform's e4m3 (fp8 per token-head), or two e2m1 (nvfp4)."""
    if mode == QL.NVFP4:
        return "e2m1"
    return str(code_dtype(mode, platform, arch)).removeprefix("torch.")


def quant_section(mode: str, order: str, codes: str, v_scales: str | None = "swizzled") -> dict:
    """The ``cache`` section of a quantised cache: mode, order, code format and scale placement
    (PTH-SCALE-PLACE: one float32 inline per (side, head, slot); NVFP4-PAGE: e4m3 block scales in
    the page, K's linear, V's swizzled or linear), with the block and head size multiples the mode needs."""
    nvfp4 = mode == QL.NVFP4
    return {
        "kind": "quant", "mode": mode, "order": order, "codes": codes,
        "scale_dtype": "float8_e4m3fn" if nvfp4 else "float32",
        "scale_granularity": f"per-{QL.NVFP4_GROUP}-values" if nvfp4 else "per-token-head",
        "scale_placement": "page" if nvfp4 else "inline",
        "k_scales": "linear" if nvfp4 else None, "v_scales": v_scales if nvfp4 else None,
        "block_size_multiple": QL.NVFP4_TILE if nvfp4 else 1,
        "head_size_multiple": QL.NVFP4_GROUP * QL.NVFP4_TILE if nvfp4 else QL.SCALE_BYTES,
    }


@dataclasses.dataclass(frozen=True)
class LatentEndpoint:
    """A parsed latent-cache descriptor: one rank's replica of the latent."""

    geometry: latent.LatentGeometry
    scale: float | None  # the plain MLA fp8 cache's per-tensor scale (None: no fp8 entry)
    tp_rank: int
    tp_size: int
    label: str

    @property
    def record(self) -> dict:
        return latent.record_descriptor(self.geometry.fmt)

    def cache_text(self) -> str:
        return f"a latent cache ({self.geometry.fmt.label()})"


@dataclasses.dataclass(frozen=True)
class QuantEndpoint:
    """A parsed quantised-cache descriptor: one rank's heads, codes and scales in the page."""

    geometry: QL.QuantGeometry
    section: dict
    tp_rank: int
    tp_size: int
    total_kv_heads: int
    k_scale: float | None  # nvfp4's second-level scales (None for the per-token-head modes)
    v_scale: float | None
    label: str

    @property
    def heads(self) -> range:
        return conn.rank_heads(self.total_kv_heads, self.tp_size, self.tp_rank)

    def cache_text(self) -> str:
        return f"a quantised cache ({self.geometry.mode}, {self.section['codes']} codes)"


def parse_section(d: dict, ints: dict) -> LatentEndpoint | QuantEndpoint:
    """The endpoint of a descriptor with a ``cache`` section; ``ints`` holds its validated integer
    fields. ValueError names the field and what was expected."""
    section = d["cache"]
    if not isinstance(section, dict) or section.get("kind") not in KINDS:
        raise ValueError(f"field 'cache' must be null (a K/V cache) or an object whose 'kind' is one of {list(KINDS)}, got {section!r}")
    present = [f for f in KV_ONLY if d.get(f) is not None]
    if present:
        raise ValueError(f"field {present[0]!r} describes a K/V cache; a {section['kind']} cache's bytes are placed by its "
                         f"cache section's offset map: give null or leave it out")
    label = str(d.get("label") or " ".join(str(x) for x in (d.get("backend"), d.get("kv_cache_dtype")) if x) or section["kind"])
    if section["kind"] == "latent":
        return _latent_endpoint(d, section, ints, label)
    return _quant_endpoint(d, section, ints, label)


def _latent_endpoint(d: dict, section: dict, ints: dict, label: str) -> LatentEndpoint:
    heads = [f for f in HEAD_FIELDS if d.get(f) is not None]
    if heads:
        raise ValueError(f"a latent cache is replicated on every TP rank and never sliced by head (LATENT-TP-SOURCE): "
                         f"field {heads[0]!r} must be null or absent")
    _exact_keys(section, ("kind", "format", "record"), "cache")
    fields = section["format"]
    if not isinstance(fields, dict) or set(fields) != set(FORMAT_FIELDS):
        raise ValueError(f"field 'cache.format' must give exactly {list(FORMAT_FIELDS)}, got {fields!r}")
    if not isinstance(fields["model_dtype"], str) or fields["model_dtype"] not in MODEL_DTYPES:
        raise ValueError(f"field 'cache.format.model_dtype' must be one of {sorted(MODEL_DTYPES)}, got {fields['model_dtype']!r}")
    try:
        fmt = latent.LatentFormat(**{**fields, "model_dtype": MODEL_DTYPES[fields["model_dtype"]]})
        geometry = latent.LatentGeometry(num_blocks=ints["num_blocks"], block_size=ints["block_size"], fmt=fmt, num_layers=ints["num_layers"])
    except (ValueError, TypeError) as exc:
        raise ValueError(f"field 'cache.format': {exc}") from exc
    differs = first_difference(latent.record_descriptor(fmt), section["record"])
    if differs:
        field, want, got = differs
        raise ValueError(f"field 'cache.record.{field}' is {got!r}, but its format ({fmt.label()}) stores {want!r}")
    fp8_entries = fmt.kind == "mla" and fmt.cache_dtype != "auto"
    scale = per_tensor_scale(d, "k_scale", fp8_entries, f"a plain MLA {fmt.cache_dtype} cache")
    per_tensor_scale(d, "v_scale", False, "a latent cache (its V is the latent)")
    return LatentEndpoint(geometry, scale, ints["tp_rank"], ints["tp_size"], label)


def _quant_endpoint(d: dict, section: dict, ints: dict, label: str) -> QuantEndpoint:
    mode = section.get("mode")
    if mode not in QL.MODES:
        raise ValueError(f"field 'cache.mode' must be one of {list(QL.MODES)}, got {mode!r}")
    if section.get("codes") not in QUANT_CODES[mode]:
        raise ValueError(f"field 'cache.codes' of a {mode} cache must be one of {list(QUANT_CODES[mode])}, got {section.get('codes')!r}")
    if mode == QL.NVFP4 and section.get("v_scales") not in QL.V_SCALE_PLACEMENTS:
        raise ValueError(f"field 'cache.v_scales' of an nvfp4 cache must be one of {list(QL.V_SCALE_PLACEMENTS)}, got {section.get('v_scales')!r}")
    if section.get("order") not in QL.ORDERS:
        raise ValueError(f"field 'cache.order' must be one of {list(QL.ORDERS)}, got {section.get('order')!r}")
    want = quant_section(mode, section["order"], section["codes"], section.get("v_scales"))
    _exact_keys(section, tuple(want), "cache")
    differs = first_difference(want, section)
    if differs:
        field, expected, got = differs
        raise ValueError(f"field 'cache.{field}' is {got!r}, but a {mode} cache has {expected!r}")
    missing = [f for f in HEAD_FIELDS if d.get(f) is None]
    if missing:
        raise ValueError(f"a quantised cache is sliced by head: field {missing[0]!r} is required")
    try:
        geometry = QL.QuantGeometry(num_blocks=ints["num_blocks"], block_size=ints["block_size"], num_kv_heads=ints["num_kv_heads"],
                                    head_size=ints["head_size"], mode=mode, order=section["order"], num_layers=ints["num_layers"],
                                    v_scales=section["v_scales"] or QL.SWIZZLED)
    except ValueError as exc:
        raise ValueError(f"the cache section does not fit the sizes: {exc}") from exc
    nvfp4 = mode == QL.NVFP4
    scales = [per_tensor_scale(d, name, nvfp4, "an nvfp4 cache (its second-level scale)" if nvfp4 else f"a {mode} cache")
              for name in ("k_scale", "v_scale")]
    return QuantEndpoint(geometry, dict(section), ints["tp_rank"], ints["tp_size"], ints["total_kv_heads"], scales[0], scales[1], label)


def _exact_keys(section: dict, keys: tuple, name: str) -> None:
    missing, extra = [k for k in keys if k not in section], sorted(set(section) - set(keys))
    if missing or extra:
        raise ValueError(f"field {name!r} must hold exactly {list(keys)}: " + ", ".join(
            part for part in (f"missing {missing}" if missing else "", f"unknown {extra}" if extra else "") if part))


def per_tensor_scale(d: dict, name: str, required: bool, cache: str) -> float | None:
    """A per-tensor scale: finite and positive where the cache has one, null where it has none."""
    value = d.get(name)
    if not required:
        if value is not None:
            raise ValueError(f"{cache} has no per-tensor {name}: give null, got {value!r}")
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{cache} needs a finite positive {name}, got {value!r}")
    return float(value)


def first_difference(want: dict, got: dict, prefix: str = "") -> tuple[str, object, object] | None:
    """The first field (in ``want``'s order, one level into nested objects) where ``got`` differs."""
    for key, value in want.items():
        other = got.get(key) if isinstance(got, dict) else None
        if isinstance(value, dict) and isinstance(other, dict):
            inner = first_difference(value, other, f"{prefix}{key}.")
            if inner:
                return inner
        elif value != other:
            return f"{prefix}{key}", value, other
    return None


# ----------------------------------------------------------------------------- verdicts and plans
def heads_mismatch(p, c) -> tuple[str, str] | None:
    """Why the heads of two head-sliced caches (K/V or quantised) have no counterparts: (reason, kind), or None."""
    if p.geometry.head_size != c.geometry.head_size:
        return f"head_size {p.geometry.head_size} (producer) differs from {c.geometry.head_size} (consumer): a head has no counterpart", "head_size"
    if p.total_kv_heads != c.total_kv_heads:
        return f"the producer's model has {p.total_kv_heads} KV heads, the consumer's {c.total_kv_heads}", "heads"
    return None


def producer_slices(p, c) -> tuple[conn.HeadSlice, ...]:
    """The head slices consumer rank ``c`` takes from producer rank ``p`` under the default pairing."""
    return tuple(s for s in conn.head_slices(p.total_kv_heads, p.tp_size, c.tp_size, c.tp_rank) if s.producer_rank == p.tp_rank)


@dataclasses.dataclass(frozen=True)
class Refusal:
    reason: str  # one sentence naming the first field that differs
    kind: str


@dataclasses.dataclass(frozen=True)
class LatentPlan:
    """Consumer rank ``d`` takes whole blocks of every layer from producer rank ``source_rank``
    (``⌊d·P/D⌋``); every other producer rank holds a replica and sends nothing."""

    producer: LatentEndpoint
    consumer: LatentEndpoint
    source_rank: int
    mode: str = "regions"
    steps: tuple[str, ...] = ()
    conversions: tuple[str, ...] = ()
    ratios: tuple[float, float] = (1.0, 1.0)
    limits: tuple[str, ...] = ()

    @property
    def sends(self) -> bool:
        return self.producer.tp_rank == self.source_rank

    @property
    def identical(self) -> bool:
        return True

    def regions(self, blocks, heads: range | None = None) -> list[tuple[int, int]]:
        """The producer's byte regions of ``blocks``: whole blocks, every layer (a head slice is refused)."""
        if heads is not None:
            raise ValueError(f"a latent cache is replicated on every TP rank and has no head slice (LATENT-TP-SOURCE); got heads {heads}")
        return latent.block_byte_ranges(self.producer.geometry, blocks) if self.sends else []

    def lines(self) -> list[str]:
        p, c = self.producer, self.consumer
        rule = f"⌊{c.tp_rank}·{p.tp_size}/{c.tp_size}⌋ = {self.source_rank}; the latent is replicated"
        if not self.sends:
            return [f"consumer rank {c.tp_rank} takes every block from producer rank {self.source_rank} ({rule}): nothing to send from this rank"]
        return [f"whole blocks of producer rank {p.tp_rank} → consumer rank {c.tp_rank} (regions, {p.geometry.num_layers} per block: "
                f"one per layer; {rule})"]

    def execute(self, producer_storage: torch.Tensor, producer_blocks, consumer_storage: torch.Tensor, consumer_blocks,
                num_tokens: int | None = None) -> None:
        """Block ``producer_blocks[i]`` → ``consumer_blocks[i]``, whole, every layer (``num_tokens`` is not used: blocks move whole)."""
        if not self.sends:
            return
        if len(producer_blocks) != len(consumer_blocks):
            raise ValueError(f"latent blocks move whole: {len(producer_blocks)} producer blocks, {len(consumer_blocks)} consumer blocks")
        conn.copy_between_regions(producer_storage, latent.block_byte_ranges(self.producer.geometry, producer_blocks),
                                  consumer_storage, latent.block_byte_ranges(self.consumer.geometry, consumer_blocks))


@dataclasses.dataclass(frozen=True)
class QuantPlan:
    """How one producer rank's heads of a quantised cache land in one consumer rank: ``regions``
    (same mode, order and block size: each slice's ``head_slice_ranges``, data and scales, block
    for block) or ``fields`` (another order or block size: every token's codes and scales moved
    through both offset maps, V scales to the consumer's swizzled or linear positions)."""

    producer: QuantEndpoint
    consumer: QuantEndpoint
    slices: tuple[conn.HeadSlice, ...]
    mode: str
    steps: tuple[str, ...]
    conversions: tuple[str, ...]
    ratios: tuple[float, float] = (1.0, 1.0)
    limits: tuple[str, ...] = ()

    @property
    def sends(self) -> bool:
        return bool(self.slices)

    @property
    def identical(self) -> bool:
        return self.mode == "regions"

    def regions(self, blocks, heads: range) -> list[tuple[int, int]]:
        """The producer's byte runs of ``heads`` of ``blocks``, every layer, scales included."""
        return QL.head_slice_ranges(self.producer.geometry, blocks, heads)

    def lines(self) -> list[str]:
        out = []
        for s in self.slices:
            runs = ""
            if self.mode == "regions":
                count = len(QL.head_slice_ranges(self.producer.geometry, [0], s.producer_heads))
                runs = f", {count} run{'s' if count != 1 else ''} per block over every layer, scales included"
            out.append(f"{s.text(self.consumer.tp_rank)} ({self.mode}{runs})")
        if not self.slices:
            out.append(f"the default pairing takes none of consumer rank {self.consumer.tp_rank}'s heads from producer rank "
                       f"{self.producer.tp_rank}: nothing to send")
        return out + [f"convert: {c}" for c in self.conversions]

    def execute(self, producer_storage: torch.Tensor, producer_blocks, consumer_storage: torch.Tensor, consumer_blocks,
                num_tokens: int | None = None) -> None:
        """Regions: block ``producer_blocks[i]`` → ``consumer_blocks[i]``, each slice's runs as one
        stream. Fields: the first ``num_tokens`` tokens (default every token of the producer's
        blocks), token ``t`` from slot ``t mod N₁`` of ``producer_blocks[⌊t/N₁⌋]`` to slot ``t mod N₂``
        of ``consumer_blocks[⌊t/N₂⌋]``."""
        gp, gc = self.producer.geometry, self.consumer.geometry
        src, dst = producer_storage.view(torch.uint8), consumer_storage.view(torch.uint8)
        if self.mode == "regions":
            if len(producer_blocks) != len(consumer_blocks):
                raise ValueError(f"regions mode moves block for block: {len(producer_blocks)} producer blocks, {len(consumer_blocks)} consumer blocks")
            for s in self.slices:
                for pb, cb in zip(producer_blocks, consumer_blocks):
                    conn.copy_between_regions(src, QL.head_slice_ranges(gp, [pb], s.producer_heads),
                                              dst, QL.head_slice_ranges(gc, [cb], s.consumer_heads))
            return
        tokens = len(producer_blocks) * gp.block_size if num_tokens is None else num_tokens
        if tokens > len(consumer_blocks) * gc.block_size or tokens > len(producer_blocks) * gp.block_size:
            raise ValueError(f"{tokens} tokens do not fit {len(producer_blocks)} producer blocks of {gp.block_size} "
                             f"and {len(consumer_blocks)} consumer blocks of {gc.block_size}")
        t = torch.arange(tokens)
        pb, cb = torch.as_tensor(list(producer_blocks))[t // gp.block_size], torch.as_tensor(list(consumer_blocks))[t // gc.block_size]
        for s in self.slices:
            ph, ch = torch.tensor(list(s.producer_heads)), torch.tensor(list(s.consumer_heads))
            for layer in range(gp.num_layers):
                at_p = QL.field_offsets(gp, pb[:, None], (t % gp.block_size)[:, None], ph, layer)
                at_c = QL.field_offsets(gc, cb[:, None], (t % gc.block_size)[:, None], ch, layer)
                for name in QL.FIELDS:
                    dst[at_c[name].to(dst.device)] = src[at_p[name].to(src.device)].to(dst.device)


def judge(p: LatentEndpoint | QuantEndpoint, c: LatentEndpoint | QuantEndpoint) -> Refusal | LatentPlan | QuantPlan:
    """The first difference no exact transfer bridges, or the plan (both sides of one kind)."""
    if p.geometry.num_layers != c.geometry.num_layers:
        return Refusal(f"the producer's cache holds {p.geometry.num_layers} layers, the consumer's {c.geometry.num_layers}", "layers")
    if isinstance(p, LatentEndpoint) and isinstance(c, LatentEndpoint):
        return _judge_latent(p, c)
    if not (isinstance(p, QuantEndpoint) and isinstance(c, QuantEndpoint)):
        raise TypeError(f"sides of two kinds, {type(p).__name__} and {type(c).__name__}: compat.check pairs sides of one kind")
    return _judge_quant(p, c)


def _judge_latent(p: LatentEndpoint, c: LatentEndpoint) -> Refusal | LatentPlan:
    differs = first_difference(p.record, c.record)
    if differs:
        field, theirs, ours = differs
        return Refusal(f"the producer's latent record has {field} {theirs!r}, the consumer's {ours!r} "
                       f"({p.geometry.fmt.label()} vs {c.geometry.fmt.label()}): the same bytes would mean other values (LATENT-COMPAT)", "record")
    if p.scale != c.scale:
        return Refusal(f"the producer's latent k_scale {p.scale:g} differs from the consumer's {c.scale:g}: "
                       f"the fp8 entries would be read at another scale", "scale")
    if p.geometry.block_size != c.geometry.block_size:
        return Refusal(f"block_size {p.geometry.block_size} (producer) differs from {c.geometry.block_size} (consumer): latent blocks "
                       f"move whole (LATENT-BLOCK) and re-blocking a latent cache is not planned", "re-block")
    return LatentPlan(p, c, conn.paired_rank(p.tp_size, c.tp_size, c.tp_rank))


def _judge_quant(p: QuantEndpoint, c: QuantEndpoint) -> Refusal | QuantPlan:
    gp, gc = p.geometry, c.geometry
    mismatch = heads_mismatch(p, c)
    if mismatch:
        return Refusal(*mismatch)
    for field in QUANT_REFUSED:  # every field but v_scales: a placement is a permutation of scale bytes within a page
        if p.section[field] != c.section[field]:
            return Refusal(f"the producer's {gp.mode} cache has {field} {p.section[field]!r}, the consumer's {c.section[field]!r}: "
                           f"the same bytes would mean other values, and no exact conversion is planned", field)
    for name, ps, cs in (("k_scale", p.k_scale, c.k_scale), ("v_scale", p.v_scale, c.v_scale)):
        if ps != cs:
            return Refusal(f"nvfp4's second-level {name} {ps:g} (producer) differs from {cs:g} (consumer): every block scale "
                           f"would need re-encoding, which no exact conversion does", "scale")
    steps = {}
    if gp.order != gc.order:
        steps["layout"] = f"order {gp.order} → {gc.order}, every code and scale byte through both offset maps"
    if gp.block_size != gc.block_size:
        steps["re-block"] = f"re-block {gp.block_size} → {gc.block_size} tokens per block" + (
            ", V scales re-swizzled to their new slots (NVFP4-REBLOCK)" if gc.v_scales == QL.SWIZZLED and gc.mode == QL.NVFP4
            else ", scales with their tokens")
    if gp.v_scales != gc.v_scales:
        steps["v_scales"] = f"V scales {gp.v_scales} → {gc.v_scales}, each to its slot's place (NVFP4-SCALE-PLACEMENT)"
    return QuantPlan(p, c, producer_slices(p, c), "fields" if steps else "regions", tuple(steps), tuple(steps.values()))
