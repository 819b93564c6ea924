"""Check 10 — connector: what a KV connector does between engines holds on this backend's cache
(docs/CONNECTOR.md, clauses CONN-*). The byte regions of blocks and of head slices cover exactly
those elements; exported blocks come back bit for bit for every declared kv_cache_dtype (fp8
NaN and −0 codes included); hetero-TP resharding gives every consumer rank exactly its heads;
re-blocking keeps every token; a hybrid model's groups each round-trip with their own geometry;
the layout descriptor describes the cache; the handshake accepts exactly the peers
kvconform.compat accepts. Every model here has L = 3 layers (SPEC.md §11)."""

import dataclasses
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform.reference import compat
from kvconform import reference as R

from .harness import interop
from .harness.applicability import DECLARATION, NotApplicable, NotApplicableHere
from .harness.assertions import ConformanceFailure, assert_equal, assert_offsets_equal, describe
from .harness.connector import LAYERS, allocate_shard, assert_regions_cover_exactly, assert_shards_equal, cache_origin, model_kv
from .harness.case import block_ids
from .harness.strategies import geometry_choices

pytestmark = [pytest.mark.connector]

KV_CACHE_DTYPES = ("auto", *R.fp8.KV_CACHE_DTYPES)
TP_CHANGES = [(1, 2), (2, 1), (1, 4), (4, 1), (2, 4)]
BLOCK_SIZE_CHANGES = [(16, 32), (32, 16)]


def not_declared(case, what: str) -> NotApplicableHere:
    return NotApplicableHere(NotApplicable(DECLARATION, f"backend {case.backend.name}", what))


def model_geometry(case, **sizes) -> R.Geometry:
    """A small L = 3 geometry inside the declared capabilities (see Case.geometry)."""
    g = case.geometry(num_layers=LAYERS, **sizes)
    try:
        case.layout.validate(dataclasses.replace(g, num_layers=1))
    except ValueError as exc:
        raise not_declared(case, f"declares no geometry layout {case.layout.alias} holds here: {exc}") from exc
    return g


def shifted(regions, origin: int):
    """Regions from a cache's first byte → from the suite's buffer start."""
    return [(offset + origin, length) for offset, length in regions]


# ----------------------------------------------------------------------------- regions
@pytest.mark.kvc_op("regions")
@pytest.mark.kvc_clause("CONN-REGION-BLOCKS")
def test_block_regions_cover_exactly_the_requested_blocks(case):
    shard = allocate_shard(case, case.layout, model_geometry(case, num_blocks=7))
    blocks = block_ids(shard.spec.geometry, 3, case.seed).tolist()
    for arena in shard.arenas:
        regions = case.backend.block_regions(arena.cache, arena.spec, blocks)
        assert_regions_cover_exactly("connector", case, arena, regions, blocks, None, f"of blocks {blocks}")


@pytest.mark.kvc_op("regions")
@pytest.mark.kvc_clause("CONN-REGION-HEADS")
@given(data=st.data())
def test_head_slice_regions_cover_exactly_the_requested_heads(case, data):
    choices = [c for c in geometry_choices(case) if c[2].num_kv_heads >= 2]
    if not choices:
        raise not_declared(case, "declares no num_kv_heads >= 2 to slice")
    model_dtype, kv_dtype, g = data.draw(st.sampled_from(choices), label="model dtype, kv_cache_dtype, geometry")
    g = dataclasses.replace(g, num_layers=LAYERS, num_blocks=data.draw(st.integers(3, 6), label="num_blocks"))
    start = data.draw(st.integers(0, g.num_kv_heads - 1), label="first head")
    heads = range(start, data.draw(st.integers(start + 1, g.num_kv_heads), label="end head"))
    blocks = data.draw(st.lists(st.integers(0, g.num_blocks - 1), min_size=1, max_size=3, unique=True), label="blocks")
    shard = allocate_shard(case, case.layout, g, kv_cache_dtype=kv_dtype, model_dtype=model_dtype)
    for arena in shard.arenas:
        regions = case.backend.block_regions(arena.cache, arena.spec, blocks, heads)
        assert_regions_cover_exactly("connector", case, arena, regions, blocks, heads, f"of heads {heads.start}..{heads.stop - 1} of blocks {blocks}")


