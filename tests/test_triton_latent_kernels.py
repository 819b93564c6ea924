"""The portable latent-cache Triton kernels (triton_latent_kernels) write the reference's bytes and
read back the reference's values, under the interpreter on CPU, and compile for sm90, gfx942 and
gfx950 without a GPU."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from kvconform.backends_under_test import triton_latent_kernels as K  # noqa: E402
from kvconform.backends_under_test.triton_interpreter import interpreted  # noqa: E402
from kvconform.conformance.harness.big_caches import lazy_zeros  # noqa: E402
from kvconform.reference import latent as L  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Without the interpreter from triton's first import these CPU-tensor runs cannot run in this process;
# tests/test_triton_latent_kernels_interpreted.py then runs this module in an interpreted pytest of its own.
pytestmark = pytest.mark.skipif(not interpreted(), reason="needs TRITON_INTERPRET=1 from the start: run by test_triton_latent_kernels_interpreted.py")
BF16, FP16 = torch.bfloat16, torch.float16
PLATFORMS = [("cpu", ""), ("rocm", "gfx942"), ("rocm", "gfx950")]


def geometry(fmt, num_blocks=8, block_size=16, **kw) -> L.LatentGeometry:
    return L.LatentGeometry(num_blocks=num_blocks, block_size=block_size, fmt=fmt, **kw)


def regions(geom, lazy=False) -> tuple[torch.Tensor, torch.Tensor]:
    """Two zeroed regions: one for the kernels, one for the reference."""
    make = lazy_zeros if lazy else (lambda n: torch.zeros(n, dtype=torch.uint8))
    return make(geom.nbytes()), make(geom.nbytes())


def cache_of(region, geom) -> torch.Tensor:
    return region.view(geom.fmt.storage_dtype()).view(geom.shape())


def rows(tokens, width, dtype, seed) -> torch.Tensor:
    """Rows spanning many binades, read through a column stride of 2."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(torch.randint(-24, 12, (tokens, 1), generator=g).float())
    return (torch.randn(tokens, 2 * width, generator=g) * magnitude).to(dtype)[:, ::2]


def slots_of(tokens, geom, seed) -> torch.Tensor:
    slots = torch.randperm(geom.num_blocks * geom.block_size, generator=torch.Generator().manual_seed(seed))[:tokens]
    slots[1] = -1  # padding
    return slots


def assert_bytes_equal(what, mine, ref, geom, at=None):
    """The kernel's region equals the reference's (at byte offsets ``at``, else everywhere)."""
    at = torch.arange(geom.nbytes()) if at is None else at.flatten()
    actual, expected = mine[at], ref[at]
    bad = torch.nonzero(actual != expected).flatten()[:4]
    if bad.numel():
        where = L.coordinates_of(geom, at[bad])
        coords = [f"block {b} row {r} {f}[{i}]" for b, r, f, i in zip(where["block"].tolist(), where["row"].tolist(), where["field"], where["byte"].tolist())]
        raise AssertionError(f"{what}: bytes differ at {coords}: kernel {actual[bad].tolist()}, reference {expected[bad].tolist()}")


def ds_policy(fmt) -> dict:
    policy = L.ScalePolicy.ds_mla("0.33.0", fmt.platform, fmt.arch)
    return dict(code_dtype=fmt.e4m3.dtype, divisor=policy.divisor, floor=policy.floor, pow2=policy.pow2)


def indexer_policy(fmt) -> dict:
    policy = L.ScalePolicy.indexer(fmt.scale_format, fmt.platform, fmt.arch)
    return dict(code_dtype=fmt.e4m3.dtype, mx=fmt.scale_format == "mx", divisor=policy.divisor, floor=policy.floor, pow2=policy.pow2)


def mla_codes(fmt):
    return None if fmt.cache_dtype == "auto" else fmt.storage_dtype()


def write_mla(fmt, geom, mine, ref, tokens, seed=0, scale=0.37):
    kv_c, k_pe = rows(tokens + 2, fmt.kv_lora_rank, fmt.model_dtype, seed), rows(tokens + 2, fmt.rope_dim, fmt.model_dtype, seed + 1)
    slots, scale = slots_of(tokens, geom, seed), torch.tensor([scale])  # tokens = len(slot_mapping) < len(kv_c)
    if fmt.kind == "fp8_ds_mla":
        kv_c[0, 3], kv_c[2, :128] = float("nan"), 0.0  # a NaN code; a zero tile (the floor)
        K.concat_and_cache_ds_mla(kv_c, k_pe, cache_of(mine, geom), slots, **ds_policy(fmt))
        L.concat_and_cache_ds_mla(kv_c, k_pe, ref, geom, slots)
    else:
        K.concat_and_cache_mla(kv_c, k_pe, cache_of(mine, geom), slots, scale, code_dtype=mla_codes(fmt))
        L.concat_and_cache_mla(kv_c, k_pe, ref, geom, slots, scale=scale)


