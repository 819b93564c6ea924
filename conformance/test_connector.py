"""Check 10 — connector: what a KV connector does between engines holds on this backend's cache
(docs/CONNECTOR.md, clauses CONN-*). The byte regions of blocks and of head slices cover exactly
those elements; exported blocks and head ranges come back bit for bit for every declared
kv_cache_dtype (fp8 NaN and −0 codes included); a wire of another fp8 format is refused or
converted exactly; hetero-TP resharding (multi-head slices included) gives every consumer rank
exactly its heads; re-blocking keeps every token; a hybrid model's groups each round-trip with
their own geometry; the layout descriptor describes the cache; the handshake accepts exactly the
peers kvconform.compat accepts, with plans that give every consumer head its model head once for
every rank pair (replicated heads from any holder); the interop row lands blocks through both
sides' own ops. Every model here has L = 3 layers (SPEC.md §11)."""

import dataclasses
import json

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform.reference import compat
from kvconform import reference as R

from .harness import interop
from .harness.applicability import undeclared
from .harness.assertions import ConformanceFailure, assert_equal, assert_offsets_equal, describe
from .harness.connector import (
    LAYERS, allocate_shard, assert_regions_cover_exactly, assert_regions_disjoint, assert_shards_equal, cache_origin, model_kv,
)
from .harness.case import block_ids
from .harness.strategies import geometry_choices

pytestmark = [pytest.mark.connector]

KV_CACHE_DTYPES = ("auto", *R.fp8.KV_CACHE_DTYPES)
TP_CHANGES = [(1, 2), (2, 1), (1, 4), (4, 1), (2, 4), (3, 2)]  # 3→2 over 6 heads: slices of 2 and 3 heads on both sides
BLOCK_SIZE_CHANGES = [(16, 32), (32, 16)]


def model_geometry(case, **sizes) -> R.Geometry:
    """A small L = 3 geometry inside the declared capabilities (see Case.geometry)."""
    g = case.geometry(num_layers=LAYERS, **sizes)
    try:
        case.layout.validate(dataclasses.replace(g, num_layers=1))
    except ValueError as exc:
        raise undeclared(case.backend, f"declares no geometry layout {case.layout.alias} holds here: {exc}") from exc
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
        raise undeclared(case.backend, "declares no num_kv_heads >= 2 to slice")
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
        raise undeclared(case.backend, f"does not declare kv_cache_dtype {kv_cache_dtype}")
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


@pytest.mark.kvc_op("wire")
@pytest.mark.kvc_clause("CONN-WIRE-ROUNDTRIP", "CONN-WIRE-HEADS")
@given(data=st.data())
def test_exported_head_ranges_import_bit_for_bit(case, data):
    # A drawn head range [h0, h1) of drawn blocks, exported and imported into another range of
    # the same width (as a resharding consumer receives it), on a drawn declared geometry.
    choices = [c for c in geometry_choices(case) if c[2].num_kv_heads >= 2]
    if not choices:
        raise undeclared(case.backend, "declares no num_kv_heads >= 2 to slice")
    model_dtype, kv_dtype, g = data.draw(st.sampled_from(choices), label="model dtype, kv_cache_dtype, geometry")
    g = dataclasses.replace(g, num_layers=LAYERS, num_blocks=data.draw(st.integers(3, 6), label="num_blocks"))
    start = data.draw(st.integers(0, g.num_kv_heads - 1), label="first head")
    heads = range(start, data.draw(st.integers(start + 1, g.num_kv_heads), label="end head"))
    to = data.draw(st.integers(0, g.num_kv_heads - len(heads)), label="first head of the consumer range")
    into = range(to, to + len(heads))
    src_ids = data.draw(st.lists(st.integers(0, g.num_blocks - 1), min_size=1, max_size=3, unique=True), label="blocks")
    dst_ids = data.draw(st.permutations(range(g.num_blocks)), label="consumer blocks")[: len(src_ids)]
    source = allocate_shard(case, case.layout, g, kv_cache_dtype=kv_dtype, model_dtype=model_dtype)
    target = allocate_shard(case, case.layout, g, kv_cache_dtype=kv_dtype, model_dtype=model_dtype, seed_offset=100)
    unchanged, expected = source.snapshot(), target.snapshot()
    expected.place(dst_ids, source.read(src_ids, heads), into)
    for src, dst in zip(source.arenas, target.arenas):
        wire = case.backend.export_blocks(src.cache, src.spec, src_ids, heads)
        reference = R.connector.export_blocks(src.region.cpu(), src.spec.layout, src.spec.geometry, src_ids, heads, case.backend.wire_layout(src.spec))
        assert_wire_equal(case, reference, wire, src_ids)
        case.backend.import_blocks(dst.cache, dst.spec, dst_ids, wire, into)
    assert_shards_equal("connector", case, unchanged, source, "export changed the exported cache")
    assert_shards_equal("connector", case, expected, target, f"heads {heads.start}..{heads.stop - 1} of blocks {src_ids} exported, "
                        f"imported into heads {into.start}..{into.stop - 1} of blocks {dst_ids}")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def foreign_wire(g: R.Geometry, dtype: torch.dtype, num_blocks: int, values: torch.Tensor) -> R.connector.Wire:
    """A canonical wire of ``dtype`` holding ``values`` (logical bits, as a peer exports them)."""
    wg = R.connector.wire_geometry(dataclasses.replace(g, dtype=dtype), num_blocks)
    data = torch.zeros(R.connector.CANONICAL_WIRE.nbytes(wg), dtype=torch.uint8)
    R.connector.scatter(data, R.connector.CANONICAL_WIRE, wg, range(num_blocks), values)
    return R.connector.Wire(data, R.connector.CANONICAL_WIRE, wg)


