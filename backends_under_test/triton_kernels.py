"""Portable Triton kernels for blocks-first KV caches: writers, shuffled writers, paged decode.

No CUDA-only constructs: they compile for NVIDIA and ROCm and run on CPU under
``TRITON_INTERPRET=1``. Every address is computed in int64 from the tensors' strides (the slot
is widened before any multiply), so caches past 2^31 elements work (pitfall F.2).

fp8 rounding is done in software (round-to-nearest-even onto the format's grid, saturating)
before the cast, so the cast is exact everywhere: the Triton interpreter's own fp32→fp8 cast
rounds ties away from zero (17.0 → e4m3 18.0), which hardware ``cvt.rn`` does not.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_interpreter import interpreted

# Tokens per program of a strided write, query heads per program of a decode, under
# TRITON_INTERPRET (each program is a pass of Python over the kernel: fewer, larger tiles).
INTERPRETER_TOKENS = 64
INTERPRETER_QUERY_HEADS = 16

# K/V address forms inside a block (SPEC LAYOUT-E1, LAYOUT-LEGACY, LAYOUT-SHUFFLE).
STRIDED, X_TILES, LEGACY = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

# torch fp8 dtype -> (Triton dtype, mantissa bits, smallest normal, subnormal spacing, max finite,
#                    NaN code, whether the NaN code carries the input's sign)
FP8 = {
    torch.float8_e4m3fn: (tl.float8e4nv, 3, 2.0**-6, 2.0**-9, 448.0, 0x7F, True),
    torch.float8_e4m3fnuz: (tl.float8e4b8, 3, 2.0**-7, 2.0**-10, 240.0, 0x80, False),
    torch.float8_e5m2: (tl.float8e5, 2, 2.0**-14, 2.0**-16, 57344.0, 0x7F, True),
}


@triton.jit
def _round_to_fp8_grid(x, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_ULP: tl.constexpr, MAX: tl.constexpr):
    """Saturate to ±MAX, then round-to-nearest-even onto the fp8 grid, in fp32; NaN kept."""
    c = tl.minimum(tl.maximum(x, -MAX), MAX)
    bits = c.to(tl.int32, bitcast=True)
    SHIFT: tl.constexpr = 23 - MAN_BITS
    lsb = (bits >> SHIFT) & 1
    normal = ((bits + ((1 << (SHIFT - 1)) - 1) + lsb) & ~((1 << SHIFT) - 1)).to(tl.float32, bitcast=True)
    magic = SUB_ULP * 8388608.0  # fp32 addition rounds |c| to a multiple of SUB_ULP (RNE)
    a = tl.abs(c)
    sub = (a + magic) - magic
    # Restore the sign with the sign bit: compiled Triton negates as 0 - x, which turns -0.0 into +0.0.
    sub = (sub.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)
    return tl.where(x != x, x, tl.where(a < MIN_NORMAL, sub, normal))


@triton.jit
def _encode(x, scale, OUT: tl.constexpr, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_ULP: tl.constexpr, MAX: tl.constexpr,
            NAN_CODE: tl.constexpr, SIGNED_NAN: tl.constexpr):
    """K or V values as fp8 elements of a scaled cache."""
    # div_rn: IEEE division, as the CUDA writers and the reference (fast division is 2 ulp off).
    scaled = tl.math.div_rn(x.to(tl.float32), scale)
    y = _round_to_fp8_grid(scaled, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX).to(OUT)
    # NaN is stored as its code's bits: the interpreter's fp8 cast has no NaN (it yields a finite code or inf).
    if SIGNED_NAN:
        bits = NAN_CODE | (((scaled.to(tl.int32, bitcast=True) >> 31) & 1) << 7)
    else:
        bits = tl.full(scaled.shape, NAN_CODE, tl.int32)
    return tl.where(scaled != scaled, bits.to(tl.uint8).to(OUT, bitcast=True), y)


@triton.jit
def _row_offset(b, n, block_stride, slot_stride, SIDE: tl.constexpr, FORM: tl.constexpr, HEAD_SIZE: tl.constexpr, X: tl.constexpr):
    """The (block, slot) part of an element offset, int64; see :func:`_inner_offset`."""
    if FORM == STRIDED:
        off = b * block_stride + n * slot_stride
    elif SIDE == 0:  # K [H, D/x, N, x]: the slot adds n·x
        off = b * block_stride + n * X
    elif FORM == X_TILES:  # V [H, N/x, D, x]: the slot adds (n // x)·D·x + n % x
        off = b * block_stride + (n // X) * (HEAD_SIZE * X) + n % X
    else:  # legacy V [H, D, N]: the slot adds n
        off = b * block_stride + n
    return off


@triton.jit
def _inner_offset(h, d, head_stride, SIDE: tl.constexpr, FORM: tl.constexpr, BLOCK_SIZE: tl.constexpr, HEAD_SIZE: tl.constexpr, X: tl.constexpr):
    """The (head, dim) part of an element offset, int32 (it stays inside one block).

    Every layout's offset separates into row(b, n) + inner(h, d) (SPEC §1), so
    per-element address arithmetic is 32-bit and only the per-token row is 64-bit.
    """
    tile = h * (HEAD_SIZE * BLOCK_SIZE)
    if FORM == STRIDED:
        off = h * head_stride + d
    elif SIDE == 0:  # K [H, D/x, N, x]
        off = tile + (d // X) * (BLOCK_SIZE * X) + d % X
    elif FORM == X_TILES:  # V [H, N/x, D, x]
        off = tile + d * X
    else:  # legacy V [H, D, N]
        off = tile + d * BLOCK_SIZE
    return off


@triton.jit
def reshape_and_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr, num_tokens,
    key_stride_t, key_stride_h, value_stride_t, value_stride_h,
    k_block_stride, k_slot_stride, k_head_stride,
    v_block_stride, v_slot_stride, v_head_stride,
    BLOCK_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    TOKENS: tl.constexpr, FORM: tl.constexpr, X: tl.constexpr, QUANT: tl.constexpr, PER_HEAD_SCALE: tl.constexpr,
    PACKED: tl.constexpr, OUT: tl.constexpr, MAN_BITS: tl.constexpr, MIN_NORMAL: tl.constexpr, SUB_ULP: tl.constexpr, MAX: tl.constexpr,
    NAN_CODE: tl.constexpr, SIGNED_NAN: tl.constexpr,
):
    """One program per TOKENS tokens, all heads: a [TOKENS, H, D] tile of K and of V (SPEC WRITE-SLOT, SHUFFLE-TILES).

    Padding slots (< 0) and tokens past ``num_tokens`` are masked out, so they touch nothing.
    """
    if PACKED:  # heads packed in every row (NHD fast path): one flat [TOKENS, H·D] tile
        t = (tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None]
        j = tl.arange(0, BLOCK_H * BLOCK_D)[None, :]
        h = j // HEAD_SIZE
        d = j % HEAD_SIZE
        in_row = j < NUM_HEADS * HEAD_SIZE
        k_src, v_src, k_inner, v_inner = j, j, j, j
    else:  # a [TOKENS, H, D] tile with arbitrary head strides, or a tiled layout
        t = (tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64))[:, None, None]
        h = tl.arange(0, BLOCK_H)[None, :, None]
        d = tl.arange(0, BLOCK_D)[None, None, :]
        in_row = (h < NUM_HEADS) & (d < HEAD_SIZE)
        k_src, v_src = h * key_stride_h + d, h * value_stride_h + d
        k_inner = _inner_offset(h, d, k_head_stride, 0, FORM, BLOCK_SIZE, HEAD_SIZE, X)
        v_inner = _inner_offset(h, d, v_head_stride, 1, FORM, BLOCK_SIZE, HEAD_SIZE, X)
    slot = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    mask = (slot >= 0) & in_row
    b = slot // BLOCK_SIZE
    n = slot % BLOCK_SIZE
    k_scale = 1.0
    v_scale = 1.0
    if QUANT:
        k_scale = tl.load(k_scale_ptr + h * PER_HEAD_SCALE, mask=in_row, other=1.0)
        v_scale = tl.load(v_scale_ptr + h * PER_HEAD_SCALE, mask=in_row, other=1.0)
    # Rows are read whether or not the token is padding, so these loads need not wait for the slot.
    rows_ok = in_row & (t < num_tokens)
    k = tl.load(key_ptr + t * key_stride_t + k_src, mask=rows_ok)
    v = tl.load(value_ptr + t * value_stride_t + v_src, mask=rows_ok)
    if QUANT:  # else a bit copy (both pointers are integer views)
        k = _encode(k, k_scale, OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN)
        v = _encode(v, v_scale, OUT, MAN_BITS, MIN_NORMAL, SUB_ULP, MAX, NAN_CODE, SIGNED_NAN)
    k_row = _row_offset(b, n, k_block_stride, k_slot_stride, 0, FORM, HEAD_SIZE, X)
    v_row = _row_offset(b, n, v_block_stride, v_slot_stride, 1, FORM, HEAD_SIZE, X)
    tl.store(k_cache_ptr + k_row + k_inner, k, mask=mask)
    if FORM == X_TILES and TOKENS == X:
        _store_v_tile(v_cache_ptr, v, slot_ptr, num_tokens, v_block_stride, v_row + v_inner, mask,
                      BLOCK_SIZE, NUM_HEADS, HEAD_SIZE, BLOCK_H, BLOCK_D, TOKENS, X)
    else:
        tl.store(v_cache_ptr + v_row + v_inner, v, mask=mask)


@triton.jit
def _store_v_tile(v_cache_ptr, v, slot_ptr, num_tokens, v_block_stride, v_dst, mask,
                  BLOCK_SIZE: tl.constexpr, NUM_HEADS: tl.constexpr, HEAD_SIZE: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, TOKENS: tl.constexpr, X: tl.constexpr):
    """Store a shuffled V tile [H, N/x, D, x] for x tokens at once.

    When the program's x tokens are x consecutive slots starting on an x boundary (a prefill
    run), each (head, dim) of those tokens is one 16-byte vector: transpose the tile so tokens
    are innermost and store whole vectors. Otherwise store element by element.
    """
    t = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS).to(tl.int64)
    slots = tl.load(slot_ptr + t, mask=t < num_tokens, other=-1).to(tl.int64)
    first = tl.load(slot_ptr + tl.program_id(0).to(tl.int64) * TOKENS, mask=tl.program_id(0).to(tl.int64) * TOKENS < num_tokens, other=-1).to(tl.int64)
    run = (tl.sum((slots == first + tl.arange(0, TOKENS)).to(tl.int32), axis=0) == TOKENS) & (first >= 0) & (first % X == 0)
    if run:
        base = (first // BLOCK_SIZE) * v_block_stride + ((first % BLOCK_SIZE) // X) * (HEAD_SIZE * X)
        h = tl.arange(0, BLOCK_H)[:, None, None]
        d = tl.arange(0, BLOCK_D)[None, :, None]
        n = tl.arange(0, TOKENS)[None, None, :]
        tl.store(v_cache_ptr + base + h * (HEAD_SIZE * BLOCK_SIZE) + d * X + n, tl.permute(v, (1, 2, 0)),
                 mask=(h < NUM_HEADS) & (d < HEAD_SIZE) & (n < TOKENS))
    else:
        tl.store(v_cache_ptr + v_dst, v, mask=mask)


@triton.jit
def paged_decode_kernel(
    q_ptr, out_ptr, k_cache_ptr, v_cache_ptr, table_ptr, seq_lens_ptr, k_scale_ptr, v_scale_ptr,
    q_stride_s, q_stride_h, out_stride_s, out_stride_h, table_stride_s,
    k_block_stride, k_slot_stride, k_head_stride,
    v_block_stride, v_slot_stride, v_head_stride,
    scale, num_query_heads, QUERIES_PER_KV: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, HEAD_SIZE: tl.constexpr, BLOCK_D: tl.constexpr, FORM: tl.constexpr, X: tl.constexpr,
    DEQUANT: tl.constexpr, PER_HEAD_SCALE: tl.constexpr, BLOCK_HQ: tl.constexpr,
):
    """One program per (sequence, BLOCK_HQ query heads): online-softmax attention over the block
    table, each query head over its own KV head (``qh // QUERIES_PER_KV``)."""
    s = tl.program_id(0).to(tl.int64)
    qh = tl.program_id(1).to(tl.int64) * BLOCK_HQ + tl.arange(0, BLOCK_HQ).to(tl.int64)
    qh_ok = qh < num_query_heads
    h = qh // QUERIES_PER_KV
    d = tl.arange(0, BLOCK_D).to(tl.int64)
    n = tl.arange(0, BLOCK_SIZE).to(tl.int64)
    d_ok = d < HEAD_SIZE
    row_ok = qh_ok[:, None] & d_ok[None, :]
    q = tl.load(q_ptr + s * q_stride_s + qh[:, None] * q_stride_h + d[None, :], mask=row_ok, other=0.0).to(tl.float32)
    seq_len = tl.load(seq_lens_ptr + s).to(tl.int64)
    k_scale = 1.0
    v_scale = 1.0
    if DEQUANT:
        k_scale = tl.load(k_scale_ptr + h * PER_HEAD_SCALE, mask=qh_ok, other=1.0)[:, None, None]
        v_scale = tl.load(v_scale_ptr + h * PER_HEAD_SCALE, mask=qh_ok, other=1.0)[:, None, None]
    m_i = tl.full([BLOCK_HQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_HQ], dtype=tl.float32)
    acc = tl.zeros([BLOCK_HQ, BLOCK_D], dtype=tl.float32)
    # The (head, dim) part of every address is the same in each block of the table.
    k_inner = _inner_offset(h[:, None, None], d[None, None, :], k_head_stride, 0, FORM, BLOCK_SIZE, HEAD_SIZE, X)
    v_inner = _inner_offset(h[:, None, None], d[None, None, :], v_head_stride, 1, FORM, BLOCK_SIZE, HEAD_SIZE, X)
    for j in range(0, tl.cdiv(seq_len, BLOCK_SIZE)):
        blk = tl.load(table_ptr + s * table_stride_s + j).to(tl.int64)
        pos_ok = (j * BLOCK_SIZE + n) < seq_len
        tile_ok = row_ok[:, None, :] & pos_ok[None, :, None]
        k_off = _row_offset(blk, n[None, :, None], k_block_stride, k_slot_stride, 0, FORM, HEAD_SIZE, X) + k_inner
        v_off = _row_offset(blk, n[None, :, None], v_block_stride, v_slot_stride, 1, FORM, HEAD_SIZE, X) + v_inner
        k = tl.load(k_cache_ptr + k_off, mask=tile_ok, other=0.0).to(tl.float32) * k_scale
        v = tl.load(v_cache_ptr + v_off, mask=tile_ok, other=0.0).to(tl.float32) * v_scale
        qk = tl.where(pos_ok[None, :], tl.sum(k * q[:, None, :], axis=2) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, axis=1))
        p = tl.exp(qk - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v, axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(out_ptr + s * out_stride_s + qh[:, None] * out_stride_h + d[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok)


@triton.jit
def copy_blocks_kernel(
    src_ptr, dst_ptr, src_ids_ptr, dst_ids_ptr,
    src_block_stride, dst_block_stride, src_region_stride, dst_region_stride,
    REGION_LEN: tl.constexpr, CHUNK: tl.constexpr,
):
    """One program per (pair, region, chunk): ``dst[dst_id] = src[src_id]`` for one region of a block.

    A block is one region (blocks-first: K and V adjacent) or two (kv-first: a K and a V plane).
    Either side may be pinned host memory, reached directly from the device (UVA), so a swap
    is one pass over the bytes with no host-side scatter.
    """
    pair = tl.program_id(0).to(tl.int64)
    region = tl.program_id(1).to(tl.int64)
    chunk = tl.program_id(2).to(tl.int64)
    src_id = tl.load(src_ids_ptr + pair).to(tl.int64)
    dst_id = tl.load(dst_ids_ptr + pair).to(tl.int64)
    i = chunk * CHUNK + tl.arange(0, CHUNK).to(tl.int64)
    mask = i < REGION_LEN
    data = tl.load(src_ptr + src_id * src_block_stride + region * src_region_stride + i, mask=mask)
    tl.store(dst_ptr + dst_id * dst_block_stride + region * dst_region_stride + i, data, mask=mask)


# ------------------------------------------------------------------------------ launchers
def _int_view(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def _fp8_args(cache_dtype: torch.dtype) -> dict:
    out, man, min_normal, sub_ulp, top, nan, signed_nan = FP8.get(cache_dtype, (tl.int8, 3, 1.0, 1.0, 1.0, 0, False))
    return dict(OUT=out, MAN_BITS=man, MIN_NORMAL=min_normal, SUB_ULP=sub_ulp, MAX=top, NAN_CODE=nan, SIGNED_NAN=signed_nan)


def _cache_strides(cache: torch.Tensor, form: int) -> tuple[int, int, int]:
    """(block, slot, head) strides of a ``(B, N, H, D)`` view; tiles need only the block stride."""
    if form == STRIDED:
        return cache.stride(0), cache.stride(1), cache.stride(2)
    return cache.stride(0), 0, 0


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, *, form: int, block_size: int, x: int = 1,
                      tokens_per_program: int | None = None, num_warps: int | None = None) -> None:
    """Launch the writer on K/V cache tensors whose ``stride(0)`` is the block stride.

    Strided caches are ``(B, N, H, D)`` views (any strides, innermost 1); tiled caches are the
    ``[B, H, D/x, N, x]`` / ``[B, H, N/x, D, x]`` / ``[B, H, D, N]`` views.
    """
    T = slot_mapping.shape[0]
    H, D = key.shape[1], key.shape[2]
    quant = key_cache.dtype in FP8
    # Measured on an H200 (docs/PERFORMANCE.md): strided rows like one token per program; tiles
    # like x consecutive tokens per program, so a run of prefill slots fills whole x-vectors.
    # Triton's CPU interpreter runs each program as Python, ~25 ms apiece: there strided rows
    # take every token in one program (the same masked tile code, a larger TOKENS).
    tiled = form != STRIDED
    if not tokens_per_program:
        tokens_per_program = x if tiled else (min(triton.next_power_of_2(T), INTERPRETER_TOKENS) if interpreted() else 1)
    num_warps = num_warps or (8 if tiled else 4)
    if not quant:
        key, value, key_cache, value_cache = (_int_view(t) for t in (key, value, key_cache, value_cache))
    if T == 0:
        return
    reshape_and_cache_kernel[(triton.cdiv(T, tokens_per_program),)](
        key, value, key_cache, value_cache, slot_mapping.contiguous(), k_scale, v_scale, T,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        *_cache_strides(key_cache, form), *_cache_strides(value_cache, form),
        BLOCK_SIZE=block_size, NUM_HEADS=H, HEAD_SIZE=D, BLOCK_H=triton.next_power_of_2(H), BLOCK_D=triton.next_power_of_2(D),
        TOKENS=tokens_per_program, FORM=form, X=x, QUANT=quant, PER_HEAD_SCALE=k_scale.numel() > 1,
        PACKED=form == STRIDED and D == key.stride(1) == value.stride(1) == key_cache.stride(2) == value_cache.stride(2),
        **_fp8_args(key_cache.dtype), num_warps=num_warps,
    )


def paged_decode(query, key_cache, value_cache, block_table, seq_lens, k_scale, v_scale, *, scale: float, num_kv_heads: int, form: int, block_size: int, x: int = 1) -> torch.Tensor:
    """Decode attention for ``query [S, Hq, D]`` over the caches; returns ``[S, Hq, D]``."""
    S, Hq, D = query.shape
    out = torch.empty_like(query)
    # A GPU runs one query head per program; the interpreter runs each program as Python, so
    # there one program takes every query head of a sequence (the same code, a larger BLOCK_HQ).
    heads_per_program = min(triton.next_power_of_2(Hq), INTERPRETER_QUERY_HEADS) if interpreted() else 1
    paged_decode_kernel[(S, triton.cdiv(Hq, heads_per_program))](
        query, out, key_cache, value_cache, block_table, seq_lens, k_scale, v_scale,
        query.stride(0), query.stride(1), out.stride(0), out.stride(1), block_table.stride(0),
        *_cache_strides(key_cache, form), *_cache_strides(value_cache, form),
        scale, Hq, QUERIES_PER_KV=Hq // num_kv_heads,
        BLOCK_SIZE=block_size, HEAD_SIZE=D, BLOCK_D=triton.next_power_of_2(D), FORM=form, X=x,
        DEQUANT=key_cache.dtype in FP8, PER_HEAD_SCALE=k_scale.numel() > 1, BLOCK_HQ=heads_per_program,
    )
    return out


_WORDS = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def _words_from_start(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t``'s storage from ``t``'s first element to the end, as ``width``-byte words."""
    start = t.storage_offset() * t.element_size()
    count = (t.untyped_storage().nbytes() - start) // width
    raw = torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage(), start, (count * width,), (1,))
    return raw.view(_WORDS[width])


def copy_blocks(src: torch.Tensor, dst: torch.Tensor, src_ids, dst_ids, *, block_bytes: int, regions: int,
                region_stride_bytes: int, src_block_stride_bytes: int, dst_block_stride_bytes: int,
                chunk_bytes: int = 16384, num_warps: int = 4) -> None:
    """Copy ``regions`` runs of ``block_bytes`` per block from ``src[src_ids]`` to ``dst[dst_ids]``.

    ``src``/``dst`` are cache tensors (device, or pinned host memory) whose first element is the
    cache start; strides are in bytes. Source and destination blocks must not overlap.
    """
    if len(src_ids) == 0:
        return
    sizes = (block_bytes, region_stride_bytes, src_block_stride_bytes, dst_block_stride_bytes, src.data_ptr(), dst.data_ptr())
    width = next(w for w in _WORDS if all(v % w == 0 for v in sizes))
    device = src.device if src.device.type != "cpu" else dst.device
    region_len = block_bytes // width
    chunk = min(chunk_bytes // width, triton.next_power_of_2(region_len))
    copy_blocks_kernel[(len(src_ids), regions, triton.cdiv(region_len, chunk))](
        _words_from_start(src, width), _words_from_start(dst, width),
        src_ids.to(device, torch.int64).contiguous(), dst_ids.to(device, torch.int64).contiguous(),
        src_block_stride_bytes // width, dst_block_stride_bytes // width,
        region_stride_bytes // width, region_stride_bytes // width,
        REGION_LEN=region_len, CHUNK=chunk, num_warps=num_warps,
    )