@pytest.mark.parametrize("cache_dtype", L.MLA_CACHE_DTYPES)
@pytest.mark.parametrize("model_dtype", [BF16, FP16])
def test_plain_mla_rows_are_the_reference_bytes(cache_dtype, model_dtype):
    geom = geometry(L.LatentFormat(kind="mla", cache_dtype=cache_dtype, model_dtype=model_dtype))
    mine, ref = regions(geom)
    write_mla(geom.fmt, geom, mine, ref, tokens=40)
    assert_bytes_equal(geom.short(), mine, ref, geom)


@pytest.mark.parametrize("platform,arch", PLATFORMS)
@pytest.mark.parametrize("model_dtype", [BF16, FP16])
def test_ds_mla_records_are_the_reference_bytes_in_the_platform_e4m3_and_divisor(platform, arch, model_dtype):
    geom = geometry(L.LatentFormat(kind="fp8_ds_mla", model_dtype=model_dtype, platform=platform, arch=arch))
    mine, ref = regions(geom)
    write_mla(geom.fmt, geom, mine, ref, tokens=40)
    assert_bytes_equal(geom.short(), mine, ref, geom)


def test_ds_mla_without_rope_writes_a_zero_tail():
    geom = geometry(L.LatentFormat(kind="fp8_ds_mla"))
    mine, ref = regions(geom)
    mine[:], ref[:] = 0xAB, 0xAB
    kv_c, slots = rows(5, 512, BF16, 3), slots_of(5, geom, 3)
    K.concat_and_cache_ds_mla(kv_c, torch.empty(5, 0, dtype=BF16), cache_of(mine, geom), slots, **ds_policy(geom.fmt))
    L.concat_and_cache_ds_mla(kv_c, torch.empty(5, 0, dtype=BF16), ref, geom, slots)
    assert_bytes_equal(geom.short(), mine, ref, geom)


@pytest.mark.parametrize("scale_format,head_dim", [("float32", 128), ("float32", 256), ("ue8m0", 128), ("ue8m0", 256), ("mx", 128)])
def test_indexer_pages_are_the_reference_bytes(scale_format, head_dim):
    geom = geometry(L.LatentFormat(kind="indexer", kv_lora_rank=head_dim, scale_format=scale_format))
    mine, ref = regions(geom)
    k, slots = rows(30, head_dim, BF16, 5), slots_of(33, geom, 5)  # tokens = len(k): the last 3 slots are unused
    k[4, 7] = float("nan")
    K.indexer_k_quant_and_cache(k, cache_of(mine, geom), slots, **indexer_policy(geom.fmt))
    L.indexer_k_quant_and_cache(k, ref, geom, slots)
    assert_bytes_equal(geom.short(), mine, ref, geom)


def block_table_of(geom) -> tuple[torch.Tensor, torch.Tensor]:
    table = torch.randperm(geom.num_blocks, generator=torch.Generator().manual_seed(9))[:6].reshape(2, 3).to(torch.int32)
    return table, torch.tensor([3 * geom.block_size - 5, geom.block_size + 1], dtype=torch.int32)


@pytest.mark.parametrize("fmt", [L.LatentFormat(kind="mla"), L.LatentFormat(kind="mla", cache_dtype="fp8", model_dtype=FP16),
                                 L.LatentFormat(kind="mla", kv_lora_rank=256, rope_dim=32, cache_dtype="fp8_e5m2"),
                                 L.LatentFormat(kind="fp8_ds_mla"), L.LatentFormat(kind="fp8_ds_mla", platform="rocm", arch="gfx942")],
                         ids=lambda f: f.label())