def values_both_hold(src: torch.dtype, dst: torch.dtype, shape, seed: int) -> torch.Tensor:
    """Random ``src`` codes whose values ``dst`` holds exactly, NaN aside (a wire an exact converter may take)."""
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    exact = codes[R.connector.convert(codes, src, dst, 1.0)[1] & ~torch.isnan(R.connector.decode_values(codes, src))]
    pick = torch.randint(0, exact.numel(), shape, generator=torch.Generator().manual_seed(seed))
    return exact[pick]


@pytest.mark.kvc_op("wire")
@pytest.mark.kvc_clause("CONN-WIRE-FOREIGN-DTYPE")
def test_a_wire_of_another_dtype_is_refused_or_converted_exactly(case):
    # For every fp8 cache dtype the backend declares, a wire of each other fp8 format (a peer's
    # export: e4m3fn into e4m3fnuz, e5m2 into e4m3 …): with every code, and with values both
    # formats hold. import_blocks raises and leaves the cache as it was, or stores each value exactly.
    caps = case.backend.capabilities
    cache_dtypes = {case.backend.cache_dtype(k, caps.dtypes[0]): k for k in caps.kv_cache_dtypes if k != "auto"}
    pairs = [(w, c) for c in cache_dtypes for w in R.fp8.FP8_DTYPES if w != c]
    if not pairs:
        raise undeclared(case.backend, "declares no fp8 kv_cache_dtype: no wire of another fp8 format to import")
    for number, (wire_dtype, cache_dtype) in enumerate(pairs):
        kv_dtype = cache_dtypes[cache_dtype]
        g = model_geometry(case, kv_cache_dtype=kv_dtype, num_blocks=5)
        ids = block_ids(g, 2, case.seed + number).tolist()
        for label, values in (("every code", model_kv(dataclasses.replace(g, dtype=wire_dtype), len(ids), g.num_kv_heads, case.seed + number)),
                              ("values both formats hold", values_both_hold(wire_dtype, cache_dtype, (g.num_layers, len(ids), 2, g.block_size, g.num_kv_heads, g.head_size), case.seed))):
            target = allocate_shard(case, case.layout, g, kv_cache_dtype=kv_dtype, seed_offset=300 + number)
            before = target.snapshot()
            what = f"a {dtype_name(wire_dtype)} wire ({label}) into blocks {ids} of a {dtype_name(cache_dtype)} cache"
            for arena, layers in zip(target.arenas, target.layers):
                wire = foreign_wire(arena.spec.geometry, wire_dtype, len(ids), values[layers.start:layers.stop])
                try:
                    case.backend.import_blocks(arena.cache, arena.spec, ids, wire)
                except Exception:  # refused: nothing of the cache may have changed
                    assert_shards_equal("connector", case, before, target, f"{what} was refused (raised), but the cache changed")
                    break
            else:  # accepted: every value must have a value of the cache dtype, stored exactly
                converted, exact = R.connector.convert(values, wire_dtype, cache_dtype, 1.0)
                if not bool(exact.all()):
                    code = int(values.flatten()[torch.nonzero(~exact.flatten())[0]])
                    problem = (f"import_blocks took it without raising, though {dtype_name(wire_dtype)} code 0x{code:02x} has no exact "
                               f"{dtype_name(cache_dtype)} value: "
                               f"such a wire must be refused (raise, cache unchanged) or every value converted exactly")
                    raise ConformanceFailure(f"connector: {what}: {problem}\n  repro: {case.repro}",
                                             {"property": "connector", "mismatches": [{"where": what, "expected": "refused", "actual": "accepted"}]})
                expected = before.snapshot()
                expected.place(ids, converted)
                assert_shards_equal("connector", case, expected, target, f"{what}, accepted: each value converted exactly")


