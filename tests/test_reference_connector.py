"""The reference connector ops (reference/connector.py) equal the spec's formulas: regions,
head slices, wire export/import and re-blocking are checked against the brute-force oracle
(tests/oracle.py) and against each other; conversions against a code-by-code enumeration."""

import dataclasses

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R
from kvconform.reference import connector as C

from . import oracle
from .strategies import geometries

LAYOUTS = R.named_layouts()
E4M3FN, E4M3FNUZ = torch.float8_e4m3fn, torch.float8_e4m3fnuz


def oracle_bytes(key, g, blocks, heads) -> set[int]:
    e = g.element_size
    return {oracle.offset(key, g, l, b, kv, n, h, d) * e + i
            for l in range(g.num_layers) for b in blocks for kv in (0, 1) for n in range(g.block_size)
            for h in heads for d in range(g.head_size) for i in range(e)}


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=st.data())
def test_regions_cover_exactly_the_bytes_of_the_chosen_blocks_and_heads(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout, max_blocks=3), label="geometry")
    blocks = data.draw(st.lists(st.integers(0, g.num_blocks - 1), min_size=1, max_size=2, unique=True), label="blocks")
    start = data.draw(st.integers(0, g.num_kv_heads - 1), label="first head")
    heads = range(start, data.draw(st.integers(start + 1, g.num_kv_heads), label="end head"))
    regions = C.byte_regions(layout, g, blocks, heads)
    covered = [offset + i for offset, length in regions for i in range(length)]
    assert sorted(covered) == sorted(oracle_bytes(key, g, blocks, heads))
    assert all(a[0] + a[1] < b[0] for a, b in zip(regions, regions[1:])), "regions are ascending, disjoint and maximal"


@pytest.mark.parametrize("total, producer_tp, consumer_tp", [(4, 1, 2), (4, 2, 1), (4, 1, 4), (4, 4, 1), (4, 2, 4), (2, 1, 4), (2, 4, 1), (2, 4, 8), (8, 8, 2)])
def test_head_slices_give_each_consumer_rank_each_of_its_heads_once_from_a_holder(total, producer_tp, consumer_tp):
    for rank in range(consumer_tp):
        got = []
        for s in C.head_slices(total, producer_tp, consumer_tp, rank):
            held = C.rank_heads(total, producer_tp, s.producer_rank)
            got += [(held[h], c) for h, c in zip(s.producer_heads, s.consumer_heads)]
        wanted = C.rank_heads(total, consumer_tp, rank)
        assert got == [(head, local) for local, head in enumerate(wanted)]


def test_rank_heads_split_evenly_or_replicate():
    assert [C.rank_heads(4, 2, r) for r in range(2)] == [range(0, 2), range(2, 4)]
    assert [C.rank_heads(2, 4, r) for r in range(4)] == [range(0, 1), range(0, 1), range(1, 2), range(1, 2)]
    for bad in ((4, 3, 0), (3, 2, 0), (2, 3, 0), (4, 2, 2)):
        with pytest.raises(ValueError):
            C.rank_heads(*bad)


@given(st.lists(st.tuples(st.integers(0, 1 << 40), st.integers(0, 40)), min_size=1, max_size=12))
def test_region_bytes_are_each_regions_bytes_in_region_order(regions):
    want = [offset + i for offset, length in regions for i in range(length)]
    assert C.region_bytes(regions).tolist() == want


def test_a_region_of_negative_length_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"region \(7, -2\) has a negative length"):
        C.region_bytes([(0, 4), (7, -2)])


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=st.data())
def test_export_gives_canonical_bytes_and_import_puts_every_element_back(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout, max_blocks=4), label="geometry")
    storage = torch.randint(0, 256, (layout.nbytes(g),), dtype=torch.uint8, generator=torch.Generator().manual_seed(data.draw(st.integers(0, 99))))
    blocks = data.draw(st.permutations(range(g.num_blocks)), label="blocks")[:2]
    wire = C.export_blocks(storage, layout, g, blocks)
    assert torch.equal(wire.data.view(len(blocks), -1), R.canonical_block_bytes(storage, layout, g, blocks))
    other = data.draw(st.sampled_from([k for k in LAYOUTS if _holds(LAYOUTS[k], g)]), label="target layout")
    target = torch.zeros(LAYOUTS[other].nbytes(g), dtype=torch.uint8)
    C.import_blocks(target, LAYOUTS[other], g, list(reversed(blocks)), wire)
    bits = R.bits_dtype(g.dtype)
    assert torch.equal(R.read_logical(target, LAYOUTS[other], g, list(reversed(blocks))).view(bits), R.read_logical(storage, layout, g, blocks).view(bits))


def _holds(layout, g) -> bool:
    try:
        layout.validate(g)
        return True
    except ValueError:
        return False


