"""kvconform.compat's ``cache`` section: latent (MLA) and quantised caches. A descriptor round-trips;
a peer whose record, mode, code format or scale placement differs is refused, naming the field;
a latent cache moves whole blocks from exactly one producer rank (⌊d·P/D⌋) and has no head slice;
a quantised cache's head slice moves its scales with its data — and a copy that leaves them behind
is caught; another order, block size or nvfp4 V-scale placement is converted exactly through both offset maps."""

import dataclasses
import itertools
import json

import pytest
import torch

from kvconform import compat
from kvconform.reference import latent as L
from kvconform.reference import quant_layouts as QL

LATENT_FORMATS = {
    "mla-bf16": L.LatentFormat(kind="mla"), "mla-fp8": L.LatentFormat(kind="mla", cache_dtype="fp8"),
    "fp8_ds_mla": L.LatentFormat(kind="fp8_ds_mla"), "indexer-ue8m0": L.LatentFormat(kind="indexer", scale_format="ue8m0"),
    "indexer-shuffle-gfx942": L.LatentFormat(kind="indexer", indexer_layout="shuffle", platform="rocm", arch="gfx942"),
}
QUANT_CASES = [("int8_per_token_head", "HND"), ("fp8_per_token_head", "NHD"), ("nvfp4", "HND"), ("nvfp4", "NHD")]


def latent_rank(fmt=LATENT_FORMATS["fp8_ds_mla"], tp_rank=0, tp_size=1, block_size=16, **kw) -> dict:
    return compat.describe_latent(L.LatentGeometry(num_blocks=6, block_size=block_size, fmt=fmt, num_layers=2), tp_rank=tp_rank, tp_size=tp_size, **kw)


def quant_geometry(mode, order, heads=4, block_size=16, v_scales=QL.SWIZZLED) -> QL.QuantGeometry:
    return QL.QuantGeometry(num_blocks=6, block_size=block_size, num_kv_heads=heads, head_size=64, mode=mode, order=order, num_layers=2,
                            v_scales=v_scales)


