"""The producer × consumer interop row of one endpoint (a backend and one of its layouts).

For each peer endpoint — the built-in reference models, always, and every non-mutant backend of
the run — and each scenario (same TP and block size, TP 1→2 and 2→1, block size 16→32 and
32→16, fp8 with each platform's scales), kvconform.compat judges the two sides' announced
descriptors. A compatible pair is then executed: the producer's blocks, filled through its
declared layout, go out through the producer's own connector ops (its regions or its wire form
where it declares them) and the plan's conversions, and must land in the consumer's cache as
the consumer's declared layout says — byte for byte. The consumer side lands them through the
consumer's own ops too (its regions, its ``import_blocks``) where it declares them. A cell is
*identical*, *converted* (how), *incompatible* (why), *n/a* (a side does not declare what the
scenario needs, or one of its ops raised ``OpUnavailable`` for it) or *fails* (naming what was wrong — a region covered twice, an op that raised).
The endpoint's row is its cells as producer; ``received`` are its cells as consumer of every
endpoint of the reference backend (its own import and regions at work).
"""

from __future__ import annotations

import dataclasses
import functools
import json

import torch

from kvconform.reference import compat
from kvconform import reference as R
from kvconform.backends_under_test import registry
from kvconform.backends_under_test.contract import Backend, CacheSpec, OpUnavailable

from .case import random_bytes
from .connector import model_kv, region_overlaps

REFERENCE_PEERS = ("reference", "reference_gfx942", "reference_e3", "reference_kv_first")
HEAD_SIZE, TOTAL_HEADS, NUM_BLOCKS = 64, 2, 4
BASE_SCALES = (0.5, 0.25)  # k, v checkpoint scales; gfx942 (e4m3fnuz) doubles them, as vLLM does


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    producer_tp: int = 1
    consumer_tp: int = 1
    producer_n: int = 16
    consumer_n: int = 16
    kv_cache_dtype: str = "auto"

    def side(self, producer: bool) -> tuple[int, int, str]:
        return (self.producer_tp, self.producer_n, self.kv_cache_dtype) if producer else (self.consumer_tp, self.consumer_n, self.kv_cache_dtype)


SCENARIOS = (
    Scenario("same"), Scenario("tp1to2", consumer_tp=2), Scenario("tp2to1", producer_tp=2),
    Scenario("N16to32", consumer_n=32), Scenario("N32to16", producer_n=32), Scenario("fp8", kv_cache_dtype="fp8"),
)


def side_key(tp: int, block_size: int, kv_cache_dtype: str) -> str:
    return f"tp{tp}-N{block_size}-{kv_cache_dtype}"


@dataclasses.dataclass(frozen=True)
class Endpoint:
    backend: Backend
    layout: R.Layout

    @property
    def label(self) -> str:
        return f"{self.backend.name} {self.layout.era}:{self.layout.alias}"

    @property
    def platform(self) -> str:
        arch = self.backend.arch()
        return f"{self.backend.platform}{'-' + arch if arch else ''}"


@functools.cache
def _reference_peer(name: str) -> Backend:
    return registry.load(name).backend


def peer_endpoints(loaded: dict) -> list[Endpoint]:
    """The reference models and every non-mutant backend of the run that loaded, each layout."""
    backends = {name: _reference_peer(name) for name in REFERENCE_PEERS}
    for name, entry in loaded.items():
        if entry.backend is not None and not name.startswith((registry.MUTANT_PREFIX, registry.FAULT_PREFIX)):
            backends.setdefault(name, entry.backend)
    return [Endpoint(b, layout) for b in backends.values() for layout in b.capabilities.layouts]


def geometry(endpoint: Endpoint, tp: int, block_size: int, kv_cache_dtype: str) -> tuple[R.Geometry, torch.dtype] | str:
    """The endpoint's one-layer geometry for a scenario side, or why it has none."""
    caps = endpoint.backend.capabilities
    heads = len(R.connector.rank_heads(TOTAL_HEADS, tp, 0))
    for what, value, declared in (("kv_cache_dtype", kv_cache_dtype, caps.kv_cache_dtypes), ("block_size", block_size, caps.block_sizes),
                                  ("head_size", HEAD_SIZE, caps.head_sizes), ("num_kv_heads", heads, caps.num_kv_heads)):
        if value not in declared:
            return f"{endpoint.label} does not declare {what} {value}"
    model_dtype = torch.bfloat16 if torch.bfloat16 in caps.dtypes else caps.dtypes[0]
    g = R.Geometry(num_blocks=NUM_BLOCKS, block_size=block_size, num_kv_heads=heads, head_size=HEAD_SIZE,
                   dtype=endpoint.backend.cache_dtype(kv_cache_dtype, model_dtype))
    try:
        endpoint.layout.validate(g)
    except ValueError as exc:
        return f"{endpoint.label}: {exc}"
    return g, model_dtype


