"""Seeded faults of the KV connector: regions, export/import, re-blocking, descriptors and the
handshake (each names, in ``kills``, the checks that must fail).
"""

from __future__ import annotations

import dataclasses
import weakref

import torch

from kvconform import reference as R
from kvconform.reference import compat

from . import mutant
from .base import Gfx942Mutant, Mutant


def _proper_slice(heads, spec) -> bool:
    return heads is not None and len(heads) < spec.geometry.num_kv_heads


@mutant("connector_head_slice_off_by_one")
class ConnectorHeadSliceOffByOne(Mutant):
    """Hetero-TP slices start one head late (wrapping): rank r's slice is taken at the head
    offset of the next head, as an off-by-one in the rank → head arithmetic does (vllm#52516)."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_requested_heads", "test_resharding_gives_every_consumer_rank_exactly_its_heads",
             "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says")

    def _heads(self, heads, spec):
        return [(h + 1) % spec.geometry.num_kv_heads for h in heads] if _proper_slice(heads, spec) else heads

    def block_regions(self, cache, spec, block_ids, heads=None):
        return super().block_regions(cache, spec, block_ids, self._heads(heads, spec))

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, spec, block_ids, self._heads(heads, spec))

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, spec, block_ids, wire, self._heads(heads, spec), num_tokens)


def _as_if_head_major(layout):
    """The layout with N and H swapped wherever N is outside H: what an HND-minded connector sees."""
    def swap(dims):
        dims = list(dims)
        if "N" in dims and "H" in dims and dims.index("N") < dims.index("H"):
            i, j = dims.index("N"), dims.index("H")
            dims[i], dims[j] = dims[j], dims[i]
        return tuple(dims)
    return dataclasses.replace(layout, k_dims=swap(layout.k_dims), v_dims=swap(layout.v_dims), native=tuple((s,) for s in swap(layout.k_dims)), container=None)


@mutant("connector_nhd_slice_as_hnd")
class ConnectorNhdSliceAsHnd(Mutant):
    """Takes a head slice of an NHD (token-major) cache as if it were HND: one run per block
    side at ``h0·N·D`` — the hetero-TP corruption NIXL forces HND against (F.11, vllm#46204)."""

    catches = ("connector",)
    kills = ("test_head_slice_regions_cover_exactly_the_requested_heads", "test_resharding_gives_every_consumer_rank_exactly_its_heads")

    def _spec(self, spec, heads):
        return dataclasses.replace(spec, layout=_as_if_head_major(spec.layout)) if _proper_slice(heads, spec) else spec

    def block_regions(self, cache, spec, block_ids, heads=None):
        return super().block_regions(cache, self._spec(spec, heads), block_ids, heads)

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, self._spec(spec, heads), block_ids, heads)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, self._spec(spec, heads), block_ids, wire, heads, num_tokens)


@mutant("connector_wire_casts_values")
class ConnectorWireCastsValues(Mutant):
    """Serialises the wire through fp32 values (``.float().to(dtype)``) where a bit copy was
    meant: NaN payloads are canonicalised, fp8 NaN codes collapse to one."""

    catches = ("connector",)
    kills = ("test_exported_blocks_import_bit_for_bit",)

    def export_blocks(self, cache, spec, block_ids, heads=None):
        wire = super().export_blocks(cache, spec, block_ids, heads)
        dtype = wire.geometry.dtype
        cast = wire.data.view(dtype).float().to(dtype).view(torch.uint8)
        return dataclasses.replace(wire, data=cast)


@mutant("connector_import_into_a_copy")
class ConnectorImportIntoACopy(Mutant):
    """The receive step works on a temporary (``cache.clone()``) instead of the cache in place:
    every import vanishes (F.26, vllm#30448 review)."""

    catches = ("connector",)
    kills = ("test_exported_blocks_import_bit_for_bit",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache.clone(), spec, block_ids, wire, heads, num_tokens)