def quant_ranks(mode, order, tp_size=1, block_size=16, v_scales=QL.SWIZZLED, **kw) -> list[dict]:
    g = quant_geometry(mode, order, heads=4 // tp_size, block_size=block_size, v_scales=v_scales)
    return [compat.describe_quant(g, tp_rank=r, tp_size=tp_size, total_kv_heads=4, **kw) for r in range(tp_size)]


def filled(nbytes: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (nbytes,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)


@pytest.mark.parametrize("name", LATENT_FORMATS)
def test_a_latent_descriptor_round_trips_through_json(name):
    descriptor = latent_rank(LATENT_FORMATS[name], tp_rank=1, tp_size=2)
    endpoint = compat.parse(json.loads(json.dumps(descriptor)))
    assert endpoint.geometry.fmt == LATENT_FORMATS[name] and (endpoint.tp_rank, endpoint.tp_size) == (1, 2)
    assert compat.describe_latent(endpoint.geometry, tp_rank=1, tp_size=2, k_scale=endpoint.scale) == descriptor


@pytest.mark.parametrize("mode,order", QUANT_CASES)
def test_a_quantised_descriptor_round_trips_through_json(mode, order):
    descriptor = quant_ranks(mode, order, tp_size=2, k_scale=0.5)[1]
    endpoint = compat.parse(json.loads(json.dumps(descriptor)))
    assert endpoint.geometry == quant_geometry(mode, order, heads=2) and endpoint.heads == range(2, 4)
    assert compat.describe_quant(endpoint.geometry, tp_rank=1, tp_size=2, k_scale=0.5) == descriptor


def test_a_ds_mla_peer_is_refused_by_a_plain_mla_cache_naming_the_record_field():
    verdict = compat.check(latent_rank(LATENT_FORMATS["fp8_ds_mla"]), latent_rank(LATENT_FORMATS["mla-bf16"]))
    assert not verdict.compatible and verdict.kind == "record"
    assert "record has kind 'fp8_ds_mla', the consumer's 'mla'" in verdict.reason


@pytest.mark.parametrize("change,field", [
    ({"model_dtype": torch.float16}, "rope_dtype"), ({"platform": "rocm", "arch": "gfx942"}, "fp8_variant"),
    ({"scale_format": "float32"}, "scale_policy.pow2"), ({"scale_format": "mx"}, "scale_format"),
])
def test_each_differing_record_field_is_refused_with_its_name(change, field):
    fmt = LATENT_FORMATS["indexer-ue8m0"] if "scale_format" in change else LATENT_FORMATS["fp8_ds_mla"]
    verdict = compat.check(latent_rank(dataclasses.replace(fmt, **change)), latent_rank(fmt))
    assert not verdict.compatible and f"record has {field} " in verdict.reason


def test_a_plain_mla_fp8_peer_at_another_latent_scale_is_refused():
    fmt = LATENT_FORMATS["mla-fp8"]
    assert compat.check(latent_rank(fmt, k_scale=0.5), latent_rank(fmt, k_scale=0.5)).compatible
    assert compat.check(latent_rank(fmt, k_scale=0.5), latent_rank(fmt, k_scale=1.0)).kind == "scale"


@pytest.mark.parametrize("producers,consumers", [(4, 2), (8, 2), (2, 4), (1, 4), (3, 2), (2, 3)])
def test_each_consumer_rank_takes_every_latent_block_from_producer_rank_d_p_over_d(producers, consumers):
    blocks = [5, 0, 3]
    for d in range(consumers):
        plans = [compat.check(latent_rank(tp_rank=p, tp_size=producers), latent_rank(tp_rank=d, tp_size=consumers)).plan
                 for p in range(producers)]
        senders = [p for p, plan in enumerate(plans) if plan.sends]
        assert senders == [d * producers // consumers] == sorted(set(L.replicated_block_sources(producers, consumers, d, blocks).values()))


def test_the_latent_plan_moves_whole_blocks_of_every_layer_bit_for_bit():
    plan = compat.check(latent_rank(tp_rank=2, tp_size=4), latent_rank(tp_rank=1, tp_size=2)).plan
    gp, gc = plan.producer.geometry, plan.consumer.geometry
    producer, consumer = filled(gp.nbytes(), 1), filled(gc.nbytes(), 2)
    want = consumer.clone()
    for (ps, n), (cs, _) in zip(L.block_byte_ranges(gp, [5, 0]), L.block_byte_ranges(gc, [2, 4])):
        want[cs:cs + n] = producer[ps:ps + n]
    compat.execute(plan, producer, [5, 0], consumer, [2, 4])
    assert torch.equal(consumer, want)


def test_a_latent_head_slice_is_refused():
    with pytest.raises(compat.DescriptorError, match="never sliced by head.*'num_kv_heads'"):
        compat.parse({**latent_rank(), "num_kv_heads": 1, "total_kv_heads": 2})
    plan = compat.check(latent_rank(), latent_rank()).plan
    assert len(plan.regions([1, 2])) == 4
    with pytest.raises(ValueError, match="no head slice"):
        plan.regions([1, 2], heads=range(1))


def fields_that_differ(plan, producer: torch.Tensor, consumer: torch.Tensor, pairs) -> list[str]:
    """The fields (codes, scales) of the plan's heads whose consumer bytes are not the producer's."""
    gp, gc = plan.producer.geometry, plan.consumer.geometry
    wrong = set()
    for s in plan.slices:
        for pb, cb in pairs:
            for layer in range(gp.num_layers):
                want = QL.field_offsets(gp, pb, torch.arange(gp.block_size)[:, None], torch.tensor(list(s.producer_heads)), layer)
                got = QL.field_offsets(gc, cb, torch.arange(gc.block_size)[:, None], torch.tensor(list(s.consumer_heads)), layer)
                wrong |= {name for name in QL.FIELDS if not torch.equal(consumer[got[name]], producer[want[name]])}
    return sorted(wrong)


@pytest.mark.parametrize("mode,order", QUANT_CASES)
def test_a_head_slice_plan_moves_the_scales_with_the_data_and_leaving_them_behind_is_caught(mode, order):
    producer_rank, consumer_rank = quant_ranks(mode, order)[0], quant_ranks(mode, order, tp_size=2)[1]
    plan = compat.check(producer_rank, consumer_rank).plan
    assert plan.mode == "regions" and [(s.producer_heads, s.consumer_heads) for s in plan.slices] == [(range(2, 4), range(0, 2))]
    gp, gc, pairs = plan.producer.geometry, plan.consumer.geometry, [(5, 1), (0, 3)]
    producer = filled(gp.nbytes(), 2)
    consumer = torch.zeros(gc.nbytes(), dtype=torch.uint8)
    compat.execute(plan, producer, [5, 0], consumer, [1, 3])
    assert fields_that_differ(plan, producer, consumer, pairs) == []
    data_only = torch.zeros_like(consumer)
    for (pb, cb), layer, name in itertools.product(pairs, range(2), ("k_data", "v_data")):  # a connector that moves the codes only
        at_p = QL.field_offsets(gp, pb, torch.arange(gp.block_size)[:, None], torch.arange(2, 4), layer)[name]
        at_c = QL.field_offsets(gc, cb, torch.arange(gc.block_size)[:, None], torch.arange(2), layer)[name]
        data_only[at_c] = producer[at_p]
    assert fields_that_differ(plan, producer, data_only, pairs) == ["k_scale", "v_scale"]


def test_nvfp4_head_slice_regions_hold_several_runs_per_side_per_page():
    plan = compat.check(quant_ranks("nvfp4", "HND")[0], quant_ranks("nvfp4", "HND", tp_size=2)[1]).plan
    assert plan.regions([3], range(2, 4)) == QL.head_slice_ranges(plan.producer.geometry, [3], range(2, 4))
    assert len(plan.regions([3], range(2, 4))) == 4 * 2  # K data, K scales, V data, V scales; two layers
    assert "8 runs per block over every layer, scales included" in str(compat.check(quant_ranks("nvfp4", "HND")[0], quant_ranks("nvfp4", "HND", tp_size=2)[1]))


def test_a_re_blocked_nvfp4_page_lands_with_its_v_scales_re_swizzled_and_nothing_else_changes():
    producer_rank = quant_ranks("nvfp4", "HND", block_size=16)[0]
    consumer_rank = quant_ranks("nvfp4", "NHD", block_size=8)[0]
    plan = compat.check(producer_rank, consumer_rank).plan
    assert plan.mode == "fields" and plan.steps == ("layout", "re-block")
    gp, gc = plan.producer.geometry, plan.consumer.geometry
    producer, consumer = filled(gp.nbytes(), 3), filled(gc.nbytes(), 4)
    before = consumer.clone()
    compat.execute(plan, producer, [4, 1], consumer, [0, 5, 2], num_tokens=21)  # the last 4-slot tile is partial
    t = torch.arange(21)
    for layer in range(2):
        want = QL.field_offsets(gp, torch.tensor([4, 1])[t // 16, None], (t % 16)[:, None], torch.arange(4), layer)
        got = QL.field_offsets(gc, torch.tensor([0, 5, 2])[t // 8, None], (t % 8)[:, None], torch.arange(4), layer)
        assert all(torch.equal(consumer[got[f]], producer[want[f]]) for f in QL.FIELDS)
        before[torch.cat([got[f].flatten() for f in QL.FIELDS])] = consumer[torch.cat([got[f].flatten() for f in QL.FIELDS])]
    assert torch.equal(consumer, before)  # no other slot's scale bytes (V tiles hold four slots') changed


@pytest.mark.parametrize("producer_v,consumer_v", [(QL.SWIZZLED, QL.LINEAR), (QL.LINEAR, QL.SWIZZLED)])
def test_nvfp4_pages_convert_between_swizzled_and_linear_v_scales_bit_for_bit(producer_v, consumer_v):
    """An SM100 page read on an SM90 worker, and back: every V scale moves to its slot's place in the
    other placement (NVFP4-SCALE-PLACEMENT); codes and K scales are the same bytes."""
    verdict = compat.check(quant_ranks("nvfp4", "HND", v_scales=producer_v)[0], quant_ranks("nvfp4", "HND", v_scales=consumer_v)[0])
    plan = verdict.plan
    assert verdict.compatible and plan.mode == "fields" and plan.steps == ("v_scales",), str(verdict)
    gp, gc = plan.producer.geometry, plan.consumer.geometry
    producer = filled(gp.nbytes(), 5)
    consumer = filled(gc.nbytes(), 6)
    compat.execute(plan, producer, range(6), consumer, range(6))
    assert torch.equal(consumer, producer[placement_permutation(gc, gp)]), f"converted page ≠ producer bytes re-placed [{producer_v} → {consumer_v}]"
    back = filled(gp.nbytes(), 7)
    compat.execute(compat.check(quant_ranks("nvfp4", "HND", v_scales=consumer_v)[0], quant_ranks("nvfp4", "HND", v_scales=producer_v)[0]).plan,
                   consumer, range(6), back, range(6))
    assert torch.equal(back, producer), f"round trip {producer_v} → {consumer_v} → {producer_v} changed bytes"


def placement_permutation(to: QL.QuantGeometry, source: QL.QuantGeometry) -> torch.Tensor:
    """``p`` with ``to``'s byte ``i`` = ``source``'s byte ``p[i]``: every field of every cell, by both offset maps."""
    b, t, h = torch.arange(to.num_blocks)[:, None, None], torch.arange(to.block_size)[:, None], torch.arange(to.num_kv_heads)
    p = torch.arange(to.nbytes())
    for layer in range(to.num_layers):
        at_to, at_source = QL.field_offsets(to, b, t, h, layer), QL.field_offsets(source, b, t, h, layer)
        for f in QL.FIELDS:
            p[at_to[f].flatten()] = at_source[f].flatten()
    return p


def test_nvfp4_linear_v_scales_re_block_and_change_order_through_their_offset_map():
    linear = quant_ranks("nvfp4", "HND", v_scales=QL.LINEAR)[0]
    reblocked = compat.check(linear, quant_ranks("nvfp4", "NHD", block_size=8, v_scales=QL.LINEAR)[0])
    assert reblocked.compatible and reblocked.plan.steps == ("layout", "re-block"), str(reblocked)
    assert "scales with their tokens" in str(reblocked) and compat.check(linear, linear).plan.mode == "regions"


@pytest.mark.parametrize("producer,consumer,field", [
    (("int8_per_token_head", {}), ("fp8_per_token_head", {}), "mode"),
    (("fp8_per_token_head", {"platform": "rocm", "arch": "gfx942"}), ("fp8_per_token_head", {}), "codes"),
    (("nvfp4", {"k_scale": 0.5}), ("nvfp4", {}), "k_scale"),
])
def test_each_differing_quantisation_field_is_refused_with_its_name(producer, consumer, field):
    verdict = compat.check(quant_ranks(producer[0], "HND", **producer[1])[0], quant_ranks(consumer[0], "HND", **consumer[1])[0])
    assert not verdict.compatible and f" {field} " in verdict.reason


def test_a_latent_or_quantised_peer_of_a_kv_cache_is_refused():
    from kvconform import reference as R

    kv = compat.describe(R.blocks_first("HND"), R.Geometry(num_blocks=6, block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16))
    for peer in (latent_rank(), quant_ranks("int8_per_token_head", "HND")[0]):
        for producer, consumer in ((peer, kv), (kv, peer)):
            verdict = compat.check(producer, consumer)
            assert not verdict.compatible and verdict.kind == "cache" and "a K/V cache" in verdict.reason


@pytest.mark.parametrize("change,words", [
    (lambda d: d["cache"].update(codes="float8_e4m3fn"), "'cache.codes'"),
    (lambda d: d["cache"].update(v_scales="diagonal"), "'cache.v_scales'"),
    (lambda d: d["cache"].update(scale_placement="inline"), "'cache.scale_placement' is 'inline'"),
    (lambda d: d.update(dims=["B", "2", "N", "H", "D"]), "'dims' describes a K/V cache"),
    (lambda d: d.update(num_kv_heads=3), "num_kv_heads is 3"),
    (lambda d: d.update(k_scale=None), "finite positive k_scale"),
])
def test_quantised_descriptor_errors_name_the_field(change, words):
    descriptor = json.loads(json.dumps(quant_ranks("nvfp4", "HND")[0]))
    change(descriptor)
    with pytest.raises(compat.DescriptorError, match=words.replace("(", r"\(")):
        compat.parse(descriptor)


def test_latent_descriptor_errors_name_the_field():
    for change, words in ((lambda d: d["cache"]["record"].update(entry_bytes=576), "'cache.record.entry_bytes' is 576"),
                          (lambda d: d["cache"]["format"].update(platform="tpu"), "'cache.format'"),
                          (lambda d: d.update(k_scale=0.5), "no per-tensor k_scale")):
        descriptor = json.loads(json.dumps(latent_rank()))
        change(descriptor)
        with pytest.raises(compat.DescriptorError, match=words):
            compat.parse(descriptor)


def test_command_line_prints_a_latent_verdict_per_consumer_rank(tmp_path, capsys):
    producer, consumer = tmp_path / "prefill.json", tmp_path / "decode.json"
    producer.write_text(json.dumps([latent_rank(tp_rank=r, tp_size=4) for r in range(4)]))
    consumer.write_text(json.dumps([latent_rank(tp_rank=r, tp_size=2) for r in range(2)]))
    assert compat.main([str(producer), str(consumer)]) == 0
    out = capsys.readouterr().out
    assert out.count("(regions, 2 per block: one per layer") == 2 and out.count("compatible: nothing to send") == 6
    assert "consumer rank 1 of 2 (fp8_ds_mla, fp8_ds_mla-bf16, block 16, the latent replicated):" in out
    producer.write_text(json.dumps([latent_rank(tp_rank=0, tp_size=4)]))
    assert compat.main([str(producer), str(consumer)]) == 2


def test_a_quantised_producer_file_must_describe_every_rank_and_one_kind_of_cache(tmp_path):
    path = tmp_path / "prefill.json"
    path.write_text(json.dumps(quant_ranks("nvfp4", "NHD", tp_size=2)[:1]))
    with pytest.raises(compat.DescriptorError, match=r"rank\(s\) \[1\] are not described: model heads \[2, 3\] would have no source"):
        compat.load(str(path), role="producer")
    path.write_text(json.dumps([quant_ranks("nvfp4", "NHD", tp_size=2)[0], latent_rank(tp_rank=1, tp_size=2)]))
    with pytest.raises(compat.DescriptorError, match="rank 1 describes a latent cache .* rank 0 a quantised cache"):
        compat.load(str(path))
