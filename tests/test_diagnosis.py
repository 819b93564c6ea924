"""A failed byte comparison says where the wrong bytes came from (issue #23): each fault class of
conformance/harness/diagnosis.py built directly on a tiny exact arena, with the sentence it reads
as; and the failure message and JSON carry the findings before the raw rows.

Arenas are filled with a counter (every 8-byte window unique), written rows are sentinels far
from the fill; N, H, D are pairwise distinct and written blocks are ≥ 2, so a wrong block, slot,
head or dim shows as a wrong number."""

import dataclasses
import json
import types

import pytest
import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.conformance.harness import diagnosis
from kvconform.conformance.harness.assertions import ConformanceFailure, assert_bytes_equal
from kvconform.conformance.harness.big_caches import LazyArena, assert_arenas_equal, lazy_zeros
from kvconform.conformance.harness.case import GUARD, Arena
from kvconform.conformance.harness.facts import TestFacts
from kvconform.conformance.harness.diagnosis import FAULTS, WriteInputs, diagnose

B, N, H, D = 6, 5, 3, 4
K, V = 0, 1
CASE = types.SimpleNamespace(layout=None, repro="repro-line", facts=TestFacts())
NHD = R.blocks_first("NHD")


class Twin:
    """Initial, expected and actual arenas of one cache, and a write's inputs."""

    def __init__(self, dtype=torch.bfloat16, layout=NHD, num_layers=1, layer=0, num_blocks=B, block_size=N, heads=H, head_size=D):
        self.g = R.Geometry(num_blocks=num_blocks, block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype,
                            num_layers=num_layers)
        self.spec = CacheSpec(layout=layout, geometry=self.g, layer=layer)
        size = 2 * GUARD + layout.nbytes(self.g)
        fill = torch.arange(size // 2, dtype=torch.int16).view(torch.uint8)  # counter bytes: every window unique
        self.initial, self.expected, self.actual = (Arena(fill.clone(), self.spec) for _ in range(3))
        self.omap = R.offset_map(layout, self.g)
        self.writes = None

    def bits(self, arena: Arena) -> torch.Tensor:
        return arena.region.view(R.bits_dtype(self.g.dtype))

    def at(self, kv, block, slot, head=slice(None), layer=0):
        """Element offsets of the (layer, block, kv, slot) row's heads."""
        return self.omap[layer, block, kv, slot, head]

    def write(self, slots, key=None, value=None, k_scale=1.0, v_scale=1.0, rows=None, into=("expected", "actual")):
        """The reference write of sentinel rows (bf16 bits 20000 + i for K, 30000 + i for V)."""
        slots = torch.tensor(slots)
        count = rows or len(slots)
        if key is None:
            codes = torch.arange(count * H * D, dtype=torch.int16).view(count, H, D)
            key, value = (codes + 20000).view(torch.bfloat16), (codes + 30000).view(torch.bfloat16)
        k_scale, v_scale = torch.tensor([k_scale]), torch.tensor([v_scale])
        self.writes = WriteInputs(key, value, slots, k_scale, v_scale)
        for name in into:
            R.reshape_and_cache(key, value, getattr(self, name).region, self.spec.layout, self.g, slots,
                                k_scale=k_scale, v_scale=v_scale, layer=self.spec.layer)
        return key, value

    def diagnose(self, initial=True, writes=True, zero_fill=False):
        e = self.g.element_size
        differing = (self.expected.buffer != self.actual.buffer).view(-1, e).any(dim=1).nonzero().flatten()
        if self.g.dtype in R.fp8.FP8_DTYPES:  # as assert_bytes_equal: any NaN code stands for a NaN (SPEC FP8-NAN)
            nan = lambda arena: torch.isnan(R.fp8.decode_codes(arena.buffer[differing], self.g.dtype))  # noqa: E731
            differing = differing[~(nan(self.expected) & nan(self.actual))]
        return diagnose(self.spec, self.expected.buffer, self.actual.buffer, differing, guard=GUARD,
                        initial=self.initial.buffer if initial else None, writes=self.writes if writes else None, zero_fill=zero_fill)


def lines(findings):
    return [f.line() for f in findings]


def test_the_vocabulary_is_fixed_and_every_finding_is_json():
    twin = Twin()
    twin.write([2 * N + 4])
    twin.bits(twin.actual)[twin.at(V, 2, 4)] = twin.bits(twin.initial)[twin.at(V, 2, 4)]
    findings = twin.diagnose()
    assert {f.fault for f in findings} <= set(FAULTS)
    assert json.loads(json.dumps([f.as_dict() for f in findings])) == [f.as_dict() for f in findings]
    assert findings[0].as_dict() == {
        "fault": "never-written", "elements": H * D,
        "where": {"layer": [0, 0], "block": [2, 2], "kv": "V", "slot": [4, 4], "head": [0, H - 1], "dim": [0, D - 1],
                  "elements": H * D, "text": "V[b=2, s=4, h=0..2]"},
        "source": None, "sentence": "V[b=2, s=4, h=0..2] was never written: it still holds its initial bytes",
    }


def test_k_holding_v_bytes_names_both_ends():
    twin = Twin()
    twin.write([2 * N + 4])
    bits = twin.bits(twin.actual)
    bits[twin.at(K, 2, 4)] = bits[twin.at(V, 2, 4)]
    bits[twin.at(V, 2, 4)] = twin.bits(twin.initial)[twin.at(V, 2, 4)]
    assert lines(twin.diagnose()) == [
        "kv-swapped: K[b=2, s=4, h=0..2] holds V[b=2, s=4]'s bytes: K and V swapped; V[b=2, s=4] is untouched",
        "never-written: V[b=2, s=4, h=0..2] was never written: it still holds its initial bytes; its bytes are at K[b=2, s=4, h=0..2]",
    ]


@pytest.mark.parametrize("dest, holder", [
    ((K, 3, 1), "neighbour-slot: K[b=3, s=1, h=0..2] holds K[b=3, s=0]'s bytes: the neighbouring slot's; K[b=3, s=0] is untouched"),
    ((K, 4, 0), "neighbour-block: K[b=4, s=0, h=0..2] holds K[b=3, s=0]'s bytes: the neighbouring block's; K[b=3, s=0] is untouched"),
    ((V, 5, 2), "other-element: V[b=5, s=2, h=0..2] holds K[b=3, s=0]'s bytes; K[b=3, s=0] is untouched"),
], ids=["neighbour-slot", "neighbour-block", "other-element"])
def test_a_row_written_to_another_place_names_whose_bytes_it_holds(dest, holder):
    twin = Twin()
    twin.write([3 * N])
    bits = twin.bits(twin.actual)
    bits[twin.at(*dest)] = bits[twin.at(K, 3, 0)]
    bits[twin.at(K, 3, 0)] = twin.bits(twin.initial)[twin.at(K, 3, 0)]
    went = holder.split(": ")[1].split(" holds")[0]
    assert lines(twin.diagnose()) == [
        f"never-written: K[b=3, s=0, h=0..2] was never written: it still holds its initial bytes; its bytes are at {went}", holder]


def test_a_head_off_by_one_names_the_head_shift():
    twin = Twin()
    twin.write([2 * N + 1])
    bits = twin.bits(twin.actual)
    bits[twin.at(V, 2, 1, slice(0, H - 1))] = bits[twin.at(V, 2, 1, slice(1, H))].clone()
    assert "other-head: V[b=2, s=1, h=0..1] holds V[b=2, s=1, h=1..2]'s bytes: heads +1" in lines(twin.diagnose())


def test_a_write_into_layer_0_of_a_three_layer_cache_names_the_other_layer():
    twin = Twin(layout=R.standardized("LBHNC"), num_layers=3, layer=2)
    twin.write([2 * N + 3], into=("expected",))
    twin.spec = CacheSpec(layout=twin.spec.layout, geometry=twin.g, layer=0)
    twin.write([2 * N + 3], into=("actual",))
    twin.spec = CacheSpec(layout=twin.spec.layout, geometry=twin.g, layer=2)
    assert lines(twin.diagnose()) == [
        "other-layer: K[l=0, b=2, s=3, h=0..2] holds K[l=2, b=2, s=3]'s bytes: another layer's; K[l=2, b=2, s=3] is untouched",
        "other-layer: V[l=0, b=2, s=3, h=0..2] holds V[l=2, b=2, s=3]'s bytes: another layer's; V[l=2, b=2, s=3] is untouched",
        "never-written: K[l=2, b=2, s=3, h=0..2] was never written: it still holds its initial bytes; its bytes are at K[l=0, b=2, s=3, h=0..2]",
        "never-written: V[l=2, b=2, s=3, h=0..2] was never written: it still holds its initial bytes; its bytes are at V[l=0, b=2, s=3, h=0..2]",
    ]


def test_rows_written_through_kv_first_strides_name_the_kv_first_layout():
    twin = Twin()
    twin.write([2 * N + 1, 3 * N + 4], into=("expected",))
    R.reshape_and_cache(twin.writes.key, twin.writes.value, twin.actual.region, R.kv_first("NHD"), twin.g, twin.writes.slot_mapping,
                        k_scale=twin.writes.k_scale, v_scale=twin.writes.v_scale)
    found = twin.diagnose()
    layout = [f for f in found if f.fault == "wrong-layout"]
    assert layout and all("where the kv-first layout (K/V planes outside the blocks) puts them" in f.sentence for f in layout)
    assert ("wrong-layout: K[b=1, s=1, h=0..2] holds K[b=2, s=1]'s bytes: where the kv-first layout (K/V planes outside the blocks) "
            "puts them; K[b=2, s=1] is untouched") in lines(found)
    assert {f.fault for f in found} == {"wrong-layout", "never-written"}


@pytest.mark.parametrize("form", ["v-in-k-tile", "x-of-bf16"])
def test_shuffled_tiles_in_the_wrong_form_name_the_form(form):
    shuffle = R.aiter_shuffle("blocks_first")
    twin = Twin(dtype=torch.float8_e4m3fn, layout=shuffle, block_size=16, head_size=32)
    key = (torch.randn(2, H, 32, generator=torch.Generator().manual_seed(0)) * 4).to(torch.bfloat16)
    twin.write([2 * 16 + 1, 3 * 16 + 7], key=key, value=key * 0.5 + 1, into=("expected",))
    if form == "v-in-k-tile":
        v_in_k_form = dataclasses.replace(shuffle, v_dims=shuffle.v_dims[:-4] + shuffle.k_dims[-4:])
        wrong, g, what = v_in_k_form, twin.g, "V in K's tile form [D/x,N,x]"
    else:
        wrong, g, what = shuffle, R.Geometry(num_blocks=B, block_size=16, num_kv_heads=H, head_size=32, dtype=torch.bfloat16), \
            "x = 16 // 2 = 8 (of a 2-byte dtype) instead of 16"
    rows = [R.ops.encode(x, twin.g, s, head_dim=1).view(torch.uint8) for x, s in ((twin.writes.key, twin.writes.k_scale), (twin.writes.value, twin.writes.v_scale))]
    bits = twin.actual.region
    for kv, data in enumerate(rows):
        if form == "v-in-k-tile" and kv == K:
            where = shuffle.offsets(twin.g, block=torch.tensor([2, 3])[:, None, None], kv=K, slot=torch.tensor([1, 7])[:, None, None],
                                    head=torch.arange(H)[:, None], dim=torch.arange(32))
        else:
            where = wrong.offsets(g, block=torch.tensor([2, 3])[:, None, None], kv=kv, slot=torch.tensor([1, 7])[:, None, None],
                                  head=torch.arange(H)[:, None], dim=torch.arange(32))
        bits[where] = data
    found = twin.diagnose()
    assert any(f.fault == "wrong-layout" and f"where {what} puts them" in f.sentence for f in found), lines(found)


def test_a_padding_token_and_an_extra_key_row_are_named_by_their_row():
    twin = Twin()
    key, value = twin.write([2 * N + 1, -1, 3 * N + 2], rows=5, into=("expected", "actual"))
    bits = twin.bits(twin.actual)
    bits[twin.at(K, B - 1, N - 1)] = key[1].contiguous().view(torch.int16)  # slot -1 wrote the last slot
    bits[twin.at(V, 3, 2)] = value[4].contiguous().view(torch.int16)  # row 4 of 5, past len(slot_mapping) = 3
    assert lines(twin.diagnose()) == [
        "extra-row: V[b=3, s=2, h=0..2] holds value row 4, past len(slot_mapping) = 3: rows beyond the tokens were written",
        "padding-written: K[b=5, s=4, h=0..2] holds the key row of token 1, whose slot is -1: padding was written",
    ]


def fp8_twin(dtype):
    twin = Twin(dtype=dtype, block_size=16, head_size=8)
    x = torch.tensor([0.3, -1.7, 2.6, -0.0, -1e-9, 300.0, float("nan"), 1.1]).repeat(2, H, 1).to(torch.bfloat16)
    return twin, x


def write_codes(twin, k_codes, v_codes, slots=(2 * 16 + 3, 4 * 16 + 9)):
    """The actual arena: the rows of the given uint8 codes at the slots' rows."""
    bits = twin.actual.region
    for kv, codes in ((K, k_codes), (V, v_codes)):
        for i, s in enumerate(slots):
            bits[twin.omap[0, s // 16, kv, s % 16]] = codes[i]


@pytest.mark.parametrize("fault, how", [
    ("fp8-format", "e4m3 codes where float8_e5m2 was expected"),
    ("fp8-fnuz-vs-fn", "float8_e4m3fn codes where float8_e4m3fnuz was expected (they differ at −0, saturation and NaN)"),
    ("scale-inverted", "quantised as x·scale instead of x / scale"),
    ("scale-swapped", "V quantised with k_scale instead of v_scale"),
    ("fp8-rounding", "codes one step from the expected, toward zero: truncated instead of rounded to nearest-even"),
    ("fp8-nan", "a NaN stored as finite code 7e (FP8-NAN: a NaN stays a NaN)"),
])
def test_fp8_codes_under_a_known_transformation_name_it(fault, how):
    dtype = {"fp8-format": torch.float8_e5m2, "fp8-fnuz-vs-fn": torch.float8_e4m3fnuz}.get(fault, torch.float8_e4m3fn)
    twin, x = fp8_twin(dtype)
    twin.write([2 * 16 + 3, 4 * 16 + 9], key=x, value=x * 3, k_scale=0.5, v_scale=0.25)
    fmt = R.fp8.fp8_format(dtype)
    k, v = x.float() / 0.5, x.float() * 3 / 0.25
    if fault == "fp8-format":
        codes = [R.fp8.quantize(y, 1.0, "float8_e4m3fn").view(torch.uint8) for y in (k, v)]
    elif fault == "fp8-fnuz-vs-fn":
        codes = [R.fp8.quantize(y * 2, 1.0, "float8_e4m3fn").view(torch.uint8) for y in (k, v)]
    elif fault == "scale-inverted":
        codes = [R.fp8.quantize(x.float() * s, 1.0, fmt).view(torch.uint8) for s, x in ((0.5, x), (0.25, x * 3))]
    elif fault == "scale-swapped":
        codes = [R.fp8.quantize(k, 1.0, fmt).view(torch.uint8), R.fp8.quantize(x.float() * 3 / 0.5, 1.0, fmt).view(torch.uint8)]
    elif fault == "fp8-rounding":
        codes = []
        for y in (k, v):
            q = R.fp8.quantize(y, 1.0, fmt).view(torch.uint8)
            over = R.fp8.decode_codes(q, fmt).abs() > y.abs()
            codes.append(torch.where(over & (q & 0x7F != 0), q - 1, q))
    else:  # fp8-nan: NaN saturated to +max
        codes = [R.fp8.quantize(torch.nan_to_num(y, nan=448.0), 1.0, fmt).view(torch.uint8) for y in (k, v)]
    write_codes(twin, *codes)
    found = twin.diagnose()
    assert {f.fault for f in found} == {fault}, lines(found)
    assert all(f.sentence.split(": ", 1)[1].endswith(how) for f in found), lines(found)


def test_a_constant_factor_without_the_inputs_is_named_value_scaled():
    twin, x = fp8_twin(torch.float8_e4m3fn)
    x = torch.linspace(-3, 3, 2 * H * 8).view(2, H, 8).to(torch.bfloat16)
    twin.write([2 * 16 + 3, 4 * 16 + 9], key=x, value=x, k_scale=0.5, v_scale=0.5)
    codes = [R.fp8.quantize(x.float() / 2, 1.0, "float8_e4m3fn").view(torch.uint8)] * 2  # scale 2 where 0.5 was meant
    write_codes(twin, *codes)
    found = twin.diagnose(writes=False)
    assert {f.fault for f in found} == {"value-scaled"}, lines(found)
    assert found[0].sentence.endswith("values ×0.25 of the expected: a scale applied the wrong way or to the wrong side")


@pytest.mark.parametrize("fault, change, story", [
    ("bit-flip", lambda bits: bits ^ 0x0100, "one bit differs (bit 0 of byte 1)"),
    ("byte-order", lambda bits: bits.view(torch.uint8).view(-1, 2).flip(1).contiguous().view(torch.int16).flatten(),
     "the expected bytes of each element in reverse order (2-byte elements)"),
    ("zeroed", lambda bits: torch.zeros_like(bits), "zero bytes where the expected bytes are not zero"),
])
def test_an_element_under_a_bitwise_transformation_names_it(fault, change, story):
    twin = Twin()
    twin.write([2 * N + 2])
    bits = twin.bits(twin.actual)
    where = twin.at(V, 2, 2, 1)
    bits[where] = change(bits[where].clone())
    if fault == "bit-flip":
        story = story[:-1] + "; 4 elements like it)"
    assert lines(twin.diagnose()) == [f"{fault}: V[b=2, s=2, h=1]: {story}"]


def test_a_nan_payload_lost_in_a_value_cast_is_named():
    twin = Twin()
    payloads = torch.tensor([0x7F81, 0xFFC1 - 0x10000, 0x7FA0, 0x7F80 + 3], dtype=torch.int16).view(torch.bfloat16)
    key = payloads.repeat(1, H, 1)
    twin.write([3 * N + 3], key=key, value=key.clone())
    bits = twin.bits(twin.actual)
    where = twin.at(K, 3, 3)
    bits[where] = bits[where].view(torch.bfloat16).float().to(torch.bfloat16).view(torch.int16)
    assert lines(twin.diagnose()) == [
        "value-cast: K[b=3, s=3, h=0..2]: the same values with other bits (NaN payload or −0): a value cast where a bit copy was meant"]


def test_bytes_the_op_must_leave_are_a_stray_write_or_a_copy_that_ran_on():
    twin = Twin()
    twin.write([2 * N + 4])
    ibits, bits = twin.bits(twin.initial), twin.bits(twin.actual)
    bits[twin.at(K, 4, 1, 0)] = 12345  # found nowhere
    end = int(twin.at(V, 2, 4).max())  # the last element of the block's last written row ...
    assert int(twin.omap[0, 3].min()) == end + 1  # ... is right before block 3 (NHD: the V row of slot N-1 ends the page)
    bits[end + 1: end + 3] = ibits[end + 1: end + 3] + 7
    assert lines(twin.diagnose()) == [
        "neighbour-block: K[b=3, s=0, h=0, d=0..1] was overwritten though the op leaves it: it lies right after "
        "V[b=2, s=4, h=2, d=3], which the op wrote — the copy ran on into the neighbouring block",
        "stray-write: K[b=4, s=1, h=0]: changed though the op must leave it untouched (to bytes found nowhere in the expected cache)",
    ]


def test_a_guard_byte_is_out_of_bounds_and_names_whose_bytes_it_holds():
    twin = Twin()
    twin.write([5 * N + 4])
    end = GUARD + twin.spec.layout.nbytes(twin.g)
    twin.actual.buffer[end: end + 8] = twin.actual.region[-8:]  # the last row's last 4 elements, once more past the end
    twin.actual.buffer[GUARD - 2] ^= 1
    assert lines(twin.diagnose()) == [
        "out-of-bounds: 2 guard bytes before the cache (-2..-1) changed: written out of bounds",
        "out-of-bounds: 8 guard bytes past the end of the cache (+0..+7) changed: written out of bounds; they hold V[b=5, s=4, h=2]'s bytes",
    ]


def test_what_nothing_explains_is_unexplained_and_what_was_not_examined_is_counted(monkeypatch):
    twin = Twin()
    twin.write([2 * N + 2, 3 * N])
    bits = twin.bits(twin.actual)
    bits[twin.at(K, 2, 2)] = torch.arange(H * D, dtype=torch.int16).view(H, D) * 7 + 11111
    bits[twin.at(V, 3, 0)] = 17
    monkeypatch.setattr(diagnosis, "EXAMINED", H * D)
    assert lines(twin.diagnose(initial=False)) == [
        "unexplained: K[b=2, s=2, h=0..2]: 12 elements differ; no known fault explains them",
        f"not-examined: {H * D} more differing elements are not explained (only the first {H * D} are examined)",
    ]


def test_a_large_cache_is_mapped_in_the_blocks_it_differs_in():
    g = R.Geometry(num_blocks=1 << 15, block_size=16, num_kv_heads=1, head_size=16, dtype=torch.float8_e4m3fn)
    spec = CacheSpec(layout=NHD, geometry=g, kv_cache_dtype="fp8")
    assert NHD.numel(g) > diagnosis.WHOLE_MAP
    expected, actual = (LazyArena(lazy_zeros(2 * GUARD + NHD.nbytes(g)), spec) for _ in range(2))
    row = torch.arange(16, dtype=torch.uint8) * 3 + 1
    far, near = NHD.offsets(g, block=(1 << 15) - 2, kv=V, slot=7, dim=torch.arange(16)), NHD.offsets(g, block=3, kv=V, slot=7, dim=torch.arange(16))
    expected.region[far] = row
    actual.region[near] = row  # 32-bit offsets: the last blocks land on the first ones
    with pytest.raises(ConformanceFailure) as failure:
        assert_arenas_equal("write", CASE, expected, actual)
    assert [d["sentence"] for d in failure.value.details["diagnosis"]] == [
        "V[b=3, s=7] holds V[b=32766, s=7]'s bytes; V[b=32766, s=7] is untouched",
        "V[b=32766, s=7] was never written: it holds zeros, as the lazily mapped arena reads where nothing wrote; its bytes are at V[b=3, s=7]",
    ]


@pytest.mark.parametrize("far, near, widths", [
    ((1 << 16) + 1, 1, "2^16"), ((1 << 20) + 1, 1, "2^16 or 2^20"), ((1 << 20) + (1 << 16) + 1, (1 << 16) + 1, "2^20")])
def test_a_block_written_at_its_id_truncated_names_the_width_the_ids_wrap_at(far, near, widths):
    g = R.Geometry(num_blocks=far + 2, block_size=1, num_kv_heads=1, head_size=16, dtype=torch.float8_e4m3fn)
    spec = CacheSpec(layout=NHD, geometry=g, kv_cache_dtype="fp8")
    expected, actual = (LazyArena(lazy_zeros(2 * GUARD + NHD.nbytes(g)), spec) for _ in range(2))
    row = torch.arange(16, dtype=torch.uint8) * 3 + 1
    expected.region[NHD.offsets(g, block=far, kv=K, slot=0, dim=torch.arange(16))] = row
    actual.region[NHD.offsets(g, block=near, kv=K, slot=0, dim=torch.arange(16))] = row  # the id truncated
    with pytest.raises(ConformanceFailure) as failure:
        assert_arenas_equal("swap", CASE, expected, actual)
    found = failure.value.details["diagnosis"]
    assert [d["fault"] for d in found] == ["block-id-wrap", "never-written"]
    assert found[0]["sentence"] == f"K[b={near}, s=0] holds K[b={far}, s=0]'s bytes: block ids wrap modulo {widths} ({far} → {near}); " \
                                   f"K[b={far}, s=0] is untouched"


def test_a_failure_shows_the_findings_first_then_the_first_element_of_each_row():
    twin = Twin()
    twin.write([2 * N + 4, 3 * N + 1])
    bits = twin.bits(twin.actual)
    bits[twin.at(K, 2, 4)] = bits[twin.at(V, 2, 4)]
    bits[twin.at(V, 2, 4)] = twin.bits(twin.initial)[twin.at(V, 2, 4)]
    bits[twin.at(K, 3, 1, 2)] ^= 1
    with pytest.raises(ConformanceFailure) as failure:
        assert_bytes_equal("write", CASE, twin.expected, twin.actual, "note", initial=twin.initial, writes=twin.writes)
    text = str(failure.value).splitlines()
    assert text[0].startswith("write: 28 elements differ (cache of")
    assert text[1:6] == [
        "  where the wrong bytes came from:",
        "    kv-swapped: K[b=2, s=4, h=0..2] holds V[b=2, s=4]'s bytes: K and V swapped; V[b=2, s=4] is untouched",
        "    never-written: V[b=2, s=4, h=0..2] was never written: it still holds its initial bytes; its bytes are at K[b=2, s=4, h=0..2]",
        "    bit-flip: K[b=3, s=1, h=2]: one bit differs (bit 0 of byte 0; 4 elements like it)",
        "  first differing elements (28 elements in 3 rows (layer, block, kv, slot); the first of each row first):",
    ]
    rows = [line.split(":")[0].strip() for line in text[6:12]]  # each of the 3 rows, then the first row's next elements
    assert rows == [f"layer=0 block=2 kv=K slot=4 head=0 dim={d}" for d in range(4)] + [
        "layer=0 block=2 kv=V slot=4 head=0 dim=0", "layer=0 block=3 kv=K slot=1 head=2 dim=0"]
    details = failure.value.details
    assert [d["fault"] for d in details["diagnosis"]] == ["kv-swapped", "never-written", "bit-flip"]
    assert len(details["mismatches"]) == 6 and details["differing_elements"] == 28


def test_a_passing_comparison_builds_no_diagnosis(monkeypatch):
    monkeypatch.setattr("kvconform.conformance.harness.assertions.diagnose", lambda *a, **k: pytest.fail("diagnosed a pass"))
    twin = Twin()
    twin.write([2 * N])
    assert_bytes_equal("write", CASE, twin.expected, twin.actual, initial=twin.initial, writes=twin.writes)


@pytest.mark.parametrize("hair, story", [
    (+1, "toward zero, each a hair off a tie: truncated, or near-ties rounded as ties"),
    (-1, "values a hair off a tie (x / scale = tie·(1 ± 2^-20)) rounded as ties, not to the nearer code"),
], ids=["above-the-tie", "below-the-tie"])
def test_near_ties_rounded_as_ties_are_told_from_truncation(hair, story):
    twin, _ = fp8_twin(torch.float8_e4m3fn)
    grid = R.fp8.decode_codes(torch.arange(0x38, 0x50, dtype=torch.uint8), "float8_e4m3fn")  # 1.0 .. 7.0
    ties = (grid[1:] + grid[:-1]) / 2
    y = (ties[:8] * (1 + hair * 2.0**-20)).repeat(2, H, 1)  # a hair off each tie: the code on that side is the nearer
    twin.write([2 * 16 + 3, 4 * 16 + 9], key=y, value=y, into=("expected",))
    nearer = R.fp8.quantize(y, 1.0, "float8_e4m3fn").view(torch.uint8)
    write_codes(twin, nearer - hair, nearer - hair)  # the tie's other side
    found = twin.diagnose()
    assert {f.fault for f in found} == {"fp8-rounding"}, lines(found)
    assert all(f.sentence.endswith(story) for f in found), lines(found)