# ----------------------------------------------------------------------------- hetero-TP resharding
def local_heads(total: int, tp: int) -> int | None:
    """Heads per rank of a model with ``total`` KV heads at TP ``tp`` (None: no even split)."""
    try:
        return len(R.connector.rank_heads(total, tp, 0))
    except ValueError:
        return None


def model_heads(case, producer_tp: int, consumer_tp: int) -> int | None:
    """The most KV heads a model can have such that both sides' per-rank counts are declared (None: none)."""
    declared = set(case.backend.capabilities.num_kv_heads)
    fits = [t for t in range(1, max(declared) * max(producer_tp, consumer_tp) + 1)
            if {local_heads(t, producer_tp), local_heads(t, consumer_tp)} <= declared]
    return max(fits) if fits else None


def ship(case, mode, producer, p_ids, p_heads, consumer, c_ids, c_heads) -> None:
    """One head slice of every block, producer → consumer: region to region (NIXL) or by wire.
    Regions pair up block for block when both id lists ascend (regions come in address order)."""
    for src, dst in zip(producer.arenas, consumer.arenas):
        if mode == "wire":
            wire = case.backend.export_blocks(src.cache, src.spec, p_ids, p_heads)
            case.backend.import_blocks(dst.cache, dst.spec, c_ids, wire, c_heads)
            continue
        src_regions = case.backend.block_regions(src.cache, src.spec, p_ids, p_heads)
        dst_regions = case.backend.block_regions(dst.cache, dst.spec, c_ids, c_heads)
        assert_regions_disjoint("connector", case, src_regions, f"of heads {p_heads.start}..{p_heads.stop - 1} of producer blocks {p_ids}")
        assert_regions_disjoint("connector", case, dst_regions, f"of heads {c_heads.start}..{c_heads.stop - 1} of consumer blocks {c_ids}")
        src_regions, dst_regions = shifted(sorted(src_regions), cache_origin(src)), shifted(sorted(dst_regions), cache_origin(dst))
        R.connector.copy_between_regions(src.region, src_regions, dst.region, dst_regions)


def consumer_layout(case, mode: str) -> R.Layout:
    """Regions need the same layout on both sides; the wire may land in another declared one."""
    same_grouping = [lay for lay in case.backend.capabilities.layouts if ("L" in lay.k_dims) == ("L" in case.layout.k_dims)]
    if mode == "regions" or len(same_grouping) < 2 or case.layout not in same_grouping:
        return case.layout
    return same_grouping[(same_grouping.index(case.layout) + 1) % len(same_grouping)]


