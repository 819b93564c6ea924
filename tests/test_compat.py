"""kvconform.compat against the reference: whenever it says compatible, executing its plan puts
exactly the consumer's reference bytes in the consumer's cache (and every value is kept);
whenever it says incompatible, the named reason holds and no exact plan exists because of it.
Plus the command line and descriptor validation."""

import json
import math
import sys
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform import compat
from kvconform import reference as R
from kvconform.errors import InputError

from . import fork_server
from .suite_runs import ROOT


def cli(*args: str):
    """``python -m ARGS`` from the checkout (forked: tests/fork_server.py)."""
    return fork_server.run([sys.executable, "-m", *args], cwd=ROOT, timeout=600)


LAYOUTS = {k: v for k, v in R.named_layouts().items() if not k.startswith("E1:cross")}
DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)
SCALES = (0.25, 0.5, 1.0, 2.0)


def holds(layout, g) -> bool:
    try:
        layout.validate(g)
        return True
    except ValueError:
        return False


@st.composite
def endpoints(draw, total_heads: int, layers: int, head_size: int, name: str):
    """One side: a named layout, its block size, dtype, scales and TP size, all ranks' descriptors."""
    dtype = draw(st.sampled_from(DTYPES), label=f"{name} dtype")
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if (total_heads % t == 0 if t <= total_heads else t % total_heads == 0)]), label=f"{name} tp")
    block_size = draw(st.sampled_from((16, 32)), label=f"{name} block size")
    heads = len(R.connector.rank_heads(total_heads, tp, 0))
    g = R.Geometry(num_blocks=5, block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype, num_layers=layers)
    keys = [k for k, lay in LAYOUTS.items() if holds(lay, g)]
    key = draw(st.sampled_from(keys), label=f"{name} layout")
    scales = [draw(st.sampled_from(SCALES), label=f"{name} {s}_scale") for s in "kv"]
    descriptors = [compat.describe(LAYOUTS[key], g, tp_rank=r, tp_size=tp, total_kv_heads=total_heads, k_scale=scales[0], v_scale=scales[1], backend=name)
                   for r in range(tp)]
    return key, g, descriptors


@st.composite
def handshakes(draw):
    """A producer and a consumer that agree on the model most of the time, and now and then not."""
    total = draw(st.sampled_from((1, 2, 4)), label="model KV heads")
    head_size = draw(st.sampled_from((16, 32)), label="head size")
    layers = draw(st.sampled_from((1, 1, 2)), label="layers")
    producer = draw(endpoints(total, layers, head_size, "producer"))
    odd = draw(st.sampled_from(("none", "none", "none", "layers", "head_size", "heads")), label="model mismatch")
    consumer = draw(endpoints(total * (2 if odd == "heads" else 1), layers + (odd == "layers"), head_size * (2 if odd == "head_size" else 1), "consumer"))
    return producer, consumer


def stored(bits: torch.Tensor, src: torch.dtype, src_scale: float, dst: torch.dtype, dst_scale: float) -> torch.Tensor:
    """What the consumer's own writer stores for the producer's values (independent of compat):
    dequantise with the producer's scale, quantise with the consumer's (fp8: saturating); the
    same dtype at the same scale is a bit copy."""
    if src == dst and (src not in R.fp8.FP8_DTYPES or src_scale == dst_scale):
        return bits
    values = bits.view(src).float() * (src_scale if src in R.fp8.FP8_DTYPES else 1.0)
    if dst in R.fp8.FP8_DTYPES:
        out = R.fp8.quantize(values, dst_scale, dst)
    else:
        out = values.to(dst)
    return out.view(R.bits_dtype(dst))


