"""The per-token-head reference (reference/quant_layouts.py, quant_codecs.py; SPEC §16) held
against vLLM 0.33.0's own code from its sdist: the scale and data views of
``TritonAttentionImpl._ensure_scale_caches`` / ``_pth_key_value_caches``, the Triton writer
``triton_reshape_and_cache_flash_per_token_head_quant`` (under the CPU interpreter) and the torch
reference of its tests (``_quantize_per_token_head_ref``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import vllm_sdist

ORDERS = QL.ORDERS
GUARD = 16  # bytes before the cache: vLLM's views must honour the storage offset
WRITER = "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py"
BACKEND = "vllm/v1/attention/backends/triton_attn.py"
TESTS = "tests/quantization/test_per_token_kv_cache.py"
# What the extracted code imports from vLLM, as 0.33.0 has it on a CUDA machine (CPU here).
STAND_INS = '''
import dataclasses
from dataclasses import dataclass
import torch
import triton
import triton.language as tl


class KVQuantMode:
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


class current_platform:
    is_rocm = is_xpu = staticmethod(lambda: False)


FP8_DTYPE = torch.float8_e4m3fn
FP8_MIN, FP8_MAX = -448.0, 448.0


def get_dtype_size(dtype):
    return torch.tensor([], dtype=dtype).element_size()
'''


# Appended to the extracted code: vLLM's views of one cache, and a writer run from the command
# line (the kernel runs in a process that imports Triton under TRITON_INTERPRET=1, on CPU tensors).
DRIVER = '''

def cache_views(buffer, shape, strides, offset, mode_id):
    dtype = torch.int8 if mode_id == KVQuantMode.INT8_PER_TOKEN_HEAD else torch.uint8
    impl = Impl()
    impl._kv_quant_mode = mode_id
    key_cache, value_cache = impl._pth_key_value_caches(torch.as_strided(buffer.view(dtype), shape, strides, offset))
    return impl, key_cache, value_cache


def write(buffer, shape, strides, offset, mode_id, key, value, slots):
    impl, key_cache, value_cache = cache_views(buffer, shape, strides, offset, mode_id)
    triton_reshape_and_cache_flash_per_token_head_quant(
        key, value, key_cache, value_cache, impl._k_scale_cache, impl._v_scale_cache, slots, kv_quant_mode=mode_id)


if __name__ == "__main__":
    import sys
    cases = torch.load(sys.argv[1])
    for case in cases.values():
        write(**case)
    torch.save(cases, sys.argv[2])
'''


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM's writer, view code and test reference, loaded without vLLM."""
    directory = tmp_path_factory.mktemp("vllm_pth")
    src = vllm_sdist.read_sources(vllm_sdist.sdist(tmp_path_factory), (WRITER, BACKEND, TESTS))
    views = vllm_sdist.definitions(src[BACKEND], "TritonAttentionImpl._ensure_scale_caches", "TritonAttentionImpl._pth_key_value_caches")
    inline_import = "from vllm.utils.torch_utils import get_dtype_size"
    assert inline_import in views, "vLLM's _ensure_scale_caches changed its import; update the stand-ins"
    views = views.replace(inline_import, "pass  # get_dtype_size: the stand-in above")
    text = "\n\n".join((
        STAND_INS,
        vllm_sdist.definitions(src[WRITER], "_reshape_cache_per_token_head", "_PER_TOKEN_HEAD_QUANT_PARAMS",
                               "triton_reshape_and_cache_flash_per_token_head_quant"),
        views,
        "class Impl:\n    _k_scale_cache = _v_scale_cache = None\n    fp8_dtype = FP8_DTYPE\n"
        "    _ensure_scale_caches = _ensure_scale_caches\n    _pth_key_value_caches = _pth_key_value_caches\n",
        vllm_sdist.definitions(src[TESTS], "QuantConfig", "_quantize_per_token_head_ref"),
    ))
    return vllm_sdist.load_module(directory, "vllm_pth_extract", text + DRIVER)


def geometry(order, mode="int8_per_token_head", **kw):
    return QL.QuantGeometry(**{"num_blocks": 3, "block_size": 4, "num_kv_heads": 2, "head_size": 8, "mode": mode, "order": order, **kw})