def scales(g: R.Geometry) -> tuple[float, float]:
    factor = 2.0 if g.dtype == torch.float8_e4m3fnuz else 1.0
    return BASE_SCALES[0] * factor, BASE_SCALES[1] * factor


@dataclasses.dataclass
class Rank:
    """One TP rank of an endpoint for one scenario side: its spec, cache (over ``buffer``) and descriptor."""

    spec: CacheSpec
    buffer: torch.Tensor
    cache: torch.Tensor
    descriptor: dict


def ranks(endpoint: Endpoint, tp: int, block_size: int, kv_cache_dtype: str, seed: int, device: str = "cpu") -> list[Rank] | str:
    """Every TP rank of the endpoint, allocated by its backend over random bytes on ``device``,
    with the descriptor its backend announces; or why the endpoint cannot play this side."""
    found = geometry(endpoint, tp, block_size, kv_cache_dtype)
    if isinstance(found, str):
        return found
    g, model_dtype = found
    out = []
    for rank in range(tp):
        spec = CacheSpec(layout=endpoint.layout, geometry=g, kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype)
        gen = torch.Generator().manual_seed(seed + rank)
        buffer = random_bytes(endpoint.layout.nbytes(g), gen).to(device)
        cache = endpoint.backend.allocate(buffer, spec)
        k_scale, v_scale = scales(g)
        descriptor = endpoint.backend.layout_descriptor(cache, spec, tp_rank=rank, tp_size=tp, total_kv_heads=TOTAL_HEADS, k_scale=k_scale, v_scale=v_scale)
        out.append(Rank(spec, buffer, cache, descriptor))
    return out


@functools.cache
def consumer_side(endpoint: Endpoint, tp: int, block_size: int, kv_cache_dtype: str, device: str = "cpu"):
    """A peer as consumer: its ranks on ``device``, where its own ops (or the reference's) land
    the blocks (cached per process: peers are the same for every row)."""
    return ranks(endpoint, tp, block_size, kv_cache_dtype, seed=4242, device=device)


def consumer_key(endpoint: Endpoint, scenario: Scenario):
    """What decides a cell on the consumer side: whether it takes connectors, and what it announces."""
    side = consumer_side(endpoint, *scenario.side(False))
    announced = side if isinstance(side, str) else tuple(
        json.dumps({k: v for k, v in r.descriptor.items() if k not in IDENTITY}, sort_keys=True) for r in side)
    return gated(endpoint), announced, tuple(endpoint.layout.k_dims), tuple(endpoint.layout.v_dims)


IDENTITY = ("backend", "platform", "arch", "layout", "era", "alias", "label")


def endpoint_record(endpoint: Endpoint, sides: dict) -> dict:
    """What the reports need to place this endpoint and judge it against other machines' endpoints."""
    return {"label": endpoint.label, "backend": endpoint.backend.name, "platform": endpoint.platform, "layout": str(endpoint.layout),
            "connector": gated(endpoint) is None, "mutant": bool(getattr(endpoint.backend, "catches", None)),
            "scenarios": [dataclasses.asdict(s) for s in SCENARIOS], "descriptors": sides}


@functools.cache  # the reference models derive supports_kv_connector() from their layouts: not free
def gated(endpoint: Endpoint) -> str | None:
    if not endpoint.backend.supports_kv_connector():
        return f"{endpoint.backend.name} does not support KV connectors (supports_kv_connector() is False)"
    return None