@settings(max_examples=60, deadline=None)
@given(case=handshakes(), data=st.data())
def test_compatible_plans_reproduce_the_consumer_reference_and_incompatible_ones_name_a_real_obstacle(case, data):
    (p_key, gp, producers), (c_key, gc, consumers) = case
    rank = data.draw(st.integers(0, len(consumers) - 1), label="consumer rank")
    c = compat.parse(consumers[rank])
    verdicts = [compat.check(p, consumers[rank]) for p in producers]
    if not verdicts[0].compatible:
        assert all(not v.compatible and v.kind == verdicts[0].kind for v in verdicts)
        assert_obstacle_is_real(verdicts[0], compat.parse(producers[0]), c)
        return
    total = c.total_kv_heads
    p_ids = [3, 1]
    tokens = len(p_ids) * gp.block_size if gp.block_size == gc.block_size else data.draw(st.integers(1, len(p_ids) * gp.block_size), label="tokens")
    c_ids = [0, 4, 2, 1][: -(-tokens // gc.block_size)]
    kv = torch.randint(0, 256, (gp.num_layers * len(p_ids) * 2 * gp.block_size * total * gp.head_size * gp.element_size,), dtype=torch.uint8,
                       generator=torch.Generator().manual_seed(7)).view(R.bits_dtype(gp.dtype)).view(gp.num_layers, len(p_ids), 2, gp.block_size, total, gp.head_size)
    caches = []
    for d in producers:
        ep = compat.parse(d)
        storage = torch.zeros(LAYOUTS[p_key].nbytes(ep.geometry), dtype=torch.uint8)
        R.connector.scatter(storage, LAYOUTS[p_key], ep.geometry, p_ids, kv[:, :, :, :, ep.heads.start:ep.heads.stop])
        caches.append(storage)
    target = torch.randint(0, 256, (LAYOUTS[c_key].nbytes(c.geometry),), dtype=torch.uint8, generator=torch.Generator().manual_seed(8))
    expected = target.clone()
    for p, verdict in enumerate(verdicts):
        assert verdict.compatible and verdict.plan.producer.tp_rank == p
        compat.execute(verdict.plan, caches[p], p_ids, target, c_ids, None if gp.block_size == gc.block_size else tokens)
    # The consumer's reference: token t of the sequence, its heads, as its own writer stores them.
    sequence = kv.permute(0, 2, 1, 3, 4, 5).reshape(gp.num_layers, 2, -1, total, gp.head_size)[:, :, :tokens, c.heads.start:c.heads.stop]
    want = torch.stack([stored(sequence[:, kv_], gp.dtype, compat.parse(producers[0]).scale(kv_), gc.dtype, c.scale(kv_)) for kv_ in (0, 1)], dim=1)
    t = torch.arange(tokens)
    offsets = LAYOUTS[c_key].offsets(c.geometry, layer=torch.arange(gc.num_layers)[:, None, None, None, None], kv=torch.arange(2)[None, :, None, None, None],
                                     block=torch.tensor(c_ids)[t // gc.block_size][None, None, :, None, None], slot=(t % gc.block_size)[None, None, :, None, None],
                                     head=torch.arange(c.geometry.num_kv_heads)[None, None, None, :, None], dim=torch.arange(gc.head_size))
    expected.view(R.bits_dtype(gc.dtype))[offsets.expand(want.shape)] = want
    assert torch.equal(target, expected), f"{verdicts[0].summary}: {int((target != expected).sum())} bytes differ"
    got = R.connector.decode_values(target.view(R.bits_dtype(gc.dtype))[offsets.expand(want.shape)], gc.dtype)
    sent = torch.stack([R.connector.decode_values(sequence[:, kv_], gp.dtype) * compat.parse(producers[0]).scale(kv_) / c.scale(kv_) for kv_ in (0, 1)], dim=1)
    assert bool(R.connector.values_equal(got, sent).all()), "a compatible plan changed a value"


def assert_obstacle_is_real(verdict, p, c):
    if verdict.kind == "layers":
        assert p.geometry.num_layers != c.geometry.num_layers
    elif verdict.kind == "head_size":
        assert p.geometry.head_size != c.geometry.head_size
    elif verdict.kind == "heads":
        assert p.total_kv_heads != c.total_kv_heads
    else:  # dtype: some producer code has no exact consumer value, whatever plan moves it
        assert verdict.kind == "dtype"
        width = p.geometry.element_size
        codes = torch.arange(256, dtype=torch.int32).to(torch.uint8) if width == 1 else torch.arange(1 << 16, dtype=torch.int32).to(torch.int16) if width == 2 else \
            torch.tensor([torch.finfo(torch.float32).max, 1.4e-45, 1 + 2**-23], dtype=torch.float32).view(torch.int32)
        lost = False
        for kv in (0, 1):
            values = codes.view(p.geometry.dtype).float() * p.scale(kv)
            back = stored(codes, p.geometry.dtype, p.scale(kv), c.geometry.dtype, c.scale(kv)).view(c.geometry.dtype).float() * c.scale(kv)
            lost |= not bool(((back == values) | (back.isnan() & values.isnan())).all())
        assert lost, verdict.reason


# ----------------------------------------------------------------------------- fixed verdicts
def fp8_rank(dtype, scale, layout=None, **kw):
    layout = layout or R.blocks_first("HND")
    g = R.Geometry(num_blocks=8, block_size=16, num_kv_heads=2, head_size=64, dtype=dtype)
    return compat.describe(layout, g, k_scale=scale, v_scale=scale, kv_cache_dtype="fp8", **kw)


def test_fn_to_fnuz_is_compatible_only_at_the_doubled_scale():
    fn = fp8_rank(torch.float8_e4m3fn, 0.5)
    assert compat.check(fn, fp8_rank(torch.float8_e4m3fnuz, 1.0)).compatible
    refused = compat.check(fn, fp8_rank(torch.float8_e4m3fnuz, 0.5))
    assert not refused.compatible and refused.kind == "dtype" and "0x78" in refused.reason


def test_fnuz_to_fn_is_refused_at_every_scale_because_240_does_not_fit():
    for scale in SCALES:
        verdict = compat.check(fp8_rank(torch.float8_e4m3fnuz, 1.0), fp8_rank(torch.float8_e4m3fn, scale))
        assert not verdict.compatible and verdict.kind == "dtype"


def test_same_layout_same_dtype_ships_regions_and_nhd_slices_need_a_region_per_token():
    hnd = [compat.describe(R.blocks_first("HND"), R.Geometry(num_blocks=8, block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16),
                           tp_rank=r, tp_size=2, total_kv_heads=4) for r in range(2)]
    one = compat.describe(R.blocks_first("HND"), R.Geometry(num_blocks=8, block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16))
    verdict = compat.check(one, hnd[1])
    assert verdict.plan.identical and [(s.producer_heads, s.consumer_heads) for s in verdict.plan.slices] == [(range(2, 4), range(0, 2))]
    assert "2 regions per block" in str(verdict)
    nhd = compat.describe(R.blocks_first("NHD"), R.Geometry(num_blocks=8, block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16))
    assert "converted (layout)" in compat.check(nhd, hnd[0]).summary


def test_descriptor_errors_name_the_field():
    good = fp8_rank(torch.float8_e4m3fn, 0.5)
    for change, words in (({"schema": "kvconform-layout/0"}, "schema"), ({"dims": ["B", "2", "Q"]}, "'dims'"),
                          ({"strides": {**good["strides"], "N": 1}}, "strides['N']"), ({"k_scale": None}, "k_scale"),
                          ({"fp8_format": "float8_e4m3fnuz"}, "fp8_format"), ({"tp_size": 2}, "num_kv_heads is 2")):
        with pytest.raises(compat.DescriptorError, match=words.replace("[", r"\[").replace("]", r"\]")):
            compat.parse({**good, **change})


def test_command_line_prints_a_verdict_per_rank(tmp_path):
    producer = tmp_path / "mi300.json"
    consumer = tmp_path / "h100.json"
    producer.write_text(json.dumps(fp8_rank(torch.float8_e4m3fn, 0.5, backend="reference")))
    g = R.Geometry(num_blocks=8, block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float8_e4m3fnuz)
    consumer.write_text(json.dumps([compat.describe(R.aiter_shuffle(), g, tp_rank=r, tp_size=2, k_scale=1.0, v_scale=1.0, backend="reference_gfx942")
                                    for r in range(2)]))
    run = cli("kvconform.compat", str(producer), str(consumer))
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("compatible: converted (layout, dtype)") == 2 and "heads 1..1 of producer rank 0 → heads 0..0 of consumer rank 1" in run.stdout
    refused = cli("kvconform", "compat", str(consumer), str(producer))
    assert refused.returncode == 1 and "incompatible: float8_e4m3fnuz → float8_e4m3fn is not exact" in refused.stdout
    producer.write_text("{}")
    broken = cli("kvconform.compat", str(producer), str(consumer))
    assert broken.returncode == 2 and "schema" in broken.stderr


def test_the_command_never_prints_a_control_sequence_from_a_descriptor(tmp_path, capsys):
    """A label carrying an OSC title sequence (ESC ] 0 ; … BEL) is shown escaped, never acted on (#37 item 10)."""
    evil = "evil\x1b]0;pwned\x07"
    producer, consumer = tmp_path / "p.json", tmp_path / "c.json"
    producer.write_text(json.dumps(fp8_rank(torch.float8_e4m3fn, 0.5, backend=evil)))
    consumer.write_text(json.dumps(fp8_rank(torch.float8_e4m3fn, 0.5, backend=evil)))
    assert compat.main([str(producer), str(consumer)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and "evil\\x1b]0;pwned\\x07" in out


def test_describe_writes_each_ranks_descriptor_for_compat(tmp_path):
    h100, mi300 = tmp_path / "h100.json", tmp_path / "mi300.json"
    for backend, layout, tp, out in (("triton_flash", "E1:NHD", 1, h100), ("reference_gfx942", "AITER:shuffle-blocks_first", 2, mi300)):
        made = cli("kvconform", "describe", "--backend", backend, "--layout", layout, "--kv-cache-dtype", "fp8",
                               "--tp-size", str(tp), "--k-scale", "0.5", "--v-scale", "0.5", "-o", str(out))
        assert made.returncode == 0, made.stderr
    ranks = json.loads(mi300.read_text())
    assert [(d["tp_rank"], d["num_kv_heads"], d["k_scale"], d["fp8_format"]) for d in ranks] == [(0, 4, 1.0, "float8_e4m3fnuz"), (1, 4, 1.0, "float8_e4m3fnuz")]
    assert cli("kvconform", "compat", str(h100), str(mi300)).returncode == 0
    assert cli("kvconform", "compat", str(mi300), str(h100)).returncode == 1
    unknown = cli("kvconform", "describe", "--backend", "triton_flash", "--layout", "E3:LBHNC")
    assert unknown.returncode == 2 and "declares no layout 'E3:LBHNC'" in unknown.stderr


# ----------------------------------------------------------------------------- replicated heads (issue #27)
def rank_descriptors(total: int, tp: int, **kw) -> list[dict]:
    return [compat.describe(R.blocks_first("HND"), R.Geometry(num_blocks=2, block_size=16, num_kv_heads=len(R.connector.rank_heads(total, tp, r)),
                                                             head_size=16, dtype=torch.bfloat16), tp_rank=r, tp_size=tp, total_kv_heads=total, **kw)
            for r in range(tp)]


def test_replicated_heads_pair_ranks_as_vllm_does_and_a_replica_holder_is_never_told_it_holds_none():
    producers, consumers = rank_descriptors(1, 2), rank_descriptors(1, 2)
    verdicts = compat.check_ranks(producers, consumers)
    assert [[len(v.plan.slices) for v in row] for row in verdicts] == [[1, 0], [0, 1]]  # rank d reads producer rank d
    text = str(verdicts[1][0])
    assert "holds none" not in text and "replica of model head(s) 0 of consumer rank 1" in text and "producer rank(s) 1" in text
    eight = compat.check_ranks(rank_descriptors(1, 8), rank_descriptors(1, 8))
    assert [next(p for p, v in enumerate(row) if v.plan.slices) for row in eight] == list(range(8))
    assert "holds none of consumer rank 1's heads" in str(compat.check_ranks(rank_descriptors(4, 2), rank_descriptors(4, 2))[1][0])


def test_nixl_refusal_of_more_producer_ranks_than_heads_is_named_and_non_dividing_tp_too():
    (row,) = compat.check_ranks(rank_descriptors(1, 2), rank_descriptors(1, 1))
    assert all(v.compatible for v in row) and all(any("NIXL connector refuses TP 2 → 1" in limit for limit in v.limits) for v in row)
    assert "limit: vLLM 0.33.0's NIXL" in str(row[1])
    assert compat.check_ranks(rank_descriptors(2, 1), rank_descriptors(2, 2))[0][0].limits == ()
    assert "need one TP size to divide the other" in compat.check_ranks(rank_descriptors(6, 3), rank_descriptors(6, 2))[0][0].limits[0]


# ----------------------------------------------------------------------------- the descriptor schema (issue #26 item 13)
def bad_descriptors():
    good = fp8_rank(torch.float8_e4m3fn, 0.5)
    no_kv = {**good, "dims": ["B", "N", "H", "D"], "strides": {"B": 2048, "N": 128, "H": 64, "D": 1}}
    return {
        "infinite k_scale": ({**good, "k_scale": float("inf")}, "finite positive k_scale"),
        "NaN v_scale": ({**good, "v_scale": float("nan")}, "finite positive v_scale"),
        "zero scale": ({**good, "k_scale": 0.0}, "finite positive k_scale"),
        "no K/V dimension": (no_kv, "no K/V dimension"),
        "two K/V dimensions": ({**good, "dims": ["B", "2", "2", "N", "H", "D"]}, "more than once"),
        "dtype a list": ({**good, "dtype": ["float8_e4m3fn"]}, "dtype"),
        "num_blocks 2**70": ({**good, "num_blocks": 2**70}, "'num_blocks' must be an integer in"),
        "total_kv_heads 0": ({**good, "total_kv_heads": 0}, "'total_kv_heads' must be an integer in"),
        "tp_size 0": ({**good, "tp_size": 0}, "'tp_size' must be an integer in"),
        "tp_rank past tp_size": ({**good, "tp_rank": 1}, "is not a rank of tp_size 1"),
        "a bool block_size": ({**good, "block_size": True}, "'block_size'"),
        "scale on a bf16 cache": ({**compat.describe(R.blocks_first("NHD"), R.Geometry(num_blocks=2, block_size=16, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)),
                                   "k_scale": 0.5}, "is for fp8 caches"),
        "a string stride": ({**good, "strides": {**good["strides"], "D": "1"}}, "'strides'"),
        "no slot dimension": ({**good, "dims": ["B", "2", "H", "D"]}, "slot coordinate"),
    }


@pytest.mark.parametrize("name", list(bad_descriptors()))
def test_every_descriptor_is_validated_against_the_schema(name):
    descriptor, words = bad_descriptors()[name]
    with pytest.raises(compat.DescriptorError, match=words.replace("(", r"\(").replace("[", r"\[")):
        compat.parse(descriptor)
    assert issubclass(compat.DescriptorError, InputError)


def test_bad_files_exit_2_naming_the_file(tmp_path):
    good = fp8_rank(torch.float8_e4m3fn, 0.5)
    consumer = tmp_path / "consumer.json"
    consumer.write_text(json.dumps(good))
    two_ranks = [fp8_rank(torch.float8_e4m3fn, 0.5, tp_rank=r, tp_size=2) for r in range(2)]
    for two in two_ranks:  # TP 2 over 4 heads, 2 per rank
        two.update(total_kv_heads=4)
    cases = {"empty.json": "[]", "inf.json": json.dumps({**good, "k_scale": float("inf")}), "dtype.json": json.dumps({**good, "dtype": [1]}),
             "huge.json": json.dumps({**good, "num_blocks": 2**70}), "zero.json": json.dumps({**good, "total_kv_heads": 0}),
             "half.json": json.dumps(two_ranks[:1]), "twice.json": json.dumps([two_ranks[0], two_ranks[0]]),
             "binary.json": b"\xff\xfe\x00".decode("latin-1"), "deep.json": "[" * 100000}
    for name, text in cases.items():
        path = tmp_path / name
        path.write_text(text, encoding="latin-1")
        run = cli("kvconform", "compat", str(path), str(consumer))
        assert run.returncode == 2 and str(path) in run.stderr and "Traceback" not in run.stderr, (name, run.returncode, run.stderr[-500:])
    missing = cli("kvconform", "compat", str(tmp_path / "half.json"), str(consumer))
    assert "rank(s) [1] are not described: model heads [2, 3] would have no source" in missing.stderr


@pytest.mark.parametrize("args", [["--tp-size", "0"], ["--num-blocks", str(2**70)], ["--total-kv-heads", "0"], ["--k-scale", "inf"], ["--total-kv-heads", "3", "--tp-size", "2"]])
def test_describe_exits_2_on_sizes_outside_the_schema(args):
    run = cli("kvconform", "describe", "--backend", "reference", *args)
    assert run.returncode == 2 and "kvconform describe:" in run.stderr and "Traceback" not in run.stderr, run.stderr[-500:]


# ----------------------------------------------------------------------------- executing random compatible plans loses no value
HOSTILE_SCALES = (0.25, 0.5, 1.0, 2.0, 3.0, 0.1, 0.3, 1e-30, 1e30, 2.0**-140, 2.0**100, 5e-324)


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_executed_compatible_plans_lose_no_value(data):
    """Random descriptors — odd scales (non-dyadic, extreme, subnormal), any dtype pair, any TP
    split: whenever compat says compatible, executing every producer rank's plan stores in each
    consumer element a value v_c with v_c · consumer_scale = v_p · producer_scale exactly."""
    total = data.draw(st.sampled_from((1, 2, 4)), label="model KV heads")
    sides = []
    for name in ("producer", "consumer"):
        dtype = data.draw(st.sampled_from(DTYPES), label=f"{name} dtype")
        tp = data.draw(st.sampled_from([t for t in (1, 2, 4) if (total % t == 0 if t <= total else t % total == 0)]), label=f"{name} tp")
        key = data.draw(st.sampled_from(["E1:NHD", "E1:HND", "E2:HND"]), label=f"{name} layout")
        scales = [data.draw(st.sampled_from(HOSTILE_SCALES), label=f"{name} {s}_scale") for s in "kv"]
        g = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=len(R.connector.rank_heads(total, tp, 0)), head_size=16, dtype=dtype)
        sides.append((key, g, [compat.describe(LAYOUTS[key], g, tp_rank=r, tp_size=tp, total_kv_heads=total, k_scale=scales[0], v_scale=scales[1]) for r in range(tp)]))
    (p_key, gp, producers), (c_key, gc, consumers) = sides
    rank = data.draw(st.integers(0, len(consumers) - 1), label="consumer rank")
    verdicts = [compat.check(p, consumers[rank]) for p in producers]
    if not verdicts[0].compatible:
        return
    c = compat.parse(consumers[rank])
    kv = torch.randint(0, 256, (2 * 2 * gp.block_size * total * gp.head_size * gp.element_size,), dtype=torch.uint8,
                       generator=torch.Generator().manual_seed(3)).view(R.bits_dtype(gp.dtype)).view(1, 2, 2, gp.block_size, total, gp.head_size)
    if gp.element_size == 1:  # every code of an 8-bit type shipped
        kv.view(-1)[:256] = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    target = torch.zeros(LAYOUTS[c_key].nbytes(gc), dtype=torch.uint8)
    for p, verdict in enumerate(verdicts):
        storage = torch.zeros(LAYOUTS[p_key].nbytes(gp), dtype=torch.uint8)
        held = compat.parse(producers[p]).heads
        R.connector.scatter(storage, LAYOUTS[p_key], gp, [0, 2], kv[:, :, :, :, held.start:held.stop])
        compat.execute(verdict.plan, storage, [0, 2], target, [1, 0])
    got = R.connector.gather(target, LAYOUTS[c_key], gc, [1, 0])
    sent = kv[:, :, :, :, c.heads.start:c.heads.stop]
    p0 = compat.parse(producers[0])
    for kv_ in (0, 1):
        pairs = {(int(a), int(b)) for a, b in zip(sent[:, :, kv_].flatten().tolist(), got[:, :, kv_].flatten().tolist())}
        for a, b in pairs:
            va = torch.tensor([a]).to(R.bits_dtype(gp.dtype)).view(gp.dtype).double().item()
            vb = torch.tensor([b]).to(R.bits_dtype(gc.dtype)).view(gc.dtype).double().item()
            if math.isnan(va) or math.isnan(vb) or math.isinf(va) or math.isinf(vb):
                assert (math.isnan(va) and math.isnan(vb)) or va * p0.scale(kv_) == vb * c.scale(kv_), (a, b, verdicts[0].summary)
                continue
            assert Fraction(va) * Fraction(p0.scale(kv_)) == Fraction(vb) * Fraction(c.scale(kv_)), \
                f"{'KV'[kv_]}: code 0x{a & 0xffff:x} ({va}) × {p0.scale(kv_)!r} arrived as 0x{b & 0xffff:x} ({vb}) × {c.scale(kv_)!r}: {verdicts[0].summary}"