@given(data=st.data())
def test_reblocking_moves_token_t_to_slot_t_mod_n_of_block_t_div_n(data):
    layout_p, layout_c = (LAYOUTS[data.draw(st.sampled_from(["E1:NHD", "E1:HND", "AITER:shuffle-blocks_first", "E0:HND"]), label=f"{side} layout")] for side in "pc")
    n_p, n_c = data.draw(st.sampled_from([(16, 32), (32, 16), (16, 16)]), label="block sizes")
    tokens = data.draw(st.integers(1, 3 * max(n_p, n_c)), label="tokens")
    gp = R.Geometry(num_blocks=-(-tokens // n_p) + 1, block_size=n_p, num_kv_heads=2, head_size=16, dtype=torch.bfloat16)
    gc = dataclasses.replace(gp, num_blocks=-(-tokens // n_c) + 1, block_size=n_c)
    p_table = list(reversed(range(gp.num_blocks)))[: -(-tokens // n_p)]
    c_table = list(range(1, gc.num_blocks))
    source = torch.randint(0, 256, (layout_p.nbytes(gp),), dtype=torch.uint8)
    target = torch.zeros(layout_c.nbytes(gc), dtype=torch.uint8)
    C.import_blocks(target, layout_c, gc, c_table, C.export_blocks(source, layout_p, gp, p_table), num_tokens=tokens)
    src, dst = R.read_logical(source, layout_p, gp).view(torch.int16), R.read_logical(target, layout_c, gc).view(torch.int16)
    for t in range(tokens):
        assert torch.equal(dst[:, c_table[t // n_c], :, t % n_c], src[:, p_table[t // n_p], :, t % n_p]), f"token {t}"
    written = {(c_table[t // n_c], t % n_c) for t in range(tokens)}
    untouched = [(b, n) for b in range(gc.num_blocks) for n in range(n_c) if (b, n) not in written]
    assert all(not dst[:, b, :, n].any() for b, n in untouched), "a slot past the last token changed"


@pytest.mark.parametrize("src, dst, ratio, exact", [
    (E4M3FN, E4M3FNUZ, 0.5, True),  # vLLM's doubled fnuz scale: every code, −0 and NaN included
    (E4M3FN, E4M3FNUZ, 1.0, False), (E4M3FNUZ, E4M3FN, 2.0, False), (E4M3FNUZ, E4M3FN, 1.0, False),
    (torch.bfloat16, torch.float32, 1.0, True), (torch.float32, torch.bfloat16, 1.0, False),
    (torch.bfloat16, torch.float16, 1.0, False), (torch.float8_e5m2, torch.float16, 1.0, True),
    (E4M3FN, E4M3FN, 2.0, False), (torch.float16, torch.float16, 1.0, True),
])
def test_a_conversion_is_exact_iff_every_code_keeps_its_value(src, dst, ratio, exact):
    witness = C.inexact_code(src, dst, ratio)
    assert (witness is None) == exact
    if torch.empty((), dtype=src).element_size() == 1:  # an independent enumeration through torch's own casts
        values = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(src).float() * ratio
        clamp = R.fp8.fp8_format(dst).max_finite if dst in R.fp8.FP8_DTYPES else float("inf")
        back = values.clamp(-clamp, clamp).to(dst).float()
        kept = (back == values) | (back.isnan() & values.isnan())
        assert bool(kept.all()) == exact
        if witness is not None:
            assert not bool(kept[witness])


def test_slice_problems_accept_any_replica_and_name_what_is_wrong():
    S = C.HeadSlice
    assert C.slice_problems(1, 2, 2, 1, [S(0, range(1), range(1))]) == []  # a replica from producer rank 0 will do
    assert C.slice_problems(1, 2, 2, 1, C.head_slices(1, 2, 2, 1)) == [] and C.head_slices(1, 2, 2, 1)[0].producer_rank == 1
    assert C.slice_problems(4, 2, 1, 0, []) == [f"consumer head {h} (model head {h}) receives nothing; holders: producer ranks [{h // 2}]" for h in range(4)]
    twice = C.slice_problems(1, 2, 1, 0, [S(0, range(1), range(1)), S(1, range(1), range(1))])
    assert twice == ["consumer head 0 (model head 0) receives 2 times (producer rank 0, producer rank 1)"]
    wrong = C.slice_problems(4, 2, 2, 1, [S(0, range(2), range(2))])
    assert wrong[0].startswith("consumer head 0 (model head 2) would receive model head 0")


@pytest.mark.parametrize("total, producer_tp, consumer_tp", [(1, 2, 2), (1, 8, 8), (2, 4, 8), (1, 4, 2), (2, 8, 1), (6, 3, 2)])
def test_default_pairing_reads_the_first_holder_at_or_after_the_paired_rank(total, producer_tp, consumer_tp):
    for rank in range(consumer_tp):
        first = rank * producer_tp // consumer_tp
        for s in C.head_slices(total, producer_tp, consumer_tp, rank):
            held = C.rank_heads(total, producer_tp, s.producer_rank)
            for h in s.producer_heads:
                holders = [p for p in range(producer_tp) if held[h] in C.rank_heads(total, producer_tp, p)]
                assert s.producer_rank == next((p for p in holders if p >= first), holders[0])
        assert C.slice_problems(total, producer_tp, consumer_tp, rank, C.head_slices(total, producer_tp, consumer_tp, rank)) == []
