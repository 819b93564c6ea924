"""kvconform.compat against the reference: whenever it says compatible, executing its plan puts
exactly the consumer's reference bytes in the consumer's cache (and every value is kept);
whenever it says incompatible, the named reason holds and no exact plan exists because of it.
Plus the command line and descriptor validation."""

import json
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvconform import compat
from kvconform import reference as R

from .suite_runs import ROOT

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
    run = subprocess.run([sys.executable, "-m", "kvconform.compat", str(producer), str(consumer)], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("compatible: converted (layout, dtype)") == 2 and "heads 1..1 of producer rank 0 → heads 0..0 of consumer rank 1" in run.stdout
    refused = subprocess.run([sys.executable, "-m", "kvconform", "compat", str(consumer), str(producer)], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode == 1 and "incompatible: float8_e4m3fnuz → float8_e4m3fn is not exact" in refused.stdout
    producer.write_text("{}")
    broken = subprocess.run([sys.executable, "-m", "kvconform.compat", str(producer), str(consumer)], capture_output=True, text=True, cwd=ROOT)
    assert broken.returncode == 2 and "schema" in broken.stderr


def test_describe_writes_each_ranks_descriptor_for_compat(tmp_path):
    h100, mi300 = tmp_path / "h100.json", tmp_path / "mi300.json"
    for backend, layout, tp, out in (("triton_flash", "E1:NHD", 1, h100), ("reference_gfx942", "AITER:shuffle-blocks_first", 2, mi300)):
        made = subprocess.run([sys.executable, "-m", "kvconform", "describe", "--backend", backend, "--layout", layout, "--kv-cache-dtype", "fp8",
                               "--tp-size", str(tp), "--k-scale", "0.5", "--v-scale", "0.5", "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
        assert made.returncode == 0, made.stderr
    ranks = json.loads(mi300.read_text())
    assert [(d["tp_rank"], d["num_kv_heads"], d["k_scale"], d["fp8_format"]) for d in ranks] == [(0, 4, 1.0, "float8_e4m3fnuz"), (1, 4, 1.0, "float8_e4m3fnuz")]
    assert subprocess.run([sys.executable, "-m", "kvconform", "compat", str(h100), str(mi300)], capture_output=True, cwd=ROOT).returncode == 0
    assert subprocess.run([sys.executable, "-m", "kvconform", "compat", str(mi300), str(h100)], capture_output=True, cwd=ROOT).returncode == 1
    unknown = subprocess.run([sys.executable, "-m", "kvconform", "describe", "--backend", "triton_flash", "--layout", "E3:LBHNC"], capture_output=True, text=True, cwd=ROOT)
    assert unknown.returncode == 2 and "declares no layout 'E3:LBHNC'" in unknown.stderr