# ----------------------------------------------------------------------------- wire form
def assert_wire_equal(case, expected: R.connector.Wire, actual: R.connector.Wire, blocks) -> None:
    """An exported wire is the reference's: same layout, geometry and bytes."""
    assert_equal("connector", case, (expected.layout.name, expected.geometry), (actual.layout.name, actual.geometry), "wire layout and geometry")
    want, got = expected.data.cpu(), actual.data.detach().cpu()
    if torch.equal(want, got):
        return
    e = expected.geometry.element_size
    element = int(torch.nonzero((want != got).view(-1, e).any(dim=1)).flatten()[0])
    coords = R.coordinates_of(expected.layout, expected.geometry, [element])[0]
    where = f"wire {describe(coords)} (cache block {blocks[coords['block']]})"
    span = slice(element * e, (element + 1) * e)
    mismatch = {"where": where, "expected": want[span].tolist(), "actual": got[span].tolist()}
    raise ConformanceFailure(f"connector: exported bytes differ from the reference's {expected.layout.alias} wire, first at {where}: "
                             f"expected {mismatch['expected']}, actual {mismatch['actual']}\n  repro: {case.repro}",
                             {"property": "connector", "mismatches": [mismatch]})


@pytest.mark.kvc_op("wire")
@pytest.mark.kvc_clause("CONN-WIRE-ROUNDTRIP")
@pytest.mark.parametrize("kv_cache_dtype", KV_CACHE_DTYPES)
def test_exported_blocks_import_bit_for_bit(case, kv_cache_dtype):
    if kv_cache_dtype not in case.backend.capabilities.kv_cache_dtypes:
        raise not_declared(case, f"does not declare kv_cache_dtype {kv_cache_dtype}")
    g = model_geometry(case, kv_cache_dtype=kv_cache_dtype, num_blocks=7)
    source = allocate_shard(case, case.layout, g, kv_cache_dtype=kv_cache_dtype)
    src_ids, dst_ids = block_ids(g, 3, case.seed).tolist(), block_ids(g, 3, case.seed + 1).tolist()
    source.place(src_ids, model_kv(g, 3, g.num_kv_heads, case.seed))  # every NaN, −0 and edge code is shipped
    unchanged, target = source.snapshot(), allocate_shard(case, case.layout, g, kv_cache_dtype=kv_cache_dtype, seed_offset=100)
    before, expected = target.snapshot(), target.snapshot()
    expected.place(dst_ids, source.read(src_ids))
    for src, dst in zip(source.arenas, target.arenas):
        wire = case.backend.export_blocks(src.cache, src.spec, src_ids)
        reference = R.connector.export_blocks(src.region.cpu(), src.spec.layout, src.spec.geometry, src_ids, None, case.backend.wire_layout(src.spec))
        assert_wire_equal(case, reference, wire, src_ids)
        case.backend.import_blocks(dst.cache, dst.spec, dst_ids, wire)
    assert_shards_equal("connector", case, unchanged, source, "export changed the exported cache", initial=unchanged)
    assert_shards_equal("connector", case, expected, target, f"blocks {src_ids} exported, imported into {dst_ids}", initial=before)


# ----------------------------------------------------------------------------- hetero-TP resharding
def local_heads(total: int, tp: int) -> int | None:
    """Heads per rank of a model with ``total`` KV heads at TP ``tp`` (None: no even split)."""
    try:
        return len(R.connector.rank_heads(total, tp, 0))
    except ValueError:
        return None


def model_heads(case, producer_tp: int, consumer_tp: int) -> int:
    """The most KV heads a model can have such that both sides' per-rank counts are declared."""
    declared = set(case.backend.capabilities.num_kv_heads)
    fits = [t for t in range(1, max(declared) * max(producer_tp, consumer_tp) + 1)
            if {local_heads(t, producer_tp), local_heads(t, consumer_tp)} <= declared]
    if not fits:
        raise not_declared(case, f"declares no num_kv_heads that splits over TP {producer_tp} and {consumer_tp}")
    return max(fits)