@pytest.mark.kvc_clause("CONN-RESHARD", "CONN-RESHARD-SLICES")
@pytest.mark.parametrize("mode", [pytest.param("regions", marks=pytest.mark.kvc_op("regions")), pytest.param("wire", marks=pytest.mark.kvc_op("wire"))])
def test_resharding_gives_every_consumer_rank_exactly_its_heads(case, mode):
    # TP 1→2, 2→1, 1→4, 4→1, 2→4, 3→2: each consumer rank's cache must equal the reference one for its heads.
    g = model_geometry(case, num_blocks=5)
    p_ids, c_ids = sorted(block_ids(g, 2, case.seed).tolist()), sorted(block_ids(g, 2, case.seed + 1).tolist())
    target_layout = consumer_layout(case, mode)
    changes = [(p, c, model_heads(case, p, c)) for p, c in TP_CHANGES]
    if all(total is None for _, _, total in changes):
        raise undeclared(case.backend, f"declares no num_kv_heads that splits over any of the TP changes {TP_CHANGES}")
    for producer_tp, consumer_tp, total in changes:
        if total is None:
            continue
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
        raise undeclared(case.backend, f"does not declare block sizes {producer_n} and {consumer_n}")
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
    """Two layer groups differing in head size — and in block size, head count and dtype where
    declared — smaller head size first."""
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
        raise undeclared(case.backend, f"declares one head size its layout {case.layout.alias} holds; a hybrid model needs two")
    fp8 = next((k for k in caps.kv_cache_dtypes if k != "auto"), None)
    heads = sorted(caps.num_kv_heads)
    second = dict(kv_cache_dtype=fp8, model_dtype=caps.dtypes[0]) if fp8 else dict(kv_cache_dtype="auto", model_dtype=caps.dtypes[-1])
    sizes = [n for n in caps.block_sizes if all(_holds(case, dict(block_size=n, head_size=d, **kind))
                                                for d, kind in ((usable[0], dict(kv_cache_dtype="auto", model_dtype=caps.dtypes[0])), (usable[-1], second)))]
    first_n, second_n = (sizes[0], sizes[-1]) if sizes else (None, None)
    return [dict(kv_cache_dtype="auto", model_dtype=caps.dtypes[0], head_size=usable[0], num_kv_heads=heads[-1], block_size=first_n),
            dict(second, head_size=usable[-1], num_kv_heads=heads[0] if heads[0] != heads[-1] else heads[-1], block_size=second_n)]


def _holds(case, sizes: dict) -> bool:
    try:
        case.layout.validate(case.geometry(**sizes))
        return True
    except ValueError:
        return False


@pytest.mark.kvc_op("wire")
@pytest.mark.kvc_clause("CONN-HYBRID")
def test_hybrid_model_groups_round_trip_each_with_its_own_geometry(case):
    # Two groups of different head size and, where declared, block size, head count and dtype,
    # each sliced into head halves as a connector resharding it to two ranks does.
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
    """This backend's cache and the descriptor it announces for it as TP rank 1 of 2 (over twice its heads)."""
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
@pytest.mark.kvc_needs("connector_ops")
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


def physical_shape(layout: R.Layout, g: R.Geometry) -> tuple[int, ...]:
    """The extent of each physical dim, outermost first: the shape of the cache tensor as it sits in memory."""
    return tuple(g.extent(s.split(":")[0]) for s in layout.k_dims)


def same_shape_layout(layout: R.Layout, g: R.Geometry) -> R.Layout | None:
    """Another layout kvconform knows (the same layer grouping) whose cache has this one's
    physical shape at ``g``: at H = 2 a packed K‖V layout and the standard one — E2 ``(B, H, N,
    2·D)`` and E1 NHD ``(B, 2, N, H, D)``; vLLM's standard E3 spec (C = K‖V of one head) and its
    2-slot spec (C = every head of K or of V), both ``[L, B, 2, N, 2·D]`` (LMCache#4467)."""
    shape = physical_shape(layout, g)
    for other in R.named_layouts().values():
        if (other.k_dims, other.v_dims) == (layout.k_dims, layout.v_dims) or ("L" in other.k_dims) != ("L" in layout.k_dims):
            continue
        try:
            other.validate(g)
        except ValueError:
            continue
        if not other.is_tiled and physical_shape(other, g) == shape:
            return other
    return None


