"""Seeded faults of latent caches: ``reference_mla`` with one way a record, a reader or a plan can be
wrong each (issue 35; field bugs in ../shared/spec/MLA_AND_QUANT_FACTS.md). Every one must be caught by
the families it names (``catches``).
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from ..latent_contract import LATENT_KINDS
from ..reference_mla import (
    Gfx942ReferenceMLA,
    ReferenceMLA,
    latent_formats,
    on_cpu,
    region_of,
)
from . import mutant


class LatentMutant(ReferenceMLA):
    catches: tuple[str, ...] = ()  # check families that must fail
    kills: tuple[str, ...] = ()  # checks that must fail, at least one of each family in catches (tests/mutant_focus.py)
    suite_args: tuple[str, ...] = ()
    kinds: tuple[str, ...] = LATENT_KINDS  # the record kinds it declares: those its fault is in (fewer cases to run)

    def __init__(self):
        super().__init__(formats=tuple(f for f in latent_formats(self.platform, self.arch()) if f.kind in self.kinds))


def _written(slot_mapping, spec, tokens: int):
    """(token indices, blocks, rows) of the non-padding slots among the first ``tokens``."""
    slots = slot_mapping.long().cpu()[:tokens]
    token = (slots >= 0).nonzero().flatten()
    N = spec.geometry.block_size
    return token, slots[token] // N, slots[token] % N


def _scratch_write(spec, write) -> torch.Tensor:
    """The reference's bytes of a write, made on a zeroed copy of the cache (for a mutant that then
    places them wrongly)."""
    scratch = torch.zeros(spec.geometry.nbytes(), dtype=torch.uint8)
    write(scratch)
    return scratch


# ----------------------------------------------------------------------------- shape
@mutant("latent_ds_mla_semantic_head_size")
class LatentDsMlaSemanticHeadSize(LatentMutant):
    """Shapes an fp8_ds_mla cache ``(B, N, 576)`` — the semantic head size ``kv_lora_rank + rope_dim`` —
    instead of its 656-byte record width (vllm#47716); its writer strides records by 576 bytes."""

    catches = ("shape", "write")
    kinds = ("fp8_ds_mla",)
    kills = ("test_latent_cache_rows_are_as_wide_as_their_own_record",
             "test_a_multi_layer_allocation_puts_the_layer_dim_first",
             "test_latent_records_land_in_their_slots_and_nothing_else_changes")

    def latent_allocate(self, buffer, spec):
        if spec.fmt.kind != "fp8_ds_mla":
            return super().latent_allocate(buffer, spec)
        g = spec.geometry
        shape = (*g.shape()[:-1], spec.fmt.width())
        return buffer[: g.nbytes() // spec.fmt.entry_bytes() * spec.fmt.width()].view(shape)

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        if spec.fmt.kind != "fp8_ds_mla":
            return super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        token, blocks, rows = _written(slot_mapping, spec, slot_mapping.numel())
        records = R.latent.ds_mla_records(kv_c.cpu()[token], k_pe.cpu()[token], R.latent.ScalePolicy.ds_mla("0.33.0", self.platform, self.arch()), spec.fmt.e4m3)
        g, width = spec.geometry, spec.fmt.width()
        starts = spec.layer * g.layer_bytes() + (blocks * g.block_size + rows) * width  # 576-byte strides
        flat = torch.as_strided(cache, (cache.numel(),), (1,), cache.storage_offset())
        at = starts[:, None] + torch.arange(records.shape[1])
        keep = (at < flat.numel()).all(dim=1)
        flat[at[keep].to(flat.device)] = records[keep].to(flat.device)


@mutant("latent_binding_rejects_declared_block_size")
class LatentBindingRejectsDeclaredBlockSize(LatentMutant):
    """Declares block sizes 16 and 64, but its writer binding accepts only 64 (FlashMLA's block size):
    a configuration accepted at declaration that the cache binding rejects at run time (vllm#55431)."""

    catches = ("shape",)
    kinds = ("mla",)
    kills = ("test_every_declared_block_size_is_accepted_by_the_writer",)

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        if spec.geometry.block_size != 64:
            raise ValueError(f"concat_and_cache_mla: block_size {spec.geometry.block_size} is not supported (expected 64)")
        super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)


# ----------------------------------------------------------------------------- write
@mutant("latent_rope_stored_quantised")
class LatentRopeStoredQuantised(LatentMutant):
    """fp8_ds_mla writer that quantises the RoPE part too: e4m3 codes of ``k_pe / scale₀`` in the
    first 64 RoPE bytes, zeros after, instead of the raw 16-bit values."""

    catches = ("write", "equivalence")
    kinds = ("fp8_ds_mla",)
    kills = ("test_latent_records_land_in_their_slots_and_nothing_else_changes",
             "test_golden_records_hash_to_the_stored_digest_of_their_format")

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        if spec.fmt.kind != "fp8_ds_mla":
            return
        token, blocks, rows = _written(slot_mapping, spec, slot_mapping.numel())
        fields = R.latent.field_offsets(spec.geometry, blocks, rows, spec.layer)
        region = region_of(cache, spec)
        scales = region[fields["scales"][:, :4].to(region.device)].cpu().contiguous().view(torch.float32)
        codes = R.fp8.quantize(k_pe.cpu()[token].float() / scales, 1.0, spec.fmt.e4m3).view(torch.uint8)
        region[fields["rope"].to(region.device)] = torch.cat([codes, torch.zeros_like(codes)], dim=1).to(region.device)


@mutant("latent_tile_scale_not_pow2")
class LatentTileScaleNotPow2(LatentMutant):
    """fp8_ds_mla and UE8M0 indexer scales kept as the raw float ``amax / 448`` instead of rounded up to
    a power of two (an older kernel's policy, run as 0.33.0)."""

    catches = ("write", "equivalence")
    kinds = ("fp8_ds_mla", "indexer")
    kills = ("test_stored_scales_follow_the_scale_policy_of_the_platform", "test_golden_records_hash_to_the_stored_digest_of_their_format")

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        if spec.fmt.kind != "fp8_ds_mla":
            return super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        policy = dataclasses.replace(R.latent.ScalePolicy.ds_mla("0.33.0", self.platform, self.arch()), pow2=False)
        on_cpu([region_of(cache, spec)], lambda region: R.latent.concat_and_cache_ds_mla(kv_c.cpu(), k_pe.cpu(), region, spec.geometry, slot_mapping,
                                                                                   policy=policy, layer=spec.layer))

    def indexer_write(self, cache, k, slot_mapping, spec):
        if spec.fmt.scale_format == "float32":
            return super().indexer_write(cache, k, slot_mapping, spec)
        policy = dataclasses.replace(R.latent.ScalePolicy.indexer(spec.fmt.scale_format, self.platform, self.arch()), pow2=False)
        on_cpu([region_of(cache, spec)], lambda region: R.latent.indexer_k_quant_and_cache(k.cpu(), region, spec.geometry, slot_mapping,
                                                                                     policy=policy, layer=spec.layer))


@mutant("latent_divisor_448_on_rocm")
class LatentDivisor448OnRocm(Gfx942ReferenceMLA, LatentMutant):
    """An MI300 (gfx942) build that divides the ds_mla tile and indexer amax by 448 — the e4m3fn max — though
    its codes are e4m3fnuz (max 240): vLLM's ``kFp8ScaleDivisor`` is 224 there."""

    catches = ("write", "equivalence")
    kinds = ("fp8_ds_mla", "indexer")
    kills = ("test_stored_scales_follow_the_scale_policy_of_the_platform", "test_golden_records_hash_to_the_stored_digest_of_their_format")

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        if spec.fmt.kind != "fp8_ds_mla":
            return super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        policy = R.latent.ScalePolicy.ds_mla("0.33.0", "cuda")
        on_cpu([region_of(cache, spec)], lambda region: R.latent.concat_and_cache_ds_mla(kv_c.cpu(), k_pe.cpu(), region, spec.geometry, slot_mapping,
                                                                                   policy=policy, layer=spec.layer))

    def indexer_write(self, cache, k, slot_mapping, spec):
        policy = R.latent.ScalePolicy.indexer(spec.fmt.scale_format, "cuda")
        on_cpu([region_of(cache, spec)], lambda region: R.latent.indexer_k_quant_and_cache(k.cpu(), region, spec.geometry, slot_mapping,
                                                                                     policy=policy, layer=spec.layer))


@mutant("latent_indexer_per_token")
class LatentIndexerPerToken(LatentMutant):
    """Lays the indexer cache out per token — 128 value bytes then the token's scale bytes, a
    132-byte record per row — instead of per block (all values of the block, then all scales)."""

    catches = ("write",)
    kinds = ("indexer",)
    kills = ("test_latent_records_land_in_their_slots_and_nothing_else_changes",
             "test_stored_codes_are_the_inputs_encoded_with_the_records_own_scales")

    def indexer_write(self, cache, k, slot_mapping, spec):
        g = spec.geometry
        scratch = _scratch_write(spec, lambda region: R.latent.indexer_k_quant_and_cache(k.cpu(), region, g, slot_mapping, layer=spec.layer))
        _, blocks, rows = _written(slot_mapping, spec, k.shape[0])
        fields = R.latent.field_offsets(g, blocks, rows, spec.layer)
        record = torch.cat([scratch[fields["values"]], scratch[fields["scales"]]], dim=1)
        per_token = spec.layer * g.layer_bytes() + blocks * g.block_bytes() + rows * g.fmt.entry_bytes()
        region = region_of(cache, spec)
        region[(per_token[:, None] + torch.arange(record.shape[1])).to(region.device)] = record.to(region.device)


def _wrapped(blocks: torch.Tensor, spec) -> torch.Tensor:
    """Block ids as a kernel with a 32-bit byte offset ``block · block_bytes`` reaches them: past 2^31 the
    offset loses bit 31 (whole blocks: the block it lands in)."""
    size = spec.geometry.block_bytes()
    return ((blocks.long() * size) & 0x7FFFFFFF) // size


@mutant("latent_int32_block_offset")
class LatentInt32BlockOffset(LatentMutant):
    """The MLA writers and gathers compute a block's byte offset in 32-bit arithmetic (vllm#52109,
    vllm#56037): past 2^31 bytes they write and read blocks near the start of the cache."""

    catches = ("write", "read")
    kills = ("test_last_block_of_a_latent_cache_past_2_31_bytes_is_written",
             "test_gathers_read_the_last_block_of_a_latent_cache_past_2_31_bytes")

    def _remap(self, slot_mapping, spec):
        N = spec.geometry.block_size
        slots = slot_mapping.long().cpu()
        keep = slots >= 0
        return torch.where(keep, _wrapped(slots.clamp(min=0) // N, spec) * N + slots.clamp(min=0) % N, slots).to(slot_mapping.device)

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        super().latent_write(cache, kv_c, k_pe, self._remap(slot_mapping, spec), spec, scale=scale)

    def indexer_write(self, cache, k, slot_mapping, spec):
        super().indexer_write(cache, k, self._remap(slot_mapping, spec), spec)

    def latent_gather(self, cache, block_table, seq_lens, spec, *, scale):
        return super().latent_gather(cache, _wrapped(block_table.cpu(), spec), seq_lens, spec, scale=scale)

    def indexer_gather(self, cache, block_table, seq_lens, spec):
        return super().indexer_gather(cache, _wrapped(block_table.cpu(), spec), seq_lens, spec)


@mutant("latent_padding_slot_written")
class LatentPaddingSlotWritten(LatentMutant):
    """Python-style negative indexing in the latent writers: slot -1 writes the cache's last slot."""

    catches = ("write",)
    kinds = ("mla", "indexer")
    kills = ("test_padding_slots_leave_the_latent_cache_untouched",)

    def _last(self, slot_mapping, spec):
        g = spec.geometry
        return torch.where(slot_mapping < 0, torch.full_like(slot_mapping, g.num_blocks * g.block_size - 1), slot_mapping)

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        padding = (slot_mapping < 0).nonzero().flatten()
        super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        if padding.numel():  # the last padded token wins
            only = torch.full_like(slot_mapping, -1)
            only[padding[-1]] = self._last(slot_mapping, spec)[padding[-1]]
            super().latent_write(cache, kv_c, k_pe, only, spec, scale=scale)

    def indexer_write(self, cache, k, slot_mapping, spec):
        padding = (slot_mapping[: k.shape[0]] < 0).nonzero().flatten()
        super().indexer_write(cache, k, slot_mapping, spec)
        if padding.numel():
            only = torch.full_like(slot_mapping, -1)
            only[padding[-1]] = self._last(slot_mapping, spec)[padding[-1]]
            super().indexer_write(cache, k, only, spec)


@mutant("latent_kv_c_k_pe_swapped")
class LatentKvcKpeSwapped(LatentMutant):
    """Plain MLA writer that stores ``k_pe`` first and ``kv_c`` after it in each entry."""

    catches = ("write", "equivalence")
    kinds = ("mla",)
    kills = ("test_latent_records_land_in_their_slots_and_nothing_else_changes",
             "test_golden_records_hash_to_the_stored_digest_of_their_format")

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        if spec.fmt.kind != "mla":
            return super().latent_write(cache, kv_c, k_pe, slot_mapping, spec, scale=scale)
        entry = torch.cat([k_pe.cpu(), kv_c.cpu()], dim=1)
        R_ = spec.fmt.kv_lora_rank
        super().latent_write(cache, entry[:, :R_], entry[:, R_:], slot_mapping, spec, scale=scale)


@mutant("latent_strided_rows_read_as_contiguous")
class LatentStridedRowsReadAsContiguous(LatentMutant):
    """The writer ignores its inputs' row stride: ``kv_c`` and ``k_pe`` are read as if contiguous from
    their first element (right only when they are not slices of one projection output)."""

    catches = ("write",)
    kinds = ("mla", "indexer")
    kills = ("test_latent_rows_are_read_through_their_strides",)

    @staticmethod
    def _dense(x):
        return torch.as_strided(x, x.shape, (x.shape[1], 1), x.storage_offset())

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        super().latent_write(cache, self._dense(kv_c), self._dense(k_pe), slot_mapping, spec, scale=scale)

    def indexer_write(self, cache, k, slot_mapping, spec):
        super().indexer_write(cache, self._dense(k), slot_mapping, spec)


@mutant("latent_grouped_first_layer_slots")
class LatentGroupedFirstLayerSlots(LatentMutant):
    """Grouped multi-layer writer that indexes the ``[L, T]`` slot mappings with layer 0's row for every
    layer (a missing ``layer · stride(0)``)."""

    catches = ("write",)
    kinds = ("mla",)
    kills = ("test_grouped_writer_writes_each_layer_from_its_own_rows_and_slots",)

    def latent_grouped_write(self, per_layer_cache, kv_cs, k_pes, slot_mappings, specs, *, scales):
        super().latent_grouped_write(per_layer_cache, kv_cs, k_pes, [slot_mappings[0]] * len(slot_mappings), specs, scales=scales)


# ----------------------------------------------------------------------------- read
@mutant("latent_gather_off_by_one_block")
class LatentGatherOffByOneBlock(LatentMutant):
    """The gathers read block ``block_table[s, j] + 1`` (an off-by-one in the block index)."""

    catches = ("read",)
    kills = ("test_gather_returns_exactly_the_written_latent", "test_indexer_gather_returns_the_stored_value_and_scale_bytes")

    def latent_gather(self, cache, block_table, seq_lens, spec, *, scale):
        return super().latent_gather(cache, (block_table + 1) % spec.geometry.num_blocks, seq_lens, spec, scale=scale)

    def indexer_gather(self, cache, block_table, seq_lens, spec):
        return super().indexer_gather(cache, (block_table + 1) % spec.geometry.num_blocks, seq_lens, spec)


@mutant("latent_decode_rope_as_v")
class LatentDecodeRopeAsV(LatentMutant):
    """MLA decode that takes V from the last ``kv_lora_rank`` latent values (the RoPE part included)
    instead of the first."""

    catches = ("read",)
    kinds = ("mla", "fp8_ds_mla")
    kills = ("test_mla_decode_equals_sdpa_on_the_dense_latent",)

    def latent_decode(self, query, cache, block_table, seq_lens, spec, *, scale, softmax_scale):
        fmt = spec.fmt
        out = []
        tokens = R.latent.gather_latent(region_of(cache, spec).cpu(), spec.geometry, block_table.cpu(), seq_lens.cpu(), scale=scale, layer=spec.layer).float()
        start = 0
        for s, n in enumerate(seq_lens.tolist()):  # per sequence: a mutant, not the reference
            latent = tokens[start : start + n]
            start += n
            weights = torch.softmax(query[s].float().cpu() @ latent.T * softmax_scale, dim=-1)
            out.append(weights @ latent[:, -fmt.kv_lora_rank :])
        return torch.stack(out).to(fmt.model_dtype).to(query.device)


# ----------------------------------------------------------------------------- copy and swap
@mutant("latent_copy_values_without_indexer_scales")
class LatentCopyValuesWithoutIndexerScales(LatentMutant):
    """Block copy of an indexer cache that moves each block's value region (``N · D`` bytes) but not
    the scales region after it (sglang#30057's kind: indexer pages without their scales)."""

    catches = ("copy",)
    kinds = ("indexer",)
    kills = ("test_copy_moves_whole_records_and_indexer_pages_of_every_layer",)

    def latent_copy(self, cache, block_mapping, spec):
        if spec.fmt.kind != "indexer":
            return super().latent_copy(cache, block_mapping, spec)
        g = spec.geometry
        region = region_of(cache, spec)
        values = g.block_size * g.fmt.kv_lora_rank
        for src, dst in block_mapping.tolist():
            for (s, _), (d, _) in zip(R.latent.block_byte_ranges(g, [src]), R.latent.block_byte_ranges(g, [dst])):
                region[d : d + values] = region[s : s + values].clone()


@mutant("latent_swap_first_layer_only")
class LatentSwapFirstLayerOnly(LatentMutant):
    """Swaps one block per id — layer 0's — on a multi-layer latent allocation, as if every layer had
    its own tensor."""

    catches = ("swap",)
    kinds = ("mla",)
    kills = ("test_swap_moves_whole_blocks_of_every_layer_between_device_and_host",)

    def latent_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        src, dst = region_of(src_cache, src_spec), region_of(dst_cache, dst_spec)
        g = src_spec.geometry
        size = g.block_bytes()
        for s, d in zip(src_ids.tolist(), dst_ids.tolist()):
            dst[d * size : (d + 1) * size] = src[s * size : (s + 1) * size].to(dst.device)


# ----------------------------------------------------------------------------- connector
@mutant("latent_plan_pulls_from_two_ranks")
class LatentPlanPullsFromTwoRanks(LatentMutant):
    """TP plan that, with more producer than consumer ranks, pulls each block from every producer rank
    whose heads the consumer would cover — as for a K/V cache — though the latent is replicated."""

    catches = ("connector",)
    kinds = ("mla",)
    kills = ("test_each_consumer_rank_pulls_each_block_from_exactly_one_producer_rank",)

    def latent_transfer_plan(self, producer_tp, consumer_tp, consumer_rank, blocks):
        if producer_tp <= consumer_tp:
            return super().latent_transfer_plan(producer_tp, consumer_tp, consumer_rank, blocks)
        per = producer_tp // consumer_tp
        ranks = range(consumer_rank * per, consumer_rank * per + per)
        return [(int(b), r) for b in blocks for r in ranks]


@mutant("latent_regions_sliced_by_head")
class LatentRegionsSlicedByHead(LatentMutant):
    """``latent_regions`` with a head slice returns the slice's share of each record (as for K/V heads)
    instead of refusing it: the latent is one replicated vector, not heads."""

    catches = ("connector",)
    kinds = ("mla",)
    kills = ("test_a_head_slice_of_a_latent_cache_is_refused",)

    def latent_regions(self, spec, blocks, heads=None):
        whole = R.latent.block_byte_ranges(spec.geometry, blocks)
        if heads is None:
            return whole
        share = spec.fmt.entry_bytes() // max(heads.stop, 1)
        return [(start + heads.start * share, len(heads) * share) for start, _ in whole]


@mutant("latent_regions_without_indexer_scales")
class LatentRegionsWithoutIndexerScales(LatentMutant):
    """Connector regions of an indexer cache that cover each block's values region (``N · D`` bytes) but
    not its scales: the indexer keys arrive without the scales that decode them (sglang#30057's kind)."""

    catches = ("connector",)
    kinds = ("indexer",)
    kills = ("test_latent_regions_are_whole_blocks_of_every_layer_and_nothing_else",)

    def latent_regions(self, spec, blocks, heads=None):
        whole = super().latent_regions(spec, blocks, heads)
        if spec.fmt.kind != "indexer":
            return whole
        return [(start, spec.geometry.block_size * spec.fmt.kv_lora_rank) for start, _ in whole]


@mutant("latent_descriptor_ignores_rope_dtype")
class LatentDescriptorIgnoresRopeDtype(LatentMutant):
    """Handshake descriptor without the RoPE dtype: a peer whose raw RoPE values are fp16 looks like
    one whose are bf16."""

    catches = ("connector",)
    kinds = ("mla", "fp8_ds_mla")
    kills = ("test_descriptor_refuses_a_peer_with_another_record_format",)

    def latent_descriptor(self, spec):
        return {k: v for k, v in super().latent_descriptor(spec).items() if k != "rope_dtype"}