def ship(case, mode, producer, p_ids, p_heads, consumer, c_ids, c_heads) -> None:
    """One head slice of every block, producer → consumer: region to region (NIXL) or by wire.
    Regions pair up block for block when both id lists ascend (regions come in address order)."""
    for src, dst in zip(producer.arenas, consumer.arenas):
        if mode == "wire":
            wire = case.backend.export_blocks(src.cache, src.spec, p_ids, p_heads)
            case.backend.import_blocks(dst.cache, dst.spec, c_ids, wire, c_heads)
            continue
        src_regions = shifted(sorted(case.backend.block_regions(src.cache, src.spec, p_ids, p_heads)), cache_origin(src))
        dst_regions = shifted(sorted(case.backend.block_regions(dst.cache, dst.spec, c_ids, c_heads)), cache_origin(dst))
        R.connector.copy_between_regions(src.region, src_regions, dst.region, dst_regions)


def consumer_layout(case, mode: str) -> R.Layout:
    """Regions need the same layout on both sides; the wire may land in another declared one."""
    same_grouping = [lay for lay in case.backend.capabilities.layouts if ("L" in lay.k_dims) == ("L" in case.layout.k_dims)]
    if mode == "regions" or len(same_grouping) < 2 or case.layout not in same_grouping:
        return case.layout
    return same_grouping[(same_grouping.index(case.layout) + 1) % len(same_grouping)]


@pytest.mark.kvc_clause("CONN-RESHARD")
@pytest.mark.parametrize("mode", [pytest.param("regions", marks=pytest.mark.kvc_op("regions")), pytest.param("wire", marks=pytest.mark.kvc_op("wire"))])
def test_resharding_gives_every_consumer_rank_exactly_its_heads(case, mode):
    # TP 1→2, 2→1, 1→4, 4→1, 2→4: each consumer rank's cache must equal the reference one for its heads.
    g = model_geometry(case, num_blocks=5)
    p_ids, c_ids = sorted(block_ids(g, 2, case.seed).tolist()), sorted(block_ids(g, 2, case.seed + 1).tolist())
    target_layout = consumer_layout(case, mode)
    for producer_tp, consumer_tp in TP_CHANGES:
        total = model_heads(case, producer_tp, consumer_tp)
        kv = model_kv(g, len(p_ids), total, case.seed + total)
        producers = []
        for rank in range(producer_tp):
            heads = R.connector.rank_heads(total, producer_tp, rank)
            producers.append(allocate_shard(case, case.layout, dataclasses.replace(g, num_kv_heads=len(heads)), seed_offset=10 * rank))
            producers[-1].place(p_ids, kv[:, :, :, :, heads.start:heads.stop])
        for rank in range(consumer_tp):
            heads = R.connector.rank_heads(total, consumer_tp, rank)
            consumer = allocate_shard(case, target_layout, dataclasses.replace(g, num_kv_heads=len(heads)), seed_offset=1000 + 10 * rank)
            before, expected = consumer.snapshot(), consumer.snapshot()
            expected.place(c_ids, kv[:, :, :, :, heads.start:heads.stop])
            for s in R.connector.head_slices(total, producer_tp, consumer_tp, rank):
                ship(case, mode, producers[s.producer_rank], p_ids, s.producer_heads, consumer, c_ids, s.consumer_heads)
            assert_shards_equal("connector", case, expected, consumer, f"TP {producer_tp}→{consumer_tp} ({mode}): consumer rank {rank} "
                                f"(model heads {heads.start}..{heads.stop - 1} of {total}) from blocks {p_ids} into {c_ids}", initial=before)