def test_the_latent_gather_returns_the_reference_values_and_decode_agrees_in_float32(fmt):
    geom, scale = geometry(fmt), torch.tensor([0.37])
    mine, ref = regions(geom)
    write_mla(fmt, geom, mine, ref, tokens=48, scale=0.37)
    table, lens = block_table_of(geom)
    form = K.DS_MLA if fmt.kind == "fp8_ds_mla" else K.PLAIN16 if fmt.cache_dtype == "auto" else K.PLAIN_FP8
    code_dtype = fmt.e4m3.dtype if fmt.kind == "fp8_ds_mla" else mla_codes(fmt)
    got = K.gather_latent(cache_of(ref, geom), table, lens, scale, form=form, rank=fmt.kv_lora_rank, rope=fmt.rope_dim,
                          model_dtype=fmt.model_dtype, code_dtype=code_dtype)
    expected = L.gather_latent(ref, geom, table, lens, scale=scale)
    assert torch.equal(got.isnan(), expected.isnan()) and torch.equal(got.nan_to_num(), expected.nan_to_num())
    query = (torch.randn(2, 5, fmt.width(), generator=torch.Generator().manual_seed(5)) / 8).to(fmt.model_dtype)
    decoded = K.mla_decode(query, cache_of(ref, geom), table, lens, scale, softmax_scale=0.05, form=form, rank=fmt.kv_lora_rank,
                           rope=fmt.rope_dim, code_dtype=code_dtype)
    # An fp16 output may sit a few fp16 ulps from the reference's (the two sum the softmax in other
    # orders): with pytorch's fp16 default (rtol 1e-3, one ulp) 3 of 40 random queries failed in
    # CI, unseeded; 8 ulps held 60 of 60. A wrong record or scale is off by far more.
    fp16 = {"rtol": 8 * torch.finfo(torch.float16).eps, "atol": 1e-5} if decoded.dtype == torch.float16 else {}
    torch.testing.assert_close(decoded, L.mla_decode(query, ref, geom, table, lens, scale=scale, softmax_scale=0.05), equal_nan=True, **fp16)


@pytest.mark.parametrize("scale_format", ["float32", "mx"])
def test_the_indexer_gather_returns_the_reference_bytes(scale_format):
    geom = geometry(L.LatentFormat(kind="indexer", scale_format=scale_format))
    mine, ref = regions(geom)
    L.indexer_k_quant_and_cache(rows(48, 128, BF16, 7), ref, geom, slots_of(48, geom, 7))
    table, lens = block_table_of(geom)
    got = K.gather_indexer(cache_of(ref, geom), table, lens, head_dim=128)
    expected = L.gather_indexer(ref, geom, table, lens)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("fmt", [L.LatentFormat(kind="mla", cache_dtype="fp8"), L.LatentFormat(kind="fp8_ds_mla"),
                                 L.LatentFormat(kind="indexer", scale_format="ue8m0")], ids=lambda f: f.label())
def test_blocks_past_2_16_and_bytes_past_2_31_are_addressed_in_64_bits(fmt):
    num_blocks = max((1 << 16) + 8, -(-(1 << 31) // (64 * fmt.entry_bytes())) + 8)
    geom = geometry(fmt, num_blocks=num_blocks, block_size=64)
    mine, ref = regions(geom, lazy=True)
    last = num_blocks * 64
    slots = torch.tensor([last - 1, -1, (1 << 16) * 64 + 5, last - 70])
    if fmt.kind == "indexer":
        k = rows(4, 128, BF16, 11)
        K.indexer_k_quant_and_cache(k, cache_of(mine, geom), slots, **indexer_policy(fmt))
        L.indexer_k_quant_and_cache(k, ref, geom, slots)
    else:
        kv_c, k_pe = rows(4, 512, BF16, 11), rows(4, 64, BF16, 12)
        if fmt.kind == "fp8_ds_mla":
            K.concat_and_cache_ds_mla(kv_c, k_pe, cache_of(mine, geom), slots, **ds_policy(fmt))
            L.concat_and_cache_ds_mla(kv_c, k_pe, ref, geom, slots)
        else:
            K.concat_and_cache_mla(kv_c, k_pe, cache_of(mine, geom), slots, torch.tensor([0.5]), code_dtype=mla_codes(fmt))
            L.concat_and_cache_mla(kv_c, k_pe, ref, geom, slots, scale=torch.tensor([0.5]))
    written = slots[slots >= 0]
    at = L.record_offsets(geom, written // 64, written % 64)
    assert int(at.max()) > 1 << 31
    assert_bytes_equal(geom.short(), mine, ref, geom, at)


def test_every_latent_kernel_compiles_for_sm90_gfx942_and_gfx950():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"TRITON_DEFAULT_FP_FUSION": "1"}
    runs = {arch: subprocess.Popen([sys.executable, "-m", "kvconform.backends_under_test.triton_aot", "latent", arch], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for arch in ("sm90", "gfx942", "gfx950")}  # one process per target: the compiles are CPU-bound
    for arch, proc in runs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{arch}:\n{out}{err[-3000:]}"
        assert len(out.splitlines()) == 12 and all(line.endswith(" ok") for line in out.splitlines()), out
