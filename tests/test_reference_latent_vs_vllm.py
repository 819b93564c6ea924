"""The latent reference held against vLLM 0.33.0's own kernel tests (docs/LATENT.md, "held against vLLM").

vLLM's test bodies and torch reference functions are taken out of the pinned sdist with ``ast`` and run
on the CPU with kvconform's reference in the place of the CUDA ops they test, so their reference code
judges ours. Their comparisons are made exact (``assert_close`` with zero tolerance, counted so that
none can pass without comparing). The one CUDA op their references themselves call, ``convert_fp8``,
is stood in for by ``kvconform.reference.fp8`` (itself held against the bit-field oracle in
tests/test_fp8.py); it only converts elements, the layouts and scales compared are vLLM's.
"""

import os
import random
import subprocess
import sys
import types

import pytest
import torch

from kvconform import reference as R

from . import vllm_sdist

L = R.latent
CACHE_TESTS = "tests/kernels/attention/test_cache.py"
SPARSE_TESTS = "tests/v1/attention/test_sparse_mla_backends.py"
INDEXER_TESTS = "tests/kernels/test_compressor_kv_cache.py"
TAKEN = {
    CACHE_TESTS: ("KV_LORA_RANKS", "QK_ROPE_HEAD_DIMS", "NUM_TOKENS_MLA", "BLOCK_SIZES_MLA", "NUM_BLOCKS_MLA", "DTYPES",
                  "SEEDS", "KV_CACHE_DTYPE", "_create_mla_cache", "_fill_mla_cache", "test_concat_and_cache_mla",
                  "test_concat_and_cache_ds_mla", "test_concat_and_cache_ds_mla_nope", "test_swap_blocks_mla",
                  "test_gather_and_maybe_dequant_cache_mla", "test_cp_gather_cache_mla"),
    SPARSE_TESTS: ("_float_to_e8m0_truncate", "_dequantize_fp8_ds_mla_entry", "_quantize_dequantize_fp8_ds_mla"),
    INDEXER_TESTS: ("_ue8m0_reference", "test_indexer_quant_cache_roundtrip"),
}
E4M3 = "float8_e4m3fn"  # CUDA's e4m3, the platform vLLM's tests run on
ROCM_OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
# vLLM's ROCm Triton indexer writer, run from the command line in a process that imports Triton under
# TRITON_INTERPRET=1 on a CPU. FP8_DTYPE is the ROCm build's fp8 (e4m3fnuz on gfx942, e4m3fn on gfx950).
ROCM_DRIVER = '''
import sys

import torch
import triton
import triton.language as tl

FP8_DTYPE = None

{definitions}

if __name__ == "__main__":
    cases = torch.load(sys.argv[1])
    for case in cases.values():
        FP8_DTYPE = getattr(torch, case["fp8"])
        indexer_k_quant_and_cache_triton(case["k"], case["cache"], case["slots"], 128, case["scale_fmt"])
    torch.save(cases, sys.argv[2])
'''


class AnyOp:
    def __getattr__(self, name):
        return self


class ExactTorch:
    """``torch`` as vLLM's test bodies see it: ``assert_close`` exact and counted, no accelerator."""

    def __init__(self):
        self.comparisons = 0
        self.testing = types.SimpleNamespace(assert_close=self.assert_close)
        self.accelerator = types.SimpleNamespace(set_device_index=lambda device: None, device_count=lambda: 0)
        self.ops = AnyOp()  # torch.ops._C_cache_ops.X, named for opcheck only (a no-op here)

    def __getattr__(self, name):
        return getattr(torch, name)

    def set_default_device(self, device):
        assert device == "cpu"

    def assert_close(self, actual, expected, **_tolerances):
        self.comparisons += 1
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)


def region_of(cache: torch.Tensor) -> torch.Tensor:
    assert cache.is_contiguous(), "vLLM's tests allocate contiguous caches"
    return cache.view(torch.uint8).view(-1)