def evaluate(producer: Endpoint, consumer: Endpoint, scenario: Scenario, producer_ranks, seed: int, device: str = "cpu") -> dict:
    """One cell: ``{"outcome", "detail"}``; executes compatible plans with each side's own ops."""
    why = gated(producer) or gated(consumer)
    if why:
        return {"outcome": "incompatible", "detail": why}
    consumers = consumer_side(consumer, *scenario.side(False), device)
    for side in (producer_ranks, consumers):
        if isinstance(side, str):
            return {"outcome": "n/a", "detail": side}
    verdicts = [[compat.check(p.descriptor, c.descriptor) for p in producer_ranks] for c in consumers]
    refused = next((v for row in verdicts for v in row if not v.compatible), None)
    if refused:
        return {"outcome": "incompatible", "detail": refused.reason}
    plans = [v.plan for row in verdicts for v in row if v.plan.slices]
    steps = sorted({s for plan in plans for s in plan.steps})
    for rank, (c, row) in enumerate(zip(consumers, verdicts)):
        try:
            problem = execute_row(producer, producer_ranks, consumer, c, row, scenario, seed)
        except OpUnavailable as exc:  # a side's op cannot run this plan here (LMCache ships no head slice): no verdict on the cell
            return {"outcome": "n/a", "detail": f"consumer rank {rank}: {exc.who or 'this machine'}: {exc}"}
        except Exception as exc:  # an op of either side raised: the cell fails, naming it
            problem = f"{type(exc).__name__}: {exc}"
        if problem:
            return {"outcome": "fails", "detail": f"consumer rank {rank}: {problem}"}
    return {"outcome": "converted", "detail": ", ".join(steps)} if steps else {"outcome": "identical", "detail": ""}


PRODUCER_BLOCKS = [1, 3]  # ascending: region lists of several blocks pair up in address order


@functools.cache
def reference_producer_side(endpoint: Endpoint, scenario: Scenario, seed: int, device: str = "cpu"):
    """A reference endpoint as producer (for the ``received`` cells), cached per process."""
    return producer_side(endpoint, scenario, seed, device)


RECEIVED_FROM = "reference"  # its NHD, HND and shuffled-tile endpoints: regions, layout conversion, re-blocking, TP splits, e4m3fn


def reference_endpoints() -> list[Endpoint]:
    """The producers of the ``received`` cells: the reference backend's endpoints."""
    backend = _reference_peer(RECEIVED_FROM)
    return [Endpoint(backend, layout) for layout in backend.capabilities.layouts]


def producer_side(endpoint: Endpoint, scenario: Scenario, seed: int, device: str = "cpu"):
    """The endpoint's ranks as producer, on the run's device (its own ops run there), the model's
    KV for its blocks placed in each rank through its declared layout (``model_kv(g, 2,
    TOTAL_HEADS, seed)``); or why it cannot produce."""
    found = ranks(endpoint, *scenario.side(True), seed=seed, device=device)
    if isinstance(found, str):
        return found
    kv = model_kv(found[0].spec.geometry, len(PRODUCER_BLOCKS), TOTAL_HEADS, seed)
    for rank, r in enumerate(found):
        heads = R.connector.rank_heads(TOTAL_HEADS, scenario.producer_tp, rank)
        R.connector.scatter(r.buffer, r.spec.layout, r.spec.geometry, PRODUCER_BLOCKS, kv[:, :, :, :, heads.start:heads.stop])
    return found


class Unshippable(Exception):
    """A side's own regions cannot carry the plan (a region twice, byte counts that differ)."""


def own_regions(endpoint: Endpoint, rank: Rank, blocks, heads, side: str) -> list[tuple[int, int]]:
    """The side's regions of ``blocks`` (``heads``) from its buffer's first byte: its own
    ``block_regions`` where it declares ``regions``, else the reference's."""
    if "regions" not in endpoint.backend.capabilities.ops:
        return R.connector.byte_regions(rank.spec.layout, rank.spec.geometry, blocks, heads)
    regions = endpoint.backend.block_regions(rank.cache, rank.spec, blocks, heads)
    overlap = region_overlaps(regions)
    if overlap:
        raise Unshippable(f"the {side}'s regions of blocks {blocks}, heads {heads.start}..{heads.stop - 1}: {overlap}")
    origin = rank.cache.data_ptr() - rank.buffer.data_ptr()
    return [(o + origin, n) for o, n in sorted(regions)]


def ship_regions(producer: Endpoint, p_rank: Rank, p_blocks, consumer: Endpoint, c_rank: Rank, c_blocks, s) -> None:
    """One slice region to region: the producer's regions of it into the consumer's, as one stream."""
    src = own_regions(producer, p_rank, p_blocks, s.producer_heads, "producer")
    dst = own_regions(consumer, c_rank, c_blocks, s.consumer_heads, "consumer")
    sent, room = sum(n for _, n in src), sum(n for _, n in dst)
    if sent != room:
        raise Unshippable(f"the producer's regions hold {sent} bytes, the consumer's {room}")
    R.connector.copy_between_regions(p_rank.buffer, src, c_rank.buffer, dst)