def cross_layer_counterpart(spec) -> tuple[R.Layout, int]:
    """A peer layout with the other layer grouping: one allocation of every layer (E1 cross-layer
    NHD, L = 3) against a per-layer cache, a per-layer E1 NHD cache against a cross-layer one."""
    if "L" in spec.layout.k_dims:
        return R.blocks_first("NHD"), 1
    return R.blocks_first_cross_layer("NHD"), LAYERS


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
    grouping, layers = cross_layer_counterpart(spec)
    peers[f"the other layer grouping ({grouping.alias}, {layers} layer{'s' if layers > 1 else ''} per allocation)"] = peer(grouping, num_layers=layers)
    same_shape = same_shape_layout(spec.layout, g)
    if same_shape is not None:
        peers[f"{same_shape.alias}, another layout of the same tensor shape"] = peer(same_shape)
    if g.dtype in R.fp8.FP8_DTYPES:
        for fmt in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2"):
            dtype = R.fp8.fp8_format(fmt).dtype
            for factor in (0.5, 1.0, 2.0):
                peers[f"{fmt} at scales × {factor:g}"] = peer(dtype=dtype, k_scale=me.k_scale * factor, v_scale=me.v_scale * factor)
            for factor in (0.5, 2.0):  # K and V scaled apart: a handshake judging K's scale alone differs here
                peers[f"{fmt} at k_scale × {factor:g}, v_scale × 1"] = peer(dtype=dtype, k_scale=me.k_scale * factor)
                peers[f"{fmt} at k_scale × 1, v_scale × {factor:g}"] = peer(dtype=dtype, v_scale=me.v_scale * factor)
    return peers


def head_pairs(slices) -> list[tuple[int, int, int]]:
    """A plan's slices head by head — ``(producer rank, producer head, consumer head)`` — however it groups them into runs."""
    return sorted((s.producer_rank, p, c) for s in slices for p, c in zip(s.producer_heads, s.consumer_heads))


def plan_facts(verdict: compat.Verdict):
    """What a handshake decides: compatible or not, and the plan's mode, conversions, heads and value ratios."""
    plan = verdict.plan
    return (verdict.compatible, (plan.mode, plan.steps, head_pairs(plan.slices), plan.ratios) if plan else None)


def backend_handshake(case, local: dict, remote: dict, what: str) -> compat.Verdict:
    """The backend's verdict; an answer that is no Verdict fails naming the peer."""
    got = case.backend.handshake(local, remote)
    if not isinstance(got, compat.Verdict) or (got.compatible and got.plan is None):
        raise ConformanceFailure(f"connector: handshake with {what} returned {got!r}, not a kvconform.compat Verdict with a plan\n  repro: {case.repro}",
                                 {"property": "connector", "mismatches": [{"where": what, "expected": "a Verdict", "actual": repr(got)[:200]}]})
    return got


@pytest.mark.kvc_op("handshake")
@pytest.mark.kvc_clause("CONN-HANDSHAKE", "CONN-FP8-SCALE", "CONN-FP8-SCALE-KV", "CONN-HANDSHAKE-LAYERS", "CONN-HANDSHAKE-SHAPE")
def test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts(case):
    # As TP rank 1 of 2 with H = 2 KV heads where declared (a packed K‖V E3 spec has the standard
    # one's shape there); no peer replicates heads, so compat's slices are the only right ones.
    heads = 2 if 2 in case.backend.capabilities.num_kv_heads else None
    spec, _, local = announced(case, first_fp8(case), num_kv_heads=heads)
    for name, remote in handshake_peers(case, spec, local).items():
        want = compat.check(remote, local)
        got = backend_handshake(case, local, remote, f"a producer that has {name}")
        assert_equal("connector", case, plan_facts(want), plan_facts(got), f"handshake with a producer that has {name} (kvconform.compat: {want.summary})")


# Every (producer TP, consumer TP) of the resharding table and equal TPs (the replicated case
# of issue #27), over models of 1 and 2 KV heads (TP > H on one side or both) and 6 (GQA-sized
# groups of 2 and 3 heads per rank).
HANDSHAKE_TPS = [*TP_CHANGES, (2, 2), (4, 4)]
HANDSHAKE_HEADS = (1, 2, 6)


def rank_descriptors(case, spec, total: int, tp: int) -> list[dict] | None:
    """Every rank's descriptor of a model of ``total`` KV heads at TP ``tp`` in the consumer's
    layout and dtype (None: the heads do not split over ``tp``)."""
    out = []
    for rank in range(tp):
        try:
            heads = R.connector.rank_heads(total, tp, rank)
        except ValueError:
            return None
        g = dataclasses.replace(spec.geometry, num_kv_heads=len(heads))
        out.append(compat.describe(spec.layout, g, tp_rank=rank, tp_size=tp, total_kv_heads=total, kv_cache_dtype=spec.kv_cache_dtype,
                                   k_scale=0.5, v_scale=0.25, backend=case.backend.name))
    return out