@mutant("connector_reblock_drops_last_partial_block")
class ConnectorReblockDropsLastPartialBlock(Mutant):
    """Re-blocking copies whole wire blocks only: the tokens of a last, partial block are lost."""

    catches = ("connector",)
    kills = ("test_block_size_translation_keeps_every_token",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        if num_tokens is not None:
            num_tokens -= num_tokens % wire.geometry.block_size
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


@mutant("connector_hybrid_group_other_head_size")
class ConnectorHybridGroupOtherHeadSize(Mutant):
    """Ships every layer group with the head size of the first cache the engine registered (one
    ``block_len`` for all groups): a hybrid model's second group is sliced with the first's."""

    catches = ("connector",)
    kills = ("test_hybrid_model_groups_round_trip_each_with_its_own_geometry",)

    def __init__(self):
        super().__init__()
        self._registered = []  # (weak reference to a live cache of this engine, its head size)

    def allocate(self, buffer, spec):
        cache = super().allocate(buffer, spec)
        self._registered = [(ref, d) for ref, d in self._registered if ref() is not None] + [(weakref.ref(cache), spec.geometry.head_size)]
        return cache

    def _spec(self, spec):
        first = next((d for ref, d in self._registered if ref() is not None), spec.geometry.head_size)
        return dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, head_size=first))

    def export_blocks(self, cache, spec, block_ids, heads=None):
        return super().export_blocks(cache, self._spec(spec), block_ids, heads)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, self._spec(spec), block_ids, wire, heads, num_tokens)