def execute_row(producer: Endpoint, producer_ranks, consumer: Endpoint, consumer_rank: Rank, verdicts, scenario: Scenario, seed: int) -> str | None:
    """Ship every producer rank's slices into a fresh copy of the consumer rank — out through the
    producer's own ops, in through the consumer's — and compare with the consumer's reference:
    its heads of the model's tokens, re-encoded as its writer stores them."""
    kv = model_kv(producer_ranks[0].spec.geometry, len(PRODUCER_BLOCKS), TOTAL_HEADS, seed)  # what fill() placed
    gp, gc = producer_ranks[0].spec.geometry, consumer_rank.spec.geometry
    same_n = gp.block_size == gc.block_size
    tokens = len(PRODUCER_BLOCKS) * gp.block_size - (0 if same_n else 5)
    c_blocks = list(range(NUM_BLOCKS))[: -(-tokens // gc.block_size)] if same_n else [2, 0, 3, 1][: -(-tokens // gc.block_size)]
    buffer = consumer_rank.buffer.clone()
    target = Rank(consumer_rank.spec, buffer, consumer.backend.allocate(buffer, consumer_rank.spec), consumer_rank.descriptor)
    expected = consumer_rank.buffer.cpu().clone()
    for p_rank, verdict in zip(producer_ranks, verdicts):
        plan = verdict.plan
        for s in plan.slices:
            if plan.mode == "regions":
                try:
                    ship_regions(producer, p_rank, PRODUCER_BLOCKS, consumer, target, c_blocks, s)
                except Unshippable as exc:
                    return f"producer rank {p_rank.descriptor['tp_rank']} → heads {s.consumer_heads.start}..{s.consumer_heads.stop - 1}: {exc}"
                continue
            wire = producer.backend.export_blocks(p_rank.cache, p_rank.spec, PRODUCER_BLOCKS, s.producer_heads) \
                if "wire" in producer.backend.capabilities.ops else R.connector.export_blocks(p_rank.buffer, p_rank.spec.layout, gp, PRODUCER_BLOCKS, s.producer_heads)
            wire = compat.convert_wire(wire, gc.dtype, plan.ratios)
            count = None if same_n else tokens
            if "wire" in consumer.backend.capabilities.ops and (same_n or "reblock" in consumer.backend.capabilities.ops):
                consumer.backend.import_blocks(target.cache, target.spec, c_blocks, wire, s.consumer_heads, count)
            else:
                R.connector.import_blocks(target.buffer, plan.consumer.layout, plan.consumer.geometry, c_blocks, wire, s.consumer_heads, count)
    heads = R.connector.rank_heads(TOTAL_HEADS, scenario.consumer_tp, consumer_rank.descriptor["tp_rank"])
    sequence = kv.permute(0, 2, 1, 3, 4, 5).reshape(gp.num_layers, 2, -1, TOTAL_HEADS, gp.head_size)[:, :, :tokens, heads.start:heads.stop]
    ratios = verdicts[0].plan.ratios
    values = torch.stack([R.connector.convert(sequence[:, kv_], gp.dtype, gc.dtype, ratios[kv_])[0] for kv_ in (0, 1)], dim=2)
    offsets = R.connector.token_offsets(consumer_rank.spec.layout, gc, c_blocks, tokens)
    R.storage_bits(expected, gc)[offsets] = values
    landed = target.buffer.cpu()
    if torch.equal(landed, expected):
        return None
    differ = torch.nonzero((landed != expected).view(-1, gc.element_size).any(dim=1)).flatten()
    coords = R.coordinates_of(consumer_rank.spec.layout, gc, differ[:1].tolist())[0]
    where = " ".join(f"{k}={v}" for k, v in coords.items()) if coords else "padding"
    return f"{differ.numel()} elements differ from the consumer's reference, first at {where}"


def received(consumer: Endpoint, seed: int, device: str = "cpu") -> list[dict]:
    """The endpoint as consumer of every endpoint of the reference backend, in every scenario
    (its own import and regions at work): ``[{"producer", "producer_platform", "scenario", "outcome", "detail"}]``."""
    cells = []
    for scenario in SCENARIOS:
        for producer in reference_endpoints():
            if producer == consumer:
                continue
            side = reference_producer_side(producer, scenario, seed, device)
            cell = evaluate(producer, consumer, scenario, side, seed, device)
            cells.append({"producer": producer.label, "producer_platform": producer.platform, "scenario": scenario.name, **cell})
    return cells