@pytest.mark.kvc_op("handshake")
@pytest.mark.kvc_clause("CONN-HANDSHAKE", "CONN-HANDSHAKE-RANKS")
def test_handshake_plans_every_rank_pair_as_kvconform_compat_does(case):
    # For each (producer TP, consumer TP, model heads): every consumer rank's plans from every
    # producer rank (descriptors only) agree with compat's in verdict, mode, conversions and value
    # ratios, and together give each consumer head the right model head exactly once, from a rank
    # that holds it — any replica of a replicated head will do.
    spec = case.spec(case.geometry(kv_cache_dtype=first_fp8(case), num_layers=LAYERS if "L" in case.layout.k_dims else 1), first_fp8(case))
    for producer_tp, consumer_tp in HANDSHAKE_TPS:
        for total in HANDSHAKE_HEADS:
            producers, consumers = rank_descriptors(case, spec, total, producer_tp), rank_descriptors(case, spec, total, consumer_tp)
            if producers is None or consumers is None:
                continue
            for rank, local in enumerate(consumers):
                slices = []
                for source, remote in enumerate(producers):
                    what = f"producer rank {source} of TP {producer_tp} (consumer rank {rank} of TP {consumer_tp}, {total} KV heads)"
                    want, got = compat.check(remote, local), backend_handshake(case, local, remote, what)
                    facts = lambda v: (v.compatible, (v.plan.mode, v.plan.steps, v.plan.ratios) if v.plan else None)  # noqa: E731
                    assert_equal("connector", case, facts(want), facts(got), f"handshake with {what} (kvconform.compat: {want.summary})")
                    foreign = [s for s in got.plan.slices if s.producer_rank != source]
                    assert_equal("connector", case, [], foreign, f"slices of the plan for {what} that name another producer rank")
                    slices += got.plan.slices
                problems = R.connector.slice_problems(total, producer_tp, consumer_tp, rank, slices)
                assert_equal("connector", case, [], problems, f"what consumer rank {rank} of TP {consumer_tp} receives from TP {producer_tp} "
                             f"over {total} KV heads, by the backend's plans")


# ----------------------------------------------------------------------------- interop row
@pytest.mark.kvc_needs("connector_ops")
@pytest.mark.kvc_clause("CONN-INTEROP", "CONN-INTEROP-RECEIVE")
def test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says(case, peers):
    me = interop.Endpoint(case.backend, case.layout)
    cells, sides, done = [], {}, {}
    for scenario in interop.SCENARIOS:
        producer_ranks = interop.producer_side(me, scenario, case.seed, case.device)
        sides[interop.side_key(*scenario.side(True))] = [r.descriptor for r in producer_ranks] if not isinstance(producer_ranks, str) else producer_ranks
        for peer in peers:
            key = (scenario, interop.consumer_key(peer, scenario))  # peers announcing the same cache get the same verdict
            if key not in done:
                done[key] = interop.evaluate(me, peer, scenario, producer_ranks, case.seed, case.device)
            cells.append({"consumer": peer.label, "consumer_platform": peer.platform, "scenario": scenario.name, **done[key]})
    received = interop.received(me, case.seed, case.device)
    case.facts.interop = {"endpoint": interop.endpoint_record(me, sides), "cells": cells, "received": received}
    failing = [(f"{c['scenario']} → {c['consumer']}", c) for c in cells if c["outcome"] == "fails"]
    failing += [(f"{c['scenario']}: {c['producer']} → {me.label}", c) for c in received if c["outcome"] == "fails"]
    if failing:
        lines = [f"  {where}: {c['detail']}" for where, c in failing[:6]]
        raise ConformanceFailure(f"connector: {len(failing)} of {len(cells) + len(received)} interop cells of {me.label} fail: blocks shipped as "
                                 f"kvconform.compat plans them do not land as the consumer's layout says\n" + "\n".join(lines) + f"\n  repro: {case.repro}",
                                 {"property": "connector", "mismatches": [{"where": where, "actual": c["detail"]} for where, c in failing[:6]]})
