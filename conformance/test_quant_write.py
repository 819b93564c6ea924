"""Per-token-head quantised caches, write side: ``triton_reshape_and_cache_flash_per_token_head_quant``
puts every code and every float32 scale where reference/quant_layouts.py says, encoded as
reference/quant_codecs.py says, and changes nothing else — not other slots' scales, not padding,
not other layers, not the guard bytes (SPEC §16 PTH-*)."""

import pytest
import torch

from kvconform.reference import quant_layouts as QL

from .harness import quant as Q

pytestmark = [pytest.mark.write, pytest.mark.kvc_layouts("quant"),
              pytest.mark.parametrize("order", QL.ORDERS), pytest.mark.parametrize("mode", QL.MODES)]


@pytest.mark.kvc_clause("PTH-LAYOUT", "PTH-SCALE-PLACE", "PTH-ENCODE-INT8", "PTH-ENCODE-FP8", "PTH-WRITE-ONLY", "PTH-PAD-1", "PTH-SOURCE-STRIDE")
def test_codes_and_scales_land_at_reference_offsets_and_nothing_else_changes(case, mode, order):
    spec = Q.quant_spec(case, "quant_write", mode, order)
    N = spec.geometry.block_size
    slots = torch.tensor([0, N + 3, -1, 3 * N - 1, 4 * N + 2, 2 * N + 5, -1])
    key, value = Q.token_rows(spec, len(slots) + 2, case.seed)  # rows past the mapping are not read
    Q.write_and_compare(case, spec, key, value, slots, "qkv rows, two padding slots")


@pytest.mark.kvc_clause("PTH-PAD-1", "PTH-WRITE-ONLY")
def test_padding_slots_leave_codes_and_scales_untouched(case, mode, order):
    spec = Q.quant_spec(case, "quant_write", mode, order)
    key, value = Q.token_rows(spec, 3, case.seed)
    Q.write_and_compare(case, spec, key, value, torch.full((3,), -1), "every slot is -1")


@pytest.mark.kvc_clause("PTH-ENCODE-INT8", "PTH-ENCODE-FP8", "PTH-SCALE-FLOOR")
def test_edge_rows_encode_exactly(case, mode, order):
    """A zero row (scale floor), a row whose extremes are ±max, and rows whose values sit on
    rounding ties: amax 127 makes the int8 scale 1 so ±k.5 are ties; amax 448 does it for fp8
    (e4m3 ties between neighbouring codes)."""
    spec = Q.quant_spec(case, "quant_write", mode, order, num_kv_heads=1, head_size=64)
    D = spec.geometry.head_size
    qmax = 127.0 if mode == "int8_per_token_head" else 448.0
    ties = torch.tensor([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 126.5, -125.5] if mode == "int8_per_token_head"
                        else [8.5, 9.5, -17.0, 19.0, 68.0, -76.0, 272.0, -304.0, 0.0029296875, 0.0009765625])
    rows = torch.stack([torch.zeros(D), torch.linspace(-qmax, qmax, D) * 0.01,
                        torch.cat([torch.tensor([qmax, -qmax]), ties, torch.zeros(D - 2 - len(ties))])])
    rows[1, 0], rows[1, -1] = -3.0, 3.0
    key = rows[:, None, :].to(spec.model_dtype)
    Q.write_and_compare(case, spec, key, -key, torch.tensor([1, 6, 12]), "zero row, ±max row, tie row")


@pytest.mark.kvc_clause("PTH-SCALE-INIT", "PTH-LAYER")
def test_a_layers_first_use_and_writes_leave_other_layers_untouched(case, mode, order):
    spec = Q.quant_spec(case, "quant_write", mode, order, num_layers=2, layer=0)
    N = spec.geometry.block_size
    key, value = Q.token_rows(spec, 4, case.seed)
    arena, expected = Q.write_and_compare(case, spec, key, value, torch.tensor([1, N, 2 * N + 1, 3 * N]), "layer 0")
    Q.reallocate(case, arena, expected, layer=1)
    Q.assert_arena_equal("quant layer first use", case, expected, arena, "layer 1's scale views built after layer 0 was written")
    key, value = Q.token_rows(arena.spec, 4, case.seed + 1)
    Q.write_and_compare(case, arena.spec, key, value, torch.tensor([1, N + 1, 2 * N, 4 * N - 1]), "layer 1", arena, expected)