def vllm_cache(vllm, g, buffer, mode_id):
    """vLLM's views (impl with scale views, K and V data views) of ``buffer[GUARD:]`` as ``g``."""
    return vllm.cache_views(buffer, g.shape(), g.strides(), GUARD, mode_id)


def byte_addresses(view: torch.Tensor, index: tuple) -> torch.Tensor:
    """Byte offset in its storage of each element ``view[index]``, bytes last."""
    elem = view.element_size()
    first = sum(i * s for i, s in zip(index, view.stride())) + view.storage_offset()
    return first[..., None] * elem + torch.arange(elem)


@pytest.mark.parametrize("order", ORDERS)
def test_fields_tile_every_page_byte_exactly_once(order):
    g = geometry(order, num_layers=2)
    blocks, slots, heads = torch.meshgrid(torch.arange(g.num_blocks), torch.arange(g.block_size), torch.arange(g.num_kv_heads), indexing="ij")
    offs = [f.flatten() for layer in range(g.num_layers) for f in QL.field_offsets(g, blocks, slots, heads, layer).values()]
    assert torch.equal(torch.cat(offs).sort().values, torch.arange(g.nbytes()))


@pytest.mark.parametrize("order", ORDERS)
def test_coordinates_of_inverts_field_offsets(order):
    g = geometry(order)
    offs = QL.field_offsets(g, 2, 3, 1)
    assert QL.coordinates_of(g, int(offs["v_scale"][2])) == {"layer": 0, "block": 2, "slot": 3, "head": 1, "field": "v_scale", "byte": 2}
    assert QL.coordinates_of(g, int(offs["k_data"][5]))["field"] == "k_data"


@pytest.mark.parametrize("order", ORDERS)
def test_vllm_scale_and_data_views_address_the_reference_bytes(vllm, order):
    g = geometry(order)
    impl, key_cache, value_cache = vllm_cache(vllm, g, torch.zeros(GUARD + g.nbytes(), dtype=torch.uint8), 2)
    b, n, h = torch.meshgrid(torch.arange(g.num_blocks), torch.arange(g.block_size), torch.arange(g.num_kv_heads), indexing="ij")
    d = torch.arange(g.head_size)
    ours = QL.field_offsets(g, b, n, h)
    theirs = {
        "k_scale": byte_addresses(impl._k_scale_cache, (b, n, h)),
        "v_scale": byte_addresses(impl._v_scale_cache, (b, n, h)),
        "k_data": byte_addresses(key_cache, (b[..., None], n[..., None], h[..., None], d))[..., 0],
        "v_data": byte_addresses(value_cache, (b[..., None], n[..., None], h[..., None], d))[..., 0],
    }
    for field in QL.FIELDS:
        assert torch.equal(theirs[field], ours[field] + GUARD), field


MODE_IDS = {"int8_per_token_head": 2, "fp8_per_token_head": 3}  # KVQuantMode values


def write_case(g, buffer, key, value, slots) -> dict:
    return {"buffer": buffer, "shape": g.shape(), "strides": g.strides(), "offset": GUARD, "mode_id": MODE_IDS[g.mode],
            "key": key, "value": value, "slots": slots}


@pytest.fixture(scope="module")
def vllm_writes(vllm, tmp_path_factory):
    """Every case of WRITE_CASES written by vLLM's Triton writer, in one process: name -> buffer."""
    directory = tmp_path_factory.mktemp("vllm_writes")
    torch.save({name: write_case(*make()) for name, make in WRITE_CASES.items()}, directory / "in.pt")
    # The cases' tensors are CPU tensors: the writer runs under the interpreter on any machine.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(vllm.__file__), os.environ.get("PYTHONPATH", "")]),
           "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, vllm.__file__, str(directory / "in.pt"), str(directory / "out.pt")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: case["buffer"] for name, case in torch.load(directory / "out.pt").items()}


def rows(tokens, g, seed, spread=3.0):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3, g.num_kv_heads, g.head_size, generator=gen) * spread
    _, key, value = qkv.to(torch.bfloat16).unbind(1)  # rows of one qkv tensor: row stride 3·H·D
    return key, value