def plain_format(cache_dtype: str, width: int, model_dtype: torch.dtype) -> L.LatentFormat:
    return L.LatentFormat(kind="mla", kv_lora_rank=width - 64, rope_dim=64, cache_dtype=cache_dtype, model_dtype=model_dtype)


def geometry(cache: torch.Tensor, fmt: L.LatentFormat) -> L.LatentGeometry:
    return L.LatentGeometry(num_blocks=cache.shape[0], block_size=cache.shape[1], fmt=fmt)


class ReferenceOps:
    """``vllm._custom_ops`` as kvconform's reference implements it (the ops under vLLM's tests)."""

    def concat_and_cache_mla(self, kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        if kv_cache_dtype == "fp8_ds_mla":
            geom = geometry(kv_cache, L.LatentFormat(kind="fp8_ds_mla", model_dtype=kv_c.dtype))
            L.concat_and_cache_ds_mla(kv_c, k_pe, region_of(kv_cache), geom, slot_mapping)
            return
        fmt = L.LatentFormat(kind="mla", kv_lora_rank=kv_c.shape[1], rope_dim=k_pe.shape[1], cache_dtype=kv_cache_dtype,
                             model_dtype=kv_c.dtype)
        L.concat_and_cache_mla(kv_c, k_pe, region_of(kv_cache), geometry(kv_cache, fmt), slot_mapping, scale=scale)

    def convert_fp8(self, dst, src, scale=1.0, kv_dtype="fp8"):
        """The stand-in: uint8 source = e4m3 codes to dequantise, else values to quantise."""
        assert kv_dtype == "fp8"
        if src.dtype == torch.uint8:
            dst.copy_((R.fp8.decode_codes(src, E4M3) * scale).to(dst.dtype))
        else:
            dst.copy_(R.fp8.quantize(src.float(), scale, E4M3).view(torch.uint8))

    def swap_blocks(self, src, dst, block_size_in_bytes, block_mapping):
        fmt = plain_format("fp8" if src.dtype == torch.uint8 else "auto", src.shape[2],
                           torch.bfloat16 if src.dtype == torch.uint8 else src.dtype)
        geom = geometry(src, fmt)
        assert block_size_in_bytes == geom.block_bytes()
        L.swap_latent_blocks(region_of(src), geom, region_of(dst), geometry(dst, fmt), block_mapping[:, 0], block_mapping[:, 1])

    def gather_and_maybe_dequant_cache(self, src_cache, dst, block_table, cu_seq_lens, token_to_seq, num_tokens,
                                       kv_cache_dtype, scale, seq_starts=None):
        assert seq_starts is None
        geom = geometry(src_cache, plain_format(kv_cache_dtype, src_cache.shape[2], dst.dtype))
        dst.copy_(L.gather_latent(region_of(src_cache), geom, block_table, cu_seq_lens.diff(), scale=scale))

    def cp_gather_cache(self, src_cache, dst, block_table, cu_seq_lens, batch_size, seq_starts=None):
        assert seq_starts is None and src_cache.dtype != torch.uint8
        geom = geometry(src_cache, plain_format("auto", src_cache.shape[2], src_cache.dtype))
        dst.copy_(L.gather_records(region_of(src_cache), geom, block_table, cu_seq_lens.diff()).view(dst.dtype))

    def indexer_k_quant_and_cache(self, k, kv_cache, slot_mapping, quant_block_size, scale_fmt):
        assert quant_block_size == 128
        fmt = L.LatentFormat(kind="indexer", kv_lora_rank=k.shape[1], model_dtype=k.dtype,
                             scale_format={"ue8m0": "ue8m0", "mxfp8": "mx"}.get(scale_fmt, "float32"))
        L.indexer_k_quant_and_cache(k, region_of(kv_cache), geometry(kv_cache, fmt), slot_mapping)

    def cp_gather_indexer_k_quant_cache(self, kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
        fmt = L.LatentFormat(kind="indexer", kv_lora_rank=dst_k.shape[1])  # scale bytes are copied, not read
        values, scales = L.gather_indexer(region_of(kv_cache), geometry(kv_cache, fmt), block_table, cu_seq_lens.diff())
        dst_k[:values.shape[0]].copy_(values)
        dst_scale[:scales.shape[0]].copy_(scales)


def set_random_seed(seed):
    random.seed(seed)
    torch.manual_seed(seed)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM's test code, one namespace, its imports replaced by the stand-ins above."""
    sources = vllm_sdist.read_sources(vllm_sdist.sdist(tmp_path_factory), tuple(TAKEN))
    text = "\n\n".join(vllm_sdist.definitions(sources[name], *names) for name, names in TAKEN.items())
    # The indexer tests allocate on "cuda" by a literal; the only edit made to vLLM's text.
    assert text.count('device = "cuda"') == 1
    text = text.replace('device = "cuda"', 'device = "cpu"')
    module = types.ModuleType("vllm_latent_tests")
    namespace = module.__dict__
    namespace.update(torch=ExactTorch(), ops=ReferenceOps(), pytest=pytest, random=random, math=__import__("math"),
                     opcheck=lambda *args, **kwargs: None, DEFAULT_OPCHECK_TEST_UTILS=(), CUDA_DEVICES=["cpu"],
                     current_platform=types.SimpleNamespace(is_rocm=lambda: False), set_random_seed=set_random_seed)
    exec(compile(text, f"<vLLM 0.33.0 {', '.join(TAKEN)}>", "exec"), namespace)
    return module


def run_exactly(vllm, test, **params):
    """Run one of vLLM's test bodies; it must have compared something, exactly."""
    before = vllm.torch.comparisons
    getattr(vllm, test)(**params)
    assert vllm.torch.comparisons > before, f"{test} compared nothing"


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
@pytest.mark.parametrize("kv_lora_rank, dtype", [(512, torch.bfloat16), (256, torch.float32)])
def test_vllm_mla_writer_test_holds_our_writer_byte_for_byte(vllm, kv_cache_dtype, kv_lora_rank, dtype):
    run_exactly(vllm, "test_concat_and_cache_mla", kv_lora_rank=kv_lora_rank, qk_rope_head_dim=64, num_tokens=42,
                block_size=16, num_blocks=8, dtype=dtype, seed=0, device="cpu", kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_vllm_ds_mla_test_reference_equals_our_records_byte_for_byte(vllm, dtype):
    run_exactly(vllm, "test_concat_and_cache_ds_mla", kv_lora_rank=512, qk_rope_head_dim=64, num_tokens=12,
                block_size=16, num_blocks=8, dtype=dtype, seed=0, device="cpu")


@pytest.mark.parametrize("block_size", [64, 256])
def test_vllm_ds_mla_nope_test_holds_our_zero_rope_tail(vllm, block_size):
    run_exactly(vllm, "test_concat_and_cache_ds_mla_nope", device="cpu", block_size=block_size)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_vllm_swap_test_holds_our_whole_block_swap(vllm, kv_cache_dtype):
    run_exactly(vllm, "test_swap_blocks_mla", kv_lora_rank=512, qk_rope_head_dim=64, block_size=16, num_blocks=8,
                dtype=torch.bfloat16, seed=0, device="cpu", kv_cache_dtype=kv_cache_dtype)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_vllm_gather_tests_hold_our_gathers(vllm, kv_cache_dtype):
    torch.manual_seed(0)
    sizes = dict(kv_lora_rank=512, qk_rope_head_dim=64, block_size=16, num_blocks=24, max_seq_len=40, batch_size=3,
                 dtype=torch.float32, kv_cache_dtype=kv_cache_dtype, device="cpu")
    run_exactly(vllm, "test_gather_and_maybe_dequant_cache_mla", **sizes)
    if kv_cache_dtype == "auto":  # cp_gather_cache copies bytes; vLLM tests it on an auto cache only
        run_exactly(vllm, "test_cp_gather_cache_mla", **sizes)


def ds_mla_rows(magnitudes):
    """One token per magnitude: a NoPE row of 512 values of about that size, RoPE of 64."""
    gen = torch.Generator().manual_seed(5)
    kv_c = torch.stack([torch.randn(512, generator=gen) * m for m in magnitudes]).to(torch.bfloat16)
    return kv_c, torch.randn(len(magnitudes), 64, generator=gen).to(torch.bfloat16)


def our_upconvert(kv_c, k_pe):
    geom = L.LatentGeometry(num_blocks=1, block_size=kv_c.shape[0], fmt=L.LatentFormat(kind="fp8_ds_mla"))
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    L.concat_and_cache_ds_mla(kv_c, k_pe, region, geom, torch.arange(kv_c.shape[0]))
    return L.gather_latent(region, geom, torch.tensor([[0]]), torch.tensor([kv_c.shape[0]]))


def test_vllm_ds_mla_dequantiser_equals_our_upconvert_for_values_fp16_can_hold(vllm):
    kv_c, k_pe = ds_mla_rows([0.01, 1.0, 30.0, 3000.0])
    theirs = torch.cat(vllm._quantize_dequantize_fp8_ds_mla(kv_c, k_pe, 16, torch.tensor(1.0)), dim=1)
    assert torch.equal(theirs.view(torch.int16), our_upconvert(kv_c, k_pe).view(torch.int16))


def test_vllm_ds_mla_dequantiser_reads_inf_past_fp16s_range_where_the_kernel_does_not(vllm):
    """DSMLA-UPCONVERT: the kernel rounds ``float(code)·scale`` to bf16 once; vLLM's test dequantiser
    (``_dequantize_fp8_ds_mla_entry``) goes through fp16 first, so a value past 65504 reads as inf. (Below,
    nothing is lost: 4 significant bits and the 2^-13 scale floor keep every value on fp16's grid.)"""
    kv_c, k_pe = ds_mla_rows([1e6])
    theirs = torch.cat(vllm._quantize_dequantize_fp8_ds_mla(kv_c, k_pe, 16, torch.tensor(1.0)), dim=1).float()[0]
    ours = our_upconvert(kv_c, k_pe).float()[0]
    past_fp16 = ours.abs() > 65504
    assert past_fp16.any() and torch.isfinite(ours).all()
    assert torch.equal(theirs[past_fp16], ours[past_fp16].sign() * float("inf"))
    assert torch.equal(theirs[~past_fp16], ours[~past_fp16])


def test_vllm_ue8m0_reference_equals_our_indexer_codes_and_scales(vllm):
    gen = torch.Generator().manual_seed(6)
    rows = torch.cat([torch.randn(6, 128, generator=gen) * torch.tensor([[1e-5], [1e-3], [0.1], [1.0], [50.0], [1e4]]),
                      torch.zeros(1, 128), torch.full((1, 128), 448.0), torch.linspace(-672, 672, 128)[None]]).to(torch.bfloat16)
    policy = L.ScalePolicy.indexer("ue8m0", "cuda")
    codes, scale_bytes = R.latent_records.indexer_quantize(rows, policy, "ue8m0", R.fp8.FORMATS[E4M3])
    for t, row in enumerate(rows):
        their_codes, their_scale = vllm._ue8m0_reference(row, 128, 448.0)
        assert torch.equal(their_codes.view(torch.uint8), codes[t]), f"row {t}: codes differ"
        assert torch.equal(their_scale.view(torch.uint8), scale_bytes[t]), f"row {t}: scale {their_scale.item()} vs ours"


@pytest.mark.parametrize("scale_fmt", ["ue8m0", "mxfp8"])
def test_vllm_indexer_round_trip_test_holds_our_indexer_write_and_gather(vllm, scale_fmt):
    torch.manual_seed(0)
    vllm.test_indexer_quant_cache_roundtrip(num_tokens=17, block_size=16, scale_fmt=scale_fmt)


ROCM_CASES = [("float8_e4m3fnuz", "ue8m0", "bfloat16"), ("float8_e4m3fnuz", "float32", "float16"),
              ("float8_e4m3fn", "ue8m0", "float16"), ("float8_e4m3fn", "float32", "bfloat16")]  # gfx942, gfx950


def on_grid_keys(tokens, dtype, seed):
    """Keys whose every ``x / scale`` is an e4m3 value: each row holds ``448·2^j`` and grid values times
    ``2^j``. The Triton CPU interpreter's own fp32→fp8 cast rounds ties away from zero and drops the
    carry into the exponent (31.76 → 16): codes of off-grid values would judge the interpreter, not vLLM."""
    gen = torch.Generator().manual_seed(seed)
    grid = R.fp8.decode_codes(torch.arange(256, dtype=torch.uint8), E4M3)
    grid = grid[torch.isfinite(grid)]
    values = grid[torch.randint(0, grid.numel(), (tokens, 128), generator=gen)]
    values[:, 0] = 448.0
    keys = values * 2.0 ** torch.randint(-12, 8, (tokens, 1), generator=gen)
    keys[3] = 0.0  # an all-zero row: the amax floor
    return keys.to(getattr(torch, dtype))


@pytest.fixture(scope="module")
def vllm_rocm_indexer_writes(tmp_path_factory):
    """Every ROCM_CASES case written by vLLM's ROCm Triton writer, in one process."""
    directory = tmp_path_factory.mktemp("vllm_rocm_indexer")
    source = vllm_sdist.read_sources(vllm_sdist.sdist(tmp_path_factory), (ROCM_OPS,))[ROCM_OPS]
    definitions = vllm_sdist.definitions(source, "_indexer_k_quant_and_cache_kernel", "indexer_k_quant_and_cache_triton")
    script = directory / "vllm_rocm_indexer.py"
    script.write_text(ROCM_DRIVER.format(definitions=definitions))
    gen = torch.Generator().manual_seed(7)
    cases = {}
    for i, (fp8, scale_fmt, dtype) in enumerate(ROCM_CASES):
        slots = torch.randperm(2 * 32, generator=gen)[:24]
        slots[5] = -1
        cases[i] = {"fp8": fp8, "scale_fmt": scale_fmt, "k": on_grid_keys(24, dtype, i), "slots": slots,
                    "cache": torch.zeros(2, 32, 132, dtype=torch.uint8)}
    torch.save(cases, directory / "in.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}  # its cases are CPU tensors, also on a GPU machine
    proc = subprocess.run([sys.executable, str(script), str(directory / "in.pt"), str(directory / "out.pt")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(directory / "out.pt")


@pytest.mark.parametrize("case", range(len(ROCM_CASES)), ids=["-".join(c) for c in ROCM_CASES])
def test_vllm_rocm_triton_indexer_writer_equals_our_shuffled_layout_byte_for_byte(vllm_rocm_indexer_writes, case):
    """IDX-LAYOUT on ROCm: values in 16-row x 16-byte tiles, float32 scales after them, the gfx942 divisor."""
    written = vllm_rocm_indexer_writes[case]
    fmt = L.LatentFormat(kind="indexer", scale_format=written["scale_fmt"], model_dtype=written["k"].dtype, platform="rocm",
                         arch="gfx942" if written["fp8"] == "float8_e4m3fnuz" else "gfx950", indexer_layout="shuffle")
    geom = L.LatentGeometry(num_blocks=2, block_size=32, fmt=fmt)
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    L.indexer_k_quant_and_cache(written["k"], region, geom, written["slots"])
    differ = torch.nonzero(region != written["cache"].view(-1)).flatten()
    assert differ.numel() == 0, {k: v[:3] if isinstance(v, list) else v[:3].tolist() for k, v in L.coordinates_of(geom, differ).items()}
