"""Portable Triton kernels for latent (MLA) caches: the three writers, the gathers, MLA decode.

Record formats (SPEC §17, ``reference.latent``): a plain MLA row ``[kv_c | k_pe]`` in the model
dtype or in per-tensor fp8; an ``fp8_ds_mla`` 656-byte record (512 e4m3 codes in 4 tiles of 128,
4 float32 tile scales, 64 raw 16-bit RoPE values); an indexer key page per block (``block_size``
rows of D e4m3 codes, then ``block_size`` scale entries).

fp8 records and indexer pages are reached as bytes through one uint8 pointer: float32 scales and
16-bit RoPE values are split into (writers) or assembled from (readers) their little-endian bytes,
so no field needs a wider alignment than a byte. As in :mod:`triton_kernels`: every address is
int64 (blocks past 2^16, byte offsets past 2^31), division is ``div_rn`` and fp8 rounding is done
in software. fp32 → bfloat16 is rounded in software too: the interpreter's cast truncates (measured:
0.0108 → 0.010742), hardware ``cvt.rn`` rounds to nearest even as torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_interpreter import interpreted
from .triton_kernels import FP8, INTERPRETER_QUERY_HEADS, INTERPRETER_TOKENS, _encode

# Record forms a reader dequantises (constexpr FORM).
PLAIN16, PLAIN_FP8, DS_MLA = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
# The fp8_ds_mla record: 4 tiles of 128 codes, at 512 the 4 float32 scales, at 528 the 64 RoPE values; 656 bytes.
DS_RANK, DS_ROPE, DS_TILE = tl.constexpr(512), tl.constexpr(64), tl.constexpr(128)
DS_SCALES, DS_ROPE_AT, DS_RECORD = tl.constexpr(512), tl.constexpr(528), tl.constexpr(656)
IDX_GROUP = tl.constexpr(128)  # indexer values sharing one scale
DECODE_TOKENS = tl.constexpr(16)  # positions per decode step


@triton.jit
def _pow2_ceil(s):
    """A positive float32 rounded up to a power of two, exactly (2^ceil(log2 s); inf stays inf).

    Bit arithmetic, not exp2/log2: hardware log2 is approximate. It equals
    ``exp2(ceil(log2(s)))`` for every scale a 16-bit amax can give (all bf16/fp16 checked).
    """
    bits = s.to(tl.int32, bitcast=True)
    up = (bits + 0x7FFFFF) & 0x7F800000
    return tl.where((bits & 0x7FFFFF) == 0, bits, up).to(tl.float32, bitcast=True)


@triton.jit
def _to_model_bits(x, MODEL_BF16: tl.constexpr):
    """fp32 → the model dtype's 16-bit pattern (int16), rounded to nearest even (a bf16 NaN is the canonical 0x7FC0)."""
    if MODEL_BF16:
        bits = x.to(tl.int32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        out = tl.where(x != x, 0x7FC0, rounded).to(tl.int16)
    else:
        out = x.to(tl.float16).to(tl.int16, bitcast=True)
    return out


@triton.jit
def _from_model_bits(bits, MODEL: tl.constexpr):
    """int16 patterns of the model dtype → fp32."""
    return bits.to(MODEL, bitcast=True).to(tl.float32)


@triton.jit
def _word_bytes(word, k):
    """Byte ``k`` (little-endian) of each int32 ``word``, as uint8."""
    return ((word >> (8 * k)) & 0xFF).to(tl.uint8)


@triton.jit
def _fp8_values(codes, CODE: tl.constexpr):
    """uint8 codes read as the fp8 type ``CODE``, in fp32. The fnuz NaN (0x80) is made NaN here:
    the interpreter's conversion reads it as -0.0."""
    v = codes.to(CODE, bitcast=True).to(tl.float32)
    if CODE == tl.float8e4b8:
        v = tl.where(codes == 0x80, float("nan"), v)
    return v


@triton.jit
def _tile_scale(cache_ptr, row, i, ok):
    """The float32 scale of tile ``i`` of the ds_mla records at byte offsets ``row`` ([T, 1]), from its 4 bytes."""
    at = cache_ptr + row + DS_SCALES + i * 4
    word = tl.load(at, mask=ok, other=0).to(tl.int32)
    for k in tl.static_range(1, 4):
        word = word | (tl.load(at + k, mask=ok, other=0).to(tl.int32) << (8 * k))
    return word.to(tl.float32, bitcast=True)


# ------------------------------------------------------------------------------ writers
@triton.jit
def concat_and_cache_mla_kernel(
    kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, scale_ptr, num_tokens,
    kv_c_stride_t, kv_c_stride_d, k_pe_stride_t, k_pe_stride_d, block_stride, entry_stride,
    BLOCK_SIZE: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    TOKENS: tl.constexpr, QUANT: tl.constexpr, OUT: tl.constexpr, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr,
    SUB_ULP: tl.constexpr, MAX: tl.constexpr, NAN_CODE: tl.constexpr, SIGNED_NAN: tl.constexpr,
):
    """Plain MLA: row ``[kv_c | k_pe]`` of each token's slot; 16-bit bits copied, or ``x / scale`` as fp8 codes.

    One program per TOKENS tokens; padding slots (< 0) and tokens past ``num_tokens`` touch nothing.
    """
    t = (tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None]
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    row = (slot // BLOCK_SIZE) * block_stride + (slot % BLOCK_SIZE) * entry_stride
    scale = 1.0
    if QUANT:
        scale = tl.load(scale_ptr)
    d = tl.arange(0, BLOCK_R)[None, :]
    x = tl.load(kv_c_ptr + t * kv_c_stride_t + d * kv_c_stride_d, mask=(t < num_tokens) & (d < RANK))
    if QUANT:
        x = _encode(x, scale, OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN).to(tl.uint8, bitcast=True)
    tl.store(cache_ptr + row + d, x, mask=(slot >= 0) & (d < RANK))
    if ROPE > 0:
        p = tl.arange(0, BLOCK_P)[None, :]
        y = tl.load(k_pe_ptr + t * k_pe_stride_t + p * k_pe_stride_d, mask=(t < num_tokens) & (p < ROPE))
        if QUANT:
            y = _encode(y, scale, OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN).to(tl.uint8, bitcast=True)
        tl.store(cache_ptr + row + RANK + p, y, mask=(slot >= 0) & (p < ROPE))


@triton.jit
def concat_and_cache_ds_mla_kernel(
    kv_c_ptr, k_pe_ptr, cache_ptr, slot_ptr, num_tokens,
    kv_c_stride_t, kv_c_stride_d, k_pe_stride_t, k_pe_stride_d, block_stride,
    BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr, HAS_ROPE: tl.constexpr, DIVISOR: tl.constexpr, FLOOR: tl.constexpr,
    POW2: tl.constexpr, OUT: tl.constexpr, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_ULP: tl.constexpr, MAX: tl.constexpr,
    NAN_CODE: tl.constexpr, SIGNED_NAN: tl.constexpr,
):
    """fp8_ds_mla: per tile of 128 ``scale = max(amax / DIVISOR, FLOOR)`` (rounded up to 2^k if POW2),
    codes ``x / scale``, the 4 scales' bytes, then ``k_pe``'s raw 16-bit values (``k_pe_ptr`` is an int16 view).

    amax ignores NaN, as CUDA ``fmaxf`` does (``tl.max`` propagates it in the interpreter only).
    """
    t = (tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None, None]
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    row = (slot // BLOCK_SIZE) * block_stride + (slot % BLOCK_SIZE) * DS_RECORD  # [T, 1, 1]
    ok = slot >= 0
    tile = tl.arange(0, DS_RANK // DS_TILE)[None, :, None]
    e = tl.arange(0, DS_TILE)[None, None, :]
    x = tl.load(kv_c_ptr + t * kv_c_stride_t + (tile * DS_TILE + e) * kv_c_stride_d, mask=t < num_tokens, other=0.0).to(tl.float32)
    amax = tl.max(tl.where(x == x, tl.abs(x), 0.0), axis=2)  # [T, 4]
    scale = tl.maximum(tl.math.div_rn(amax, tl.full(amax.shape, DIVISOR, tl.float32)), FLOOR)
    if POW2:
        scale = _pow2_ceil(scale)
    codes = _encode(x, scale[:, :, None], OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN)
    tl.store(cache_ptr + row + tile * DS_TILE + e, codes.to(tl.uint8, bitcast=True), mask=ok)
    k = tl.arange(0, 4)[None, None, :]
    tl.store(cache_ptr + row + DS_SCALES + tile * 4 + k, _word_bytes(scale.to(tl.int32, bitcast=True)[:, :, None], k), mask=ok)
    p = tl.arange(0, DS_ROPE)[None, :, None]
    b = tl.arange(0, 2)[None, None, :]
    pe = tl.zeros([TOKENS, DS_ROPE, 1], tl.int32)
    if HAS_ROPE:
        pe = tl.load(k_pe_ptr + t * k_pe_stride_t + p * k_pe_stride_d, mask=t < num_tokens, other=0).to(tl.int32)
    tl.store(cache_ptr + row + DS_ROPE_AT + p * 2 + b, _word_bytes(pe, b), mask=ok)


@triton.jit
def indexer_k_quant_and_cache_kernel(
    k_ptr, cache_ptr, slot_ptr, num_tokens, k_stride_t, k_stride_d, block_stride,
    BLOCK_SIZE: tl.constexpr, GROUPS: tl.constexpr, BLOCK_G: tl.constexpr, TOKENS: tl.constexpr,
    DIVISOR: tl.constexpr, FLOOR: tl.constexpr, POW2: tl.constexpr, MX: tl.constexpr,
    OUT: tl.constexpr, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_ULP: tl.constexpr, MAX: tl.constexpr,
    NAN_CODE: tl.constexpr, SIGNED_NAN: tl.constexpr,
):
    """Indexer keys ``[T, GROUPS·128]``: per group of 128 ``scale = max(amax, FLOOR) / DIVISOR`` (up to
    2^k if POW2), codes ``x / scale`` at ``b·page + n·D + d``; at ``b·page + N·D + n·D/32`` 4 bytes
    per group: the float32 scale's, or (MX) its exponent byte 4 times (one per 32 values)."""
    t = (tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None, None]
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    page = (slot // BLOCK_SIZE) * block_stride
    n = slot % BLOCK_SIZE
    g = tl.arange(0, BLOCK_G)[None, :, None]
    e = tl.arange(0, IDX_GROUP)[None, None, :]
    ok = (slot >= 0) & (g < GROUPS)
    d = g * IDX_GROUP + e
    x = tl.load(k_ptr + t * k_stride_t + d * k_stride_d, mask=(t < num_tokens) & (g < GROUPS), other=0.0).to(tl.float32)
    amax = tl.max(tl.where(x == x, tl.abs(x), 0.0), axis=2)  # [T, G]
    scale = tl.math.div_rn(tl.maximum(amax, FLOOR), tl.full(amax.shape, DIVISOR, tl.float32))
    if POW2:
        scale = _pow2_ceil(scale)
    codes = _encode(x, scale[:, :, None], OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN)
    tl.store(cache_ptr + page + n * (GROUPS * IDX_GROUP) + d, codes.to(tl.uint8, bitcast=True), mask=ok)
    j = tl.arange(0, 4)[None, None, :]
    word = scale.to(tl.int32, bitcast=True)[:, :, None]
    if MX:
        sbytes = tl.broadcast_to(((word >> 23) & 0xFF).to(tl.uint8), (TOKENS, BLOCK_G, 4))
    else:
        sbytes = _word_bytes(word, j)
    tl.store(cache_ptr + page + BLOCK_SIZE * (GROUPS * IDX_GROUP) + n * (GROUPS * 4) + g * 4 + j, sbytes, mask=ok)


# ------------------------------------------------------------------------------ readers
@triton.jit
def _sequence_rows(table_ptr, seq_lens_ptr, s, pos, table_stride, block_stride, entry_stride, BLOCK_SIZE: tl.constexpr):
    """Byte/element offsets of the records at positions ``pos`` of sequence ``s`` through its block table, and which exist."""
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int64)
    ok = pos < seq_len
    blk = tl.load(table_ptr + s * table_stride + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    return blk * block_stride + (pos % BLOCK_SIZE) * entry_stride, ok


@triton.jit
def _latent_values(cache_ptr, row, ok, d, scale, WIDTH: tl.constexpr, AT: tl.constexpr, FORM: tl.constexpr,
                   MODEL: tl.constexpr, CODE: tl.constexpr):
    """fp32 values ``AT + d`` (< ``AT + WIDTH``) of latent records at ``row`` (``row``, ``ok``: [T, 1]).

    PLAIN16: 16-bit elements (int16 pointer); PLAIN_FP8: codes · scale; DS_MLA: record bytes —
    codes · their tile's scale in the NoPE part, raw 16-bit values in the RoPE part.
    """
    mask = ok & (d < WIDTH)
    if FORM == PLAIN16:
        v = _from_model_bits(tl.load(cache_ptr + row + AT + d, mask=mask, other=0), MODEL)
    elif FORM == PLAIN_FP8:
        v = _fp8_values(tl.load(cache_ptr + row + AT + d, mask=mask, other=0), CODE) * scale
    elif AT == 0:
        scale = _tile_scale(cache_ptr, row, 0, ok)
        for i in tl.static_range(1, DS_RANK // DS_TILE):
            scale = tl.where(d // DS_TILE == i, _tile_scale(cache_ptr, row, i, ok), scale)
        v = _fp8_values(tl.load(cache_ptr + row + d, mask=mask, other=0), CODE) * scale
    else:
        lo = tl.load(cache_ptr + row + DS_ROPE_AT + 2 * d, mask=mask, other=0).to(tl.int32)
        hi = tl.load(cache_ptr + row + DS_ROPE_AT + 2 * d + 1, mask=mask, other=0).to(tl.int32)
        v = _from_model_bits((lo | (hi << 8)).to(tl.int16), MODEL)
    return v


@triton.jit
def gather_latent_kernel(
    cache_ptr, out_ptr, table_ptr, seq_lens_ptr, starts_ptr, scale_ptr,
    table_stride, out_stride, block_stride, entry_stride,
    BLOCK_SIZE: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    TOKENS: tl.constexpr, FORM: tl.constexpr, MODEL: tl.constexpr, MODEL_BF16: tl.constexpr, CODE: tl.constexpr,
):
    """One program per (sequence, TOKENS positions): rows ``starts[s] + pos`` of ``out`` (an int16
    view of the model-dtype output) get the dequantised latent; PLAIN16 rows are bit copies."""
    s = tl.program_id(0).to(tl.int64)
    pos = (tl.program_id(1).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None]
    row, ok = _sequence_rows(table_ptr, seq_lens_ptr, s, pos, table_stride, block_stride, entry_stride, BLOCK_SIZE)
    dst = out_ptr + (tl.load(starts_ptr + s).to(tl.int64) + pos) * out_stride
    scale = 1.0
    if FORM == PLAIN_FP8:
        scale = tl.load(scale_ptr)
    d = tl.arange(0, BLOCK_R)[None, :]
    p = tl.arange(0, BLOCK_P)[None, :]
    if FORM == PLAIN16:
        tl.store(dst + d, tl.load(cache_ptr + row + d, mask=ok & (d < RANK)), mask=ok & (d < RANK))
        tl.store(dst + RANK + p, tl.load(cache_ptr + row + RANK + p, mask=ok & (p < ROPE)), mask=ok & (p < ROPE))
    else:
        nope = _latent_values(cache_ptr, row, ok, d, scale, RANK, 0, FORM, MODEL, CODE)
        tl.store(dst + d, _to_model_bits(nope, MODEL_BF16), mask=ok & (d < RANK))
        pe = _latent_values(cache_ptr, row, ok, p, scale, ROPE, RANK, FORM, MODEL, CODE)
        tl.store(dst + RANK + p, _to_model_bits(pe, MODEL_BF16), mask=ok & (p < ROPE))


@triton.jit
def gather_indexer_kernel(
    cache_ptr, values_ptr, scales_ptr, table_ptr, seq_lens_ptr, starts_ptr, table_stride, block_stride,
    BLOCK_SIZE: tl.constexpr, HEAD_DIM: tl.constexpr, SCALE_BYTES: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    TOKENS: tl.constexpr,
):
    """``cp_gather_indexer_k_quant_cache``: the value bytes and scale bytes of each sequence's keys, out of their pages."""
    s = tl.program_id(0).to(tl.int64)
    pos = (tl.program_id(1).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None]
    page, ok = _sequence_rows(table_ptr, seq_lens_ptr, s, pos, table_stride, block_stride, 0, BLOCK_SIZE)
    n = pos % BLOCK_SIZE
    out = tl.load(starts_ptr + s).to(tl.int64) + pos
    d = tl.arange(0, BLOCK_D)[None, :]
    values_ok = ok & (d < HEAD_DIM)
    tl.store(values_ptr + out * HEAD_DIM + d, tl.load(cache_ptr + page + n * HEAD_DIM + d, mask=values_ok), mask=values_ok)
    j = tl.arange(0, BLOCK_S)[None, :]
    scales_ok = ok & (j < SCALE_BYTES)
    sbytes = tl.load(cache_ptr + page + BLOCK_SIZE * HEAD_DIM + n * SCALE_BYTES + j, mask=scales_ok)
    tl.store(scales_ptr + out * SCALE_BYTES + j, sbytes, mask=scales_ok)


@triton.jit
def mla_decode_kernel(
    q_ptr, out_ptr, cache_ptr, table_ptr, seq_lens_ptr, scale_ptr,
    q_stride_s, q_stride_h, q_stride_d, out_stride_s, out_stride_h, table_stride, block_stride, entry_stride,
    softmax_scale, num_heads,
    BLOCK_SIZE: tl.constexpr, RANK: tl.constexpr, ROPE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr,
    BLOCK_HQ: tl.constexpr, FORM: tl.constexpr, MODEL: tl.constexpr, MODEL_BF16: tl.constexpr, CODE: tl.constexpr,
):
    """MLA decode, one program per (sequence, BLOCK_HQ query heads): K = the whole dequantised
    latent, V = its first RANK values, one latent per token for every head; fp32 online softmax
    over tiles of DECODE_TOKENS positions (each through the block table).

    Products are fp32 broadcast sums, not ``tl.dot`` (TF32 on NVIDIA by default; its IEEE form is an
    unrolled FMA loop that took ~20 s to compile per variant).
    """
    s = tl.program_id(0).to(tl.int64)
    h = (tl.program_id(1).to(tl.int64) * BLOCK_HQ + tl.arange(0, BLOCK_HQ).to(tl.int64))[:, None]
    d = tl.arange(0, BLOCK_R)[None, :]
    p = tl.arange(0, BLOCK_P)[None, :]
    q_row = q_ptr + s * q_stride_s + h * q_stride_h
    q_nope = tl.load(q_row + d * q_stride_d, mask=(h < num_heads) & (d < RANK), other=0.0).to(tl.float32)
    q_pe = tl.load(q_row + (RANK + p) * q_stride_d, mask=(h < num_heads) & (p < ROPE), other=0.0).to(tl.float32)
    scale = 1.0
    if FORM == PLAIN_FP8:
        scale = tl.load(scale_ptr)
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int64)
    n = tl.arange(0, DECODE_TOKENS).to(tl.int64)[:, None]
    m_i = tl.full([BLOCK_HQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_HQ], dtype=tl.float32)
    acc = tl.zeros([BLOCK_HQ, BLOCK_R], dtype=tl.float32)
    for j in range(0, tl.cdiv(seq_len, DECODE_TOKENS)):
        row, ok = _sequence_rows(table_ptr, seq_lens_ptr, s, j * DECODE_TOKENS + n, table_stride, block_stride, entry_stride, BLOCK_SIZE)
        k_nope = _latent_values(cache_ptr, row, ok, d, scale, RANK, 0, FORM, MODEL, CODE)  # [N, R]
        k_pe = _latent_values(cache_ptr, row, ok, p, scale, ROPE, RANK, FORM, MODEL, CODE)  # [N, P]
        if FORM != PLAIN16:  # K is the gathered latent: dequantised values rounded to the model dtype
            k_nope = _from_model_bits(_to_model_bits(k_nope, MODEL_BF16), MODEL)
            k_pe = _from_model_bits(_to_model_bits(k_pe, MODEL_BF16), MODEL)
        qk = tl.sum(q_nope[:, None, :] * k_nope[None, :, :], axis=2) + tl.sum(q_pe[:, None, :] * k_pe[None, :, :], axis=2)
        qk = tl.where(tl.trans(ok), qk * softmax_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        prob = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(prob, axis=1)
        acc = acc * alpha[:, None] + tl.sum(prob[:, :, None] * k_nope[None, :, :], axis=1)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty sequence gives zeros, not 0/0
    tl.store(out_ptr + s * out_stride_s + h * out_stride_h + d, _to_model_bits(out, MODEL_BF16), mask=(h < num_heads) & (d < RANK))


# ------------------------------------------------------------------------------ launchers
def fp8_args(code_dtype: torch.dtype) -> dict:
    """The constexprs of :func:`triton_kernels._encode` for an fp8 storage dtype."""
    out, man, min_normal, sub_ulp, top, nan, signed_nan = FP8[code_dtype]
    return dict(OUT=out, MAN_BITS=man, MIN_NORMAL=min_normal, SUB_ULP=sub_ulp, MAX=top, NAN_CODE=nan, SIGNED_NAN=signed_nan)


def _tokens_per_program(count: int) -> int:
    # A GPU takes one token per program; the interpreter runs each program as Python (~25 ms),
    # so there one program takes many (the same masked tile code, a larger TOKENS).
    return min(triton.next_power_of_2(max(count, 1)), INTERPRETER_TOKENS) if interpreted() else 1


def _bits16(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16)


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    """A cache (one layer, contiguous blocks) as a ``[B, N, entry bytes]`` uint8 view."""
    return cache.view(torch.uint8)


def concat_and_cache_mla(kv_c, k_pe, cache, slot_mapping, scale, *, code_dtype: torch.dtype | None) -> None:
    """``cache``: one layer ``[B, N, R + P]`` in the model dtype (``code_dtype`` None: bits copied)
    or fp8 (``code_dtype``: the codes' dtype, any view of them)."""
    T, (R, P) = slot_mapping.shape[0], (kv_c.shape[1], k_pe.shape[1])
    if T == 0:
        return
    quant = code_dtype is not None
    cache = _bytes(cache) if quant else _bits16(cache)
    src = (kv_c, k_pe) if quant else (_bits16(kv_c), _bits16(k_pe))
    tokens = _tokens_per_program(T)
    concat_and_cache_mla_kernel[(triton.cdiv(T, tokens),)](
        *src, cache, slot_mapping.contiguous(), scale, T,
        kv_c.stride(0), kv_c.stride(1), k_pe.stride(0), k_pe.stride(1), cache.stride(0), cache.stride(1),
        BLOCK_SIZE=cache.shape[1], RANK=R, ROPE=P, BLOCK_R=triton.next_power_of_2(R), BLOCK_P=triton.next_power_of_2(max(P, 1)),
        TOKENS=tokens, QUANT=quant, **fp8_args(code_dtype or torch.float8_e4m3fn),
    )


def concat_and_cache_ds_mla(kv_c, k_pe, cache, slot_mapping, *, code_dtype: torch.dtype, divisor: float, floor: float, pow2: bool) -> None:
    """``cache``: one layer ``[B, N, 656]`` uint8; ``kv_c [T, 512]``, ``k_pe [T, 64]`` (or ``[T, 0]``) 16-bit."""
    T = slot_mapping.shape[0]
    if T == 0:
        return
    cache = _bytes(cache)
    tokens = _tokens_per_program(T)
    concat_and_cache_ds_mla_kernel[(triton.cdiv(T, tokens),)](
        kv_c, _bits16(k_pe), cache, slot_mapping.contiguous(), T,
        kv_c.stride(0), kv_c.stride(1), k_pe.stride(0), k_pe.stride(1), cache.stride(0),
        BLOCK_SIZE=cache.shape[1], TOKENS=tokens, HAS_ROPE=k_pe.shape[1] > 0, DIVISOR=divisor, FLOOR=floor, POW2=pow2, **fp8_args(code_dtype),
    )


def indexer_k_quant_and_cache(k, cache, slot_mapping, *, code_dtype: torch.dtype, mx: bool, divisor: float, floor: float,
                              pow2: bool) -> None:
    """``cache``: one layer, blocks of ``N·(D + D/32)`` bytes; ``k [T, D]`` (T tokens, as vLLM), D a multiple of 128."""
    T, D = k.shape
    if T == 0:
        return
    cache, groups = _bytes(cache), D // IDX_GROUP.value
    tokens = _tokens_per_program(T)
    indexer_k_quant_and_cache_kernel[(triton.cdiv(T, tokens),)](
        k, cache, slot_mapping.contiguous(), T, k.stride(0), k.stride(1), cache.stride(0),
        BLOCK_SIZE=cache.shape[1], GROUPS=groups, BLOCK_G=triton.next_power_of_2(groups), TOKENS=tokens,
        DIVISOR=divisor, FLOOR=floor, POW2=pow2, MX=mx, **fp8_args(code_dtype),
    )


def _sequence_starts(seq_lens: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(seq_lens.to(torch.int64), 0) - seq_lens.to(torch.int64)


def _form_args(form: int, cache: torch.Tensor, model_dtype: torch.dtype, code_dtype: torch.dtype | None) -> tuple[torch.Tensor, dict]:
    """The cache view and the constexprs a reader of ``form`` takes."""
    view = _bits16(cache) if form == PLAIN16 else _bytes(cache)
    return view, dict(FORM=form, MODEL=tl.bfloat16 if model_dtype == torch.bfloat16 else tl.float16,
                      MODEL_BF16=model_dtype == torch.bfloat16, CODE=FP8[code_dtype or torch.float8_e4m3fn][0])


def gather_latent(cache, block_table, seq_lens, scale, *, form: int, rank: int, rope: int, model_dtype: torch.dtype,
                  code_dtype: torch.dtype | None) -> torch.Tensor:
    """``[sum(seq_lens), rank + rope]`` in ``model_dtype``: each sequence's records in order, dequantised."""
    S = seq_lens.shape[0]
    lens = seq_lens.tolist()
    out = torch.empty(sum(lens), rank + rope, dtype=model_dtype, device=cache.device)
    if not out.shape[0]:
        return out
    view, consts = _form_args(form, cache, model_dtype, code_dtype)
    tokens = _tokens_per_program(max(lens))
    gather_latent_kernel[(S, triton.cdiv(max(lens), tokens))](
        view, _bits16(out), block_table, seq_lens, _sequence_starts(seq_lens), scale,
        block_table.stride(0), out.stride(0), view.stride(0), view.stride(1),
        BLOCK_SIZE=view.shape[1], RANK=rank, ROPE=rope, BLOCK_R=triton.next_power_of_2(rank),
        BLOCK_P=triton.next_power_of_2(max(rope, 1)), TOKENS=tokens, **consts,
    )
    return out


def gather_indexer(cache, block_table, seq_lens, *, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(value bytes ``[T, D]``, scale bytes ``[T, D/32]``) of each sequence's keys, in order."""
    S, scale_bytes = seq_lens.shape[0], head_dim // 32
    lens = seq_lens.tolist()
    values = torch.empty(sum(lens), head_dim, dtype=torch.uint8, device=cache.device)
    scales = torch.empty(sum(lens), scale_bytes, dtype=torch.uint8, device=cache.device)
    if values.shape[0]:
        view = _bytes(cache)
        tokens = _tokens_per_program(max(lens))
        gather_indexer_kernel[(S, triton.cdiv(max(lens), tokens))](
            view, values, scales, block_table, seq_lens, _sequence_starts(seq_lens), block_table.stride(0), view.stride(0),
            BLOCK_SIZE=view.shape[1], HEAD_DIM=head_dim, SCALE_BYTES=scale_bytes, BLOCK_D=triton.next_power_of_2(head_dim),
            BLOCK_S=triton.next_power_of_2(scale_bytes), TOKENS=tokens,
        )
    return values, scales


def mla_decode(query, cache, block_table, seq_lens, scale, *, softmax_scale: float, form: int, rank: int, rope: int,
               code_dtype: torch.dtype | None) -> torch.Tensor:
    """``query [S, Hq, rank + rope]`` → ``[S, Hq, rank]`` in the query's dtype."""
    S, Hq, _ = query.shape
    out = torch.empty(S, Hq, rank, dtype=query.dtype, device=query.device)
    if not S or not Hq:
        return out
    view, consts = _form_args(form, cache, query.dtype, code_dtype)
    # A GPU runs one query head per program; the interpreter runs each program as Python, so
    # there one program takes many heads (the same code, a larger BLOCK_HQ).
    heads = min(triton.next_power_of_2(Hq), INTERPRETER_QUERY_HEADS) if interpreted() else 1
    mla_decode_kernel[(S, triton.cdiv(Hq, heads))](
        query, _bits16(out), view, block_table, seq_lens, scale,
        query.stride(0), query.stride(1), query.stride(2), out.stride(0), out.stride(1), block_table.stride(0), view.stride(0), view.stride(1),
        softmax_scale, Hq, BLOCK_SIZE=view.shape[1], RANK=rank, ROPE=rope, BLOCK_R=triton.next_power_of_2(rank),
        BLOCK_P=triton.next_power_of_2(max(rope, 1)), BLOCK_HQ=heads, **consts,
    )
    return out