# ----------------------------------------------------------------------------- re-blocking
@pytest.mark.kvc_op("reblock")
@pytest.mark.kvc_clause("CONN-REBLOCK")
@pytest.mark.parametrize("sizes", BLOCK_SIZE_CHANGES, ids=[f"N{p}to{c}" for p, c in BLOCK_SIZE_CHANGES])
def test_block_size_translation_keeps_every_token(case, sizes):
    producer_n, consumer_n = sizes
    caps = case.backend.capabilities
    if not set(sizes) <= set(caps.block_sizes):
        raise not_declared(case, f"does not declare block sizes {producer_n} and {consumer_n}")
    tokens = 2 * max(sizes) + 5  # a partial last block on both sides
    head_size = next((d for d in caps.head_sizes if d not in sizes), caps.head_sizes[0])
    gp, gc = (model_geometry(case, block_size=n, head_size=head_size, num_blocks=-(-tokens // n) + 3) for n in sizes)
    producer = allocate_shard(case, case.layout, gp)
    consumer = allocate_shard(case, case.layout, gc, seed_offset=50)
    p_table = block_ids(gp, -(-tokens // producer_n), case.seed).tolist()
    c_table = block_ids(gc, -(-tokens // consumer_n), case.seed + 1).tolist()
    producer.place(p_table, model_kv(gp, len(p_table), gp.num_kv_heads, case.seed))
    before, expected = consumer.snapshot(), consumer.snapshot()
    for src, want in zip(producer.arenas, expected.arenas):  # token t: (p_table[t // Np], t % Np) → (c_table[t // Nc], t % Nc)
        src_bits = R.storage_bits(src.region, src.spec.geometry)[R.connector.token_offsets(src.spec.layout, src.spec.geometry, p_table, tokens).to(src.region.device)].cpu()
        R.storage_bits(want.region, want.spec.geometry)[R.connector.token_offsets(want.spec.layout, want.spec.geometry, c_table, tokens)] = src_bits
    for src, dst in zip(producer.arenas, consumer.arenas):
        wire = case.backend.export_blocks(src.cache, src.spec, p_table)
        case.backend.import_blocks(dst.cache, dst.spec, c_table, wire, num_tokens=tokens)
    assert_shards_equal("connector", case, expected, consumer, f"{tokens} tokens from blocks {p_table} (N={producer_n}) into {c_table} (N={consumer_n})",
                        initial=before)


# ----------------------------------------------------------------------------- hybrid models
def hybrid_groups(case) -> list[dict]:
    """Two layer groups differing in head size — and in head count and dtype where declared —
    smaller head size first."""
    caps = case.backend.capabilities
    sizes = sorted(caps.head_sizes)
    usable = []
    for d in sizes:
        try:
            case.layout.validate(case.geometry(head_size=d))
            usable.append(d)
        except ValueError:
            continue
    if len(usable) < 2:
        raise not_declared(case, f"declares one head size its layout {case.layout.alias} holds; a hybrid model needs two")
    fp8 = next((k for k in caps.kv_cache_dtypes if k != "auto"), None)
    heads = sorted(caps.num_kv_heads)
    second = dict(kv_cache_dtype=fp8, model_dtype=caps.dtypes[0]) if fp8 else dict(kv_cache_dtype="auto", model_dtype=caps.dtypes[-1])
    return [dict(kv_cache_dtype="auto", model_dtype=caps.dtypes[0], head_size=usable[0], num_kv_heads=heads[-1]),
            dict(second, head_size=usable[-1], num_kv_heads=heads[0] if heads[0] != heads[-1] else heads[-1])]


@pytest.mark.kvc_op("wire")
@pytest.mark.kvc_clause("CONN-HYBRID")
def test_hybrid_model_groups_round_trip_each_with_its_own_geometry(case):
    groups = []  # the engine allocates every group's cache before the connector ships any
    for number, group in enumerate(hybrid_groups(case)):
        kv_dtype, model_dtype = group.pop("kv_cache_dtype"), group.pop("model_dtype")
        g = model_geometry(case, kv_cache_dtype=kv_dtype, model_dtype=model_dtype, num_blocks=6, **group)
        shards = [allocate_shard(case, case.layout, g, kv_cache_dtype=kv_dtype, model_dtype=model_dtype, seed_offset=200 * number + side) for side in (0, 100)]
        groups.append((number, g, kv_dtype, *shards))
    for number, g, kv_dtype, source, target in groups:
        src_ids, dst_ids = block_ids(g, 2, case.seed + number).tolist(), block_ids(g, 2, case.seed + number + 7).tolist()
        source.place(src_ids, model_kv(g, 2, g.num_kv_heads, case.seed + number))
        before, expected = target.snapshot(), target.snapshot()
        expected.place(dst_ids, source.read(src_ids))
        halves = [range(0, g.num_kv_heads // 2), range(g.num_kv_heads // 2, g.num_kv_heads)] if g.num_kv_heads > 1 else [range(1)]
        for heads in halves:  # as a connector resharding each group to two ranks slices it
            ship(case, "wire", source, src_ids, heads, target, dst_ids, heads)
        assert_shards_equal("connector", case, expected, target, f"layer group {number} ({g.short()}, kv_cache_dtype {kv_dtype})", initial=before)


# ----------------------------------------------------------------------------- descriptor and handshake
def announced(case, kv_cache_dtype: str, **sizes):
    """This backend's cache and the descriptor it announces for it as TP rank 1 of 2."""
    g = case.geometry(kv_cache_dtype=kv_cache_dtype, num_layers=LAYERS if "L" in case.layout.k_dims else 1, **sizes)
    spec = case.spec(g, kv_cache_dtype)
    arena = case.allocate(spec)
    descriptor = case.backend.layout_descriptor(arena.cache, spec, tp_rank=1, tp_size=2, total_kv_heads=2 * g.num_kv_heads, k_scale=0.5, v_scale=0.25)
    try:
        return spec, compat.parse(json.loads(json.dumps(descriptor)), "the announced descriptor"), descriptor
    except compat.DescriptorError as exc:
        raise ConformanceFailure(f"connector: {exc}\n  repro: {case.repro}", {"property": "connector", "mismatches": [{"where": "descriptor", "actual": str(exc)}]}) from exc


def first_fp8(case) -> str:
    return next((k for k in case.backend.capabilities.kv_cache_dtypes if k != "auto"), "auto")


@pytest.mark.kvc_clause("CONN-DESCRIPTOR")
def test_layout_descriptor_describes_the_allocated_cache(case):
    # B = 2 and H = 2: where a layout guessed from a live tensor goes wrong (F.25, LMCache#4467).
    heads = 2 if 2 in case.backend.capabilities.num_kv_heads else None
    spec, endpoint, _ = announced(case, first_fp8(case), num_blocks=2, num_kv_heads=heads)
    g = spec.geometry
    assert_equal("connector", case, g, endpoint.geometry, "geometry the descriptor announces")
    assert_equal("connector", case, (1, 2, 2 * g.num_kv_heads), (endpoint.tp_rank, endpoint.tp_size, endpoint.total_kv_heads), "tp_rank, tp_size, total_kv_heads")
    if g.dtype in R.fp8.FP8_DTYPES:
        assert_equal("connector", case, (0.5, 0.25), (endpoint.k_scale, endpoint.v_scale), "k_scale, v_scale")
    assert_offsets_equal("connector", case, R.offset_map(spec.layout, g), R.offset_map(endpoint.layout, endpoint.geometry),
                         f"where the descriptor's layout {endpoint.layout.name} puts each element of the declared {spec.layout}")


def handshake_peers(case, spec, local: dict) -> dict[str, dict]:
    """Producers a consumer may meet, derived from its own descriptor: each differs in one thing."""
    me = compat.parse(local)
    g = spec.geometry
    caps = case.backend.capabilities

    def peer(layout=spec.layout, **changes):
        scales = {k: changes.pop(k) for k in ("k_scale", "v_scale") if k in changes}
        tp = {k: changes.pop(k) for k in ("tp_rank", "tp_size", "total_kv_heads") if k in changes}
        pg = dataclasses.replace(g, **changes)
        return compat.describe(layout, pg, tp_rank=tp.get("tp_rank", me.tp_rank), tp_size=tp.get("tp_size", me.tp_size),
                               total_kv_heads=tp.get("total_kv_heads", me.total_kv_heads), k_scale=scales.get("k_scale", me.k_scale),
                               v_scale=scales.get("v_scale", me.v_scale), backend="peer")

    peers = {"itself": local, "other head_size": peer(head_size=2 * g.head_size),
             "twice the model heads": peer(total_kv_heads=4 * g.num_kv_heads, tp_size=2, num_kv_heads=2 * g.num_kv_heads),
             "the model split over 2·total ranks": peer(tp_size=me.total_kv_heads, tp_rank=0, num_kv_heads=1)}
    peers["other block size"] = peer(block_size=next(n for n in (16, 32, 64) if n != g.block_size))
    others = [lay for lay in caps.layouts if lay != spec.layout and ("L" in lay.k_dims) == ("L" in spec.layout.k_dims)]
    peers["another layout"] = peer(others[0] if others else R.connector.CANONICAL_WIRE if g.num_layers == 1 else spec.layout)
    if g.dtype in R.fp8.FP8_DTYPES:
        for fmt in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"):
            for factor in (0.5, 1.0, 2.0):
                peers[f"{fmt} at scales × {factor:g}"] = peer(dtype=R.fp8.fp8_format(fmt).dtype, k_scale=me.k_scale * factor, v_scale=me.v_scale * factor)
    return peers


@pytest.mark.kvc_op("handshake")
@pytest.mark.kvc_clause("CONN-HANDSHAKE", "CONN-FP8-SCALE")
def test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts(case):
    spec, _, local = announced(case, first_fp8(case))
    for name, remote in handshake_peers(case, spec, local).items():
        want = compat.check(remote, local)
        got = case.backend.handshake(local, remote)
        plan = lambda v: (v.plan.mode, v.plan.steps, v.plan.slices) if v.plan else None  # noqa: E731
        assert_equal("connector", case, (want.compatible, plan(want)), (got.compatible, plan(got)),
                     f"handshake with a producer that has {name} (kvconform.compat: {want.summary})")


# ----------------------------------------------------------------------------- interop row
@pytest.fixture
def peers(request):
    from .plugin.hooks import RUN

    return interop.peer_endpoints(request.config.stash[RUN].backends)


@pytest.mark.kvc_clause("CONN-INTEROP")
def test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says(case, peers):
    me = interop.Endpoint(case.backend, case.layout)
    cells, sides, done = [], {}, {}
    for scenario in interop.SCENARIOS:
        producer_ranks = interop.producer_side(me, scenario, case.seed, case.device)
        sides[interop.side_key(*scenario.side(True))] = [r.descriptor for r in producer_ranks] if not isinstance(producer_ranks, str) else producer_ranks
        for peer in peers:
            key = (scenario, interop.consumer_key(peer, scenario))  # peers announcing the same cache get the same verdict
            if key not in done:
                done[key] = interop.evaluate(me, peer, scenario, producer_ranks, case.seed)
            cells.append({"consumer": peer.label, "consumer_platform": peer.platform, "scenario": scenario.name, **done[key]})
    case.record("interop", {"endpoint": interop.endpoint_record(me, sides), "cells": cells})
    failing = [c for c in cells if c["outcome"] == "fails"]
    if failing:
        lines = [f"  {c['scenario']} → {c['consumer']}: {c['detail']}" for c in failing[:6]]
        raise ConformanceFailure(f"connector: {len(failing)} of {len(cells)} interop cells of {me.label} fail: blocks shipped as kvconform.compat "
                                 f"plans them do not land as the consumer's layout says\n" + "\n".join(lines) + f"\n  repro: {case.repro}",
                                 {"property": "connector", "mismatches": [{"where": f"{c['scenario']} → {c['consumer']}", "actual": c["detail"]} for c in failing[:6]]})