@mutant("connector_handshake_accepts_inexact_fnuz_scale")
class ConnectorHandshakeAcceptsInexactFnuzScale(Gfx942Mutant):
    """The handshake compares fp8 formats, not scales: an e4m3fn peer is accepted by this
    e4m3fnuz engine at any scale ratio, though only consumer scales of twice the producer's
    convert exactly (F.21: NIXL's compatibility hash sees neither format nor scale)."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        formats = {local.get("fp8_format"), remote.get("fp8_format")}
        if formats == {"float8_e4m3fn", "float8_e4m3fnuz"}:  # "the same e4m3, up to the ×2 convention"
            factor = 0.5 if remote["fp8_format"] == "float8_e4m3fn" else 2.0
            remote = {**remote, "k_scale": local["k_scale"] * factor, "v_scale": local["v_scale"] * factor}
        return compat.check(remote, local)


@mutant("connector_regions_dense_plane_block_stride")
class ConnectorRegionsDensePlaneBlockStride(Mutant):
    """Registers block ``b`` at ``b·page/2``: the block stride of a dense K/V plane, not the
    blocks-first stride that spans both (the kernel- vs manager-block stride confusion, F.20)."""

    catches = ("connector",)
    kills = ("test_block_regions_cover_exactly_the_requested_blocks",)

    def block_regions(self, cache, spec, block_ids, heads=None):
        g = spec.geometry
        half_page = spec.layout.strides(g)["B"] * g.element_size // 2
        regions = []
        for b in block_ids:
            regions += [(offset - int(b) * half_page, length) for offset, length in super().block_regions(cache, spec, [b], heads)]
        return regions


@mutant("connector_descriptor_guesses_layout_from_shape")
class ConnectorDescriptorGuessesLayoutFromShape(Mutant):
    """Describes the cache from its live shape: ``shape[0] == 2`` read as kv-first, which a
    blocks-first cache of two blocks also has (F.25, LMCache#2494)."""

    catches = ("connector",)
    kills = ("test_layout_descriptor_describes_the_allocated_cache",)

    def layout_descriptor(self, cache, spec, **rank):
        if cache.shape[0] == 2:
            spec = dataclasses.replace(spec, layout=R.kv_first("NHD"))
        return super().layout_descriptor(cache, spec, **rank)


def _naive_rank_heads(total: int, tp: int, rank: int) -> range:
    """``[r·K/T, (r+1)·K/T)`` with integer division: right when the heads split, empty or off for replicated ranks."""
    return range(rank * total // tp, (rank + 1) * total // tp)


@mutant("connector_handshake_slices_ignore_replication")
class ConnectorHandshakeSlicesIgnoreReplication(Mutant):
    """Plans head slices with ``heads = [r·K/T, (r+1)·K/T)`` on both sides, the even-split formula
    without vLLM's replication branch: with more TP ranks than KV heads a rank holds an empty
    range, so some consumer ranks are sent nothing (issue #27, TP > H)."""

    catches = ("connector",)
    kills = ("test_handshake_plans_every_rank_pair_as_kvconform_compat_does",)

    def handshake(self, local, remote):
        verdict = compat.check(remote, local)
        if not verdict.compatible:
            return verdict
        p, c = verdict.plan.producer, verdict.plan.consumer
        total = c.total_kv_heads
        mine, theirs = _naive_rank_heads(total, c.tp_size, c.tp_rank), _naive_rank_heads(total, p.tp_size, p.tp_rank)
        slices = tuple(R.connector.HeadSlice(p.tp_rank, range(h - theirs.start, h - theirs.start + 1), range(i, i + 1))
                       for i, h in enumerate(mine) if h in theirs)
        return dataclasses.replace(verdict, plan=dataclasses.replace(verdict.plan, slices=slices))


@mutant("connector_handshake_ignores_layer_grouping")
class ConnectorHandshakeIgnoresLayerGrouping(Mutant):
    """Compares the per-layer page (block size, heads, head size, dtype, scales) and not how
    layers are allocated: a cross-layer producer (one allocation of every layer) is taken by a
    per-layer consumer, and the reverse, as if it were itself."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        verdict = compat.check(remote, local)
        return compat.check(local, local) if verdict.kind == "layers" else verdict


@mutant("connector_handshake_k_scale_only")
class ConnectorHandshakeKScaleOnly(Mutant):
    """Judges the fp8 hand-off by ``k_scale`` alone and applies K's value ratio to V as well: a
    peer whose V is scaled apart from K is planned at the wrong V ratio (or refused/accepted for K's sake)."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        if local.get("k_scale") is None or remote.get("k_scale") is None:
            return compat.check(remote, local)
        return compat.check({**remote, "v_scale": remote["k_scale"]}, {**local, "v_scale": local["k_scale"]})


def _physical_shape(descriptor: dict) -> tuple[int, ...]:
    endpoint = compat.parse(descriptor)
    return tuple(endpoint.geometry.extent(s.split(":")[0]) for s in endpoint.layout.k_dims)


@mutant("connector_handshake_layout_by_shape")
class ConnectorHandshakeLayoutByShape(Mutant):
    """Takes a peer whose cache tensor has its own shape for its own layout: at 2 KV heads vLLM's
    packed K‖V E3 spec and the 2-slot spec are both ``[L, B, 2, N, 2·D]`` (LMCache#4467), and the
    plan ships regions where the bytes sit elsewhere."""

    catches = ("connector",)
    kills = ("test_handshake_accepts_exactly_the_peers_kvconform_compat_accepts",)

    def handshake(self, local, remote):
        if local.get("dims") != remote.get("dims") and _physical_shape(local) == _physical_shape(remote):
            same = ("dims", "strides", "v_dims", "v_strides", "block_pad", "tile", "layout", "era", "alias")
            remote = {**remote, **{k: local.get(k) for k in same}}
        return compat.check(remote, local)


@mutant("connector_import_bytes_of_another_dtype")
class ConnectorImportBytesOfAnotherDtype(Mutant):
    """Imports a wire of another fp8 format byte for byte (the element sizes agree): an e4m3fn
    wire lands in an e4m3fnuz cache as fnuz codes (every value halved, −0 a NaN), e5m2 in e4m3."""

    catches = ("connector",)
    kills = ("test_a_wire_of_another_dtype_is_refused_or_converted_exactly",)

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        g = spec.geometry
        if wire.geometry.dtype != g.dtype and wire.geometry.element_size == g.element_size:
            wire = dataclasses.replace(wire, geometry=dataclasses.replace(wire.geometry, dtype=g.dtype))
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


@mutant("connector_multi_head_slice_head_major")
class ConnectorMultiHeadSliceHeadMajor(Mutant):
    """Lands a slice of two or more heads on a token-major (NHD) cache head-major: the wire's
    ``[N][h][D]`` rows read as ``[h][N][D]`` (right for one head, and for the whole rank)."""

    catches = ("connector",)
    kills = ("test_resharding_gives_every_consumer_rank_exactly_its_heads", "test_hybrid_model_groups_round_trip_each_with_its_own_geometry")

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        if _proper_slice(heads, spec) and len(heads) >= 2 and _as_if_head_major(spec.layout) != spec.layout:
            wire = dataclasses.replace(wire, layout=_as_if_head_major(wire.layout))
        super().import_blocks(cache, spec, block_ids, wire, heads, num_tokens)


@mutant("connector_export_head_range_from_first_head")
class ConnectorExportHeadRangeFromFirstHead(Mutant):
    """Exports heads ``[h0, h1)`` as the first ``h1 - h0`` heads: the slice's length is right, its
    start offset forgotten (a pointer advanced by the block but not by ``h0``)."""

    catches = ("connector",)
    kills = ("test_exported_head_ranges_import_bit_for_bit", "test_resharding_gives_every_consumer_rank_exactly_its_heads")

    def export_blocks(self, cache, spec, block_ids, heads=None):
        if heads is not None and len(heads) and heads[0] > 0:
            heads = range(0, len(heads))
        return super().export_blocks(cache, spec, block_ids, heads)


@mutant("connector_hybrid_group_first_block_size")
class ConnectorHybridGroupFirstBlockSize(ConnectorHybridGroupOtherHeadSize):
    """Ships every layer group with the block size of the first cache the engine registered (one
    ``block_len`` for all groups): a hybrid model's second group, of another block size, is
    cut at the first group's token count per block."""

    kills = ("test_hybrid_model_groups_round_trip_each_with_its_own_geometry",)

    def allocate(self, buffer, spec):
        cache = Mutant.allocate(self, buffer, spec)
        self._registered = [(ref, n) for ref, n in self._registered if ref() is not None] + [(weakref.ref(cache), spec.geometry.block_size)]
        return cache

    def _spec(self, spec):
        first = next((n for ref, n in self._registered if ref() is not None), spec.geometry.block_size)
        return dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, block_size=first))


@mutant("connector_regions_repeat_a_run")
class ConnectorRegionsRepeatARun(Mutant):
    """Reports the last run of every region list twice (a K/V loop that appends its final region
    again): every byte is there, some twice — a transfer ships them twice and the byte counts of
    the two sides disagree."""

    catches = ("connector",)
    kills = ("test_block_regions_cover_exactly_the_requested_blocks", "test_resharding_gives_every_consumer_rank_exactly_its_heads",
             "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says")

    def block_regions(self, cache, spec, block_ids, heads=None):
        regions = super().block_regions(cache, spec, block_ids, heads)
        return regions + regions[-1:]


# Per block: every layer, K then V, [H][N][D] — a head-major wire form.
HEAD_MAJOR_WIRE = R.layouts.permuted("WIRE", "head-major", (("B",), ("L",), ("2",), ("H",), ("N",), ("D",)), range(6))


@mutant("connector_import_assumes_own_wire_layout")
class ConnectorImportAssumesOwnWireLayout(Mutant):
    """Declares a head-major wire form and reads every wire it receives in that form, whatever
    the wire says: its own exports round-trip, a peer's canonical wire lands scrambled (seen only
    as a consumer of another endpoint: the interop row's received cells)."""

    catches = ("connector",)
    kills = ("test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says",)

    def wire_layout(self, spec):
        return HEAD_MAJOR_WIRE

    def import_blocks(self, cache, spec, block_ids, wire, heads=None, num_tokens=None):
        super().import_blocks(cache, spec, block_ids, dataclasses.replace(wire, layout=HEAD_MAJOR_WIRE), heads, num_tokens)


@mutant("connector_reshard_routes_heads_to_the_wrong_device")
class ConnectorReshardRoutesHeadsToTheWrongDevice(Mutant):
    """Its handshake plans, for consumer rank r, the slices of consumer rank r + 1 (wrapping): every
    slice goes to the next consumer rank, so on two GPUs the heads of one GPU's ranks land on the
    other's (an off-by-one in the rank → peer table of a P/D connector; issue #41)."""

    catches = ("connector",)
    kills = ("test_resharding_between_devices_lands_every_consumers_heads",)
    # The check runs only with two devices: the CPU stand-in, and only that check (each spawns processes).
    suite_args = ("--kvc-devices", "cpu,cpu", "-k", "between_devices")

    def handshake(self, local, remote):
        verdict = compat.check(remote, local)
        if not verdict.compatible or verdict.plan.consumer.tp_size == 1:
            return verdict
        p, c = verdict.plan.producer, verdict.plan.consumer
        meant_for_next = R.connector.head_slices(c.total_kv_heads, p.tp_size, c.tp_size, (c.tp_rank + 1) % c.tp_size)
        slices = tuple(s for s in meant_for_next if s.producer_rank == p.tp_rank)
        return dataclasses.replace(verdict, plan=dataclasses.replace(verdict.plan, slices=slices))
