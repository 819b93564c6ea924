"""Brute-force oracle: docs/SPEC.md §1 formulas typed out per layout, evaluated with Python loops.

Deliberately independent of reference/: nothing here imports the layout algebra. Sizes
must stay tiny.
"""

from __future__ import annotations

import itertools
import struct

E3_ORDER = {  # KVCacheLayout value: permutation of (L, B, H, N, C)
    "LBHNC": "LBHNC", "LBNHC": "LBNHC", "LHBNC": "LHBNC",
    "BLHNC": "BLHNC", "BLNHC": "BLNHC", "BHLNC": "BHLNC",
}


def _dense(order: str, sizes: dict) -> dict:
    """Dense strides of axes listed outermost-first in ``order``."""
    strides, running = {}, 1
    for axis in reversed(order):
        strides[axis] = running
        running *= sizes[axis]
    return strides


def offset(key: str, g, l, b, kv, n, h, d) -> int:
    """Element offset of logical (l, b, kv, n, h, d) for the layout named ``key``."""
    B, N, H, D, L = g.num_blocks, g.block_size, g.num_kv_heads, g.head_size, g.num_layers
    x = 16 // g.element_size
    if key == "E1:NHD":
        return b * 2 * N * H * D + kv * N * H * D + n * H * D + h * D + d
    if key == "E1:HND":
        return b * 2 * H * N * D + kv * H * N * D + h * N * D + n * D + d
    if key == "E0:NHD":
        return kv * B * N * H * D + b * N * H * D + n * H * D + h * D + d
    if key == "E0:HND":
        return kv * B * H * N * D + b * H * N * D + h * N * D + n * D + d
    if key.startswith("E1:cross-"):
        physical = {"NHD": "BL2NHD", "HND_FLASH_ATTN": "BHL2ND", "HND_FLASHINFER": "B2HLND"}[key[len("E1:cross-"):]]
        s = _dense(physical, {"B": B, "L": L, "2": 2, "N": N, "H": H, "D": D})
        return l * s["L"] + b * s["B"] + kv * s["2"] + n * s["N"] + h * s["H"] + d * s["D"]
    key_tile = h * D * N + (d // x) * N * x + n * x + d % x
    value_x_tile = h * D * N + (n // x) * D * x + d * x + n % x
    if key in ("LEGACY:legacy", "LEGACY:legacy-interleaved-v"):
        value_tile = value_x_tile if key.endswith("interleaved-v") else h * D * N + d * N + n
        return kv * B * H * D * N + b * H * D * N + (value_tile if kv else key_tile)
    if key == "AITER:shuffle-blocks_first":  # k/v block stride 2·H·D·N, V base +H·D·N
        return b * 2 * H * D * N + kv * H * D * N + (value_x_tile if kv else key_tile)
    if key == "AITER:shuffle-kv_first":
        return kv * B * H * D * N + b * H * D * N + (value_x_tile if kv else key_tile)
    if key.startswith("E2:"):
        physical = {"E2:NHD": "BNHC", "E2:HND": "BHNC", "E2:cross-NHD": "BLNHC", "E2:cross-HND": "BHLNC"}[key]
        s = _dense(physical, {"B": B, "L": L, "N": N, "H": H, "C": 2 * D})
        return l * s.get("L", 0) + b * s["B"] + n * s["N"] + h * s["H"] + kv * D + d
    if key.startswith("E3:"):
        name, _, spec = key[3:].partition("-")
        two_slot = spec.startswith("2slot")
        heads, content = (2, H * D) if two_slot else (H, 2 * D)
        s = _dense(E3_ORDER[name], {"L": L, "B": B, "H": heads, "N": N, "C": content})
        if not two_slot:
            return l * s["L"] + b * s["B"] + h * s["H"] + n * s["N"] + kv * D + d
        if spec.endswith("shuffle"):  # slot region [N, H·D] re-viewed as the AITER tile
            return l * s["L"] + b * s["B"] + kv * s["H"] + (value_x_tile if kv else key_tile)
        if spec.endswith("legacy"):  # re-viewed as PagedAttention.split_kv_cache's K/V tiles
            return l * s["L"] + b * s["B"] + kv * s["H"] + (h * D * N + d * N + n if kv else key_tile)
        return l * s["L"] + b * s["B"] + kv * s["H"] + n * s["N"] + h * D + d
    raise KeyError(key)


def offset_map(key: str, g) -> list:
    """Nested-list offset map in (L, B, 2, N, H, D) order."""
    return [
        offset(key, g, *coords)
        for coords in itertools.product(
            range(g.num_layers), range(g.num_blocks), range(2), range(g.block_size),
            range(g.num_kv_heads), range(g.head_size),
        )
    ]


# --------------------------------------------------------------------------- fp8
FP8_BITS = {  # name: (exponent bits, mantissa bits, bias, has_inf, fnuz)
    "float8_e4m3fn": (4, 3, 7, False, False),
    "float8_e4m3fnuz": (4, 3, 8, False, True),
    "float8_e5m2": (5, 2, 15, True, False),
}


def fp8_decode(code: int, fmt: str) -> float:
    """Value of an 8-bit code from its bit fields."""
    e_bits, m_bits, bias, has_inf, fnuz = FP8_BITS[fmt]
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> m_bits) & ((1 << e_bits) - 1)
    man = code & ((1 << m_bits) - 1)
    if fnuz and code == 0x80:
        return float("nan")
    if has_inf and exp == (1 << e_bits) - 1:
        return sign * float("inf") if man == 0 else float("nan")
    if not has_inf and not fnuz and exp == (1 << e_bits) - 1 and man == (1 << m_bits) - 1:
        return float("nan")
    if exp == 0:
        return sign * man * 2.0 ** (1 - bias - m_bits)
    return sign * (1 + man / (1 << m_bits)) * 2.0 ** (exp - bias)


def fp8_encode(value: float, fmt: str) -> int:
    """Nearest finite code, ties to even mantissa, saturating; −0 kept where the format has it."""
    if value != value:
        return 0x80 if FP8_BITS[fmt][4] else 0x7F
    finite = [(c, fp8_decode(c, fmt)) for c in range(256)]
    finite = [(c, v) for c, v in finite if v == v and abs(v) != float("inf")]
    top = max(v for _, v in finite)
    value = max(-top, min(top, value))
    best = min(abs(v - value) for _, v in finite)
    ties = [c for c, v in finite if abs(v - value) == best]
    if len(ties) > 1:
        ties = [c for c in ties if c % 2 == 0] or ties
    if value == 0 or all(fp8_decode(c, fmt) == 0 for c in ties):
        negative = struct.pack(">f", value)[0] & 0x80
        return 0x80 if negative and not FP8_BITS[fmt][4] else 0x00
    return ties[0]