def random_buffer(g, seed):
    return torch.randint(0, 256, (GUARD + g.nbytes(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def int8_case(order):
    g = geometry(order, head_size=64, num_kv_heads=3)
    return (g, random_buffer(g, 2), *rows(7, g, seed=1), torch.tensor([0, 5, -1, 11, 6, 2, 9]))


def fp8_case(order):
    g = geometry(order, head_size=64, mode="fp8_per_token_head")
    return (g, random_buffer(g, 3), *rows(5, g, seed=3), torch.tensor([1, 4, 7, 8, 10]))


TIES = torch.tensor([[[127.0, 2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 0.0]] * 2], dtype=torch.bfloat16)  # amax 127: scale 1, y = x


def ties_case():
    g = geometry("HND")
    return g, torch.zeros(GUARD + g.nbytes(), dtype=torch.uint8), TIES, TIES, torch.tensor([3])


WRITE_CASES = {f"int8-{o}": (lambda o=o: int8_case(o)) for o in ORDERS} | {f"fp8-{o}": (lambda o=o: fp8_case(o)) for o in ORDERS}
WRITE_CASES["ties"] = ties_case


@pytest.mark.parametrize("order", ORDERS)
def test_int8_reference_write_equals_vllm_writer_byte_for_byte(vllm_writes, order):
    g, initial, key, value, slots = int8_case(order)
    ours = initial.clone()
    QC.initialise_scales(ours[GUARD:], g)  # vLLM's first use of the cache builds its scale views
    QC.write(key, value, ours[GUARD:], g, slots)
    assert torch.equal(ours, vllm_writes[f"int8-{order}"])


@pytest.mark.parametrize("order", ORDERS)
def test_fp8_reference_scales_equal_vllm_writer_and_codes_equal_vllm_test_reference(vllm, vllm_writes, order):
    """The interpreter's fp8 cast drops rounding carries (backends_under_test/vllm_backend.py
    INTERPRETER_FP8), so the codes are held against vLLM's torch reference instead."""
    g, initial, key, value, slots = fp8_case(order)
    ours, theirs = initial.clone(), vllm_writes[f"fp8-{order}"]
    QC.initialise_scales(ours[GUARD:], g)
    QC.write(key, value, ours[GUARD:], g, slots)
    where = QL.field_offsets(g, (slots // g.block_size)[:, None], (slots % g.block_size)[:, None], torch.arange(g.num_kv_heads))
    written = torch.cat([f.flatten() for f in where.values()]) + GUARD
    untouched = torch.ones_like(ours, dtype=torch.bool).index_fill_(0, written, False)
    assert torch.equal(ours[untouched], theirs[untouched])
    for side in ("k_scale", "v_scale"):
        assert torch.equal(ours[GUARD + where[side]], theirs[GUARD + where[side]]), side
    cfg = vllm.QuantConfig(torch.float8_e4m3fn, "fp8_per_token_head", 448.0, -448.0, 3, False)
    for side, x in (("k_data", key), ("v_data", value)):
        codes, _ = vllm._quantize_per_token_head_ref(x, cfg)
        assert torch.equal(ours[GUARD + where[side]], codes.view(torch.uint8)), side


def test_int8_encode_equals_vllm_test_reference_except_at_exact_ties(vllm):
    """bf16 inputs land exactly on k + 1/2 now and then (11 of 32768 here): there the kernel and
    kvconform round away from zero, vLLM's test reference (torch.round) to even."""
    x = torch.randn(64, 4, 128, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16) * 5
    cfg = vllm.QuantConfig(torch.int8, "int8_per_token_head", 127.0, -128.0, 2, True)
    codes, scales = vllm._quantize_per_token_head_ref(x, cfg)
    ours, our_scales = QC.encode(x, "int8_per_token_head")
    y = x.float() * (1.0 / our_scales)[..., None]
    ties = (y - y.trunc()).abs() == 0.5
    assert torch.equal(our_scales, scales)
    assert torch.equal(ours.view(torch.int8)[~ties], codes[~ties])
    assert ties.any() and torch.equal(ours.view(torch.int8)[ties].float(), y[ties] + y[ties].sign() * 0.5)


def test_int8_ties_round_away_from_zero_like_vllms_kernel_not_half_even_like_its_test_reference(vllm, vllm_writes):
    """The kernel adds 0.5 and truncates (2.5 -> 3); vLLM's test reference uses torch.round
    (2.5 -> 2). SPEC PTH-ENCODE-INT8 follows the kernel."""
    g = geometry("HND")
    kernel = vllm_writes["ties"][GUARD + QL.field_offsets(g, 0, 3, 0)["k_data"]].view(torch.int8)
    ours = QC.encode(TIES[0, 0], "int8_per_token_head")[0].view(torch.int8)
    half_even = vllm._quantize_per_token_head_ref(TIES, vllm.QuantConfig(torch.int8, "", 127.0, -128.0, 2, True))[0][0, 0]
    assert kernel.tolist() == ours.tolist() == [127, 3, -3, 1, -1, 2, -2, 0]
    assert half_even.tolist() == [127, 2, -2, 0, 0, 2, -2, 0]


def test_zero_rows_get_the_scale_floor_and_zero_codes():
    for mode in QL.PTH_MODES:
        codes, scales = QC.encode(torch.zeros(2, 8), mode)
        assert torch.equal(codes, torch.zeros(2, 8, dtype=torch.uint8))
        assert torch.equal(scales, torch.full((2,), 1e-6, dtype=torch.float32))


def test_the_largest_magnitude_maps_to_plus_minus_quant_max():
    x = torch.tensor([[-3.0, 1.0, 3.0, 0.0]])
    assert QC.encode(x, "int8_per_token_head")[0].view(torch.int8).tolist() == [[-127, 42, 127, 0]]
    assert QC.decode(QC.encode(x, "fp8_per_token_head")[0], QC.encode(x, "fp8_per_token_head")[1], "fp8_per_token_head")[0, 0] == -3.0
    assert QC.quant_max("fp8_per_token_head", "rocm", "gfx942") == 224.0


def test_int8_rounding_offset_is_added_in_float32():
    """y = 0.5 - 2^-25 plus 0.5 rounds (ties to even) to 1.0 in float32, so the code is 1 — as in
    the kernel, though y is below one half."""
    y = 0.5 - 2.0**-25
    x = torch.tensor([[127.0, y]], dtype=torch.float32)  # amax 127: scale 1, y kept exactly
    assert QC.encode(x, "int8_per_token_head")[0].view(torch.int8).tolist() == [[127, 1]]


@pytest.mark.parametrize("order", ORDERS)
def test_copy_and_swap_move_each_page_with_its_scales(order):
    g = geometry(order, num_layers=2)
    region = torch.randint(0, 256, (g.nbytes(),), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    before = region.clone()
    QC.copy_blocks(region, g, torch.tensor([[0, 2]]))
    for layer in range(2):
        src, dst = (QL.field_offsets(g, b, torch.arange(g.block_size)[:, None], torch.arange(g.num_kv_heads), layer) for b in (0, 2))
        for field in QL.FIELDS:
            assert torch.equal(region[dst[field]], before[src[field]])
    host = torch.zeros_like(region)
    QC.swap_blocks(region, g, host, g, [2], [1])
    start, length = QL.block_byte_ranges(g, [1], layer=1)[0]
    assert torch.equal(host[start:start + length], before[QL.block_byte_ranges(g, [0], layer=1)[0][0]:][:length])


@pytest.mark.parametrize("order", ORDERS)
def test_head_slice_ranges_hold_exactly_the_heads_data_and_scales(order):
    g = geometry(order, num_kv_heads=4, num_layers=2)
    runs = QL.head_slice_ranges(g, [1, 2], range(1, 3))
    got = torch.cat([torch.arange(s, s + n) for s, n in runs]).sort().values
    want = torch.cat([f.flatten() for layer in range(2) for f in QL.field_offsets(
        g, torch.tensor([1, 2])[:, None, None], torch.arange(g.block_size)[:, None], torch.arange(1, 3), layer).values()])
    assert torch.equal(got, want.sort().values)


def test_decode_reads_what_the_writer_wrote():
    g = geometry("NHD", head_size=16)
    key, value = rows(8, g, seed=6)
    region = torch.zeros(g.nbytes(), dtype=torch.uint8)
    QC.write(key, value, region, g, torch.arange(8) + 4)
    k, v, valid = QC.dequantised_kv(region, g, torch.tensor([[1, 2]]), torch.tensor([8]))
    assert valid.all()
    torch.testing.assert_close(k[0], key.float(), atol=0.05, rtol=0.02)
    torch.testing.assert_close(v[0], value.float(), atol=0.05, rtol=0.02)
