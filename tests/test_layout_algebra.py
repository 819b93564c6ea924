"""The layout algebra equals the spec's formulas, and its derived facts hold."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvconform import reference as R

from . import oracle
from .strategies import geometries

LAYOUTS = R.named_layouts()


def as_offsets_view(layout, g, shape_strides_offset):
    """The offsets a strided view of an ``arange`` storage exposes."""
    shape, strides, base = shape_strides_offset
    return torch.arange(layout.numel(g)).as_strided(shape, strides, base)


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=__import__("hypothesis").strategies.data())
def test_offset_map_equals_the_spec_formula(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout, max_blocks=3), label="geometry")
    expected = torch.tensor(oracle.offset_map(key, g)).view(R.logical_shape(g))
    assert torch.equal(R.offset_map(layout, g), expected), f"{key} {g.short()}"


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=__import__("hypothesis").strategies.data())
def test_offset_map_is_injective_and_in_bounds(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout), label="geometry")
    omap = R.offset_map(layout, g)
    assert R.is_injective(omap)
    assert R.is_in_bounds(omap, layout.numel(g))


@pytest.mark.parametrize("key", LAYOUTS)
@given(data=__import__("hypothesis").strategies.data())
def test_side_views_address_the_offset_map(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout), label="geometry")
    layer = data.draw(__import__("hypothesis").strategies.integers(0, g.num_layers - 1), label="layer")
    omap = R.offset_map(layout, g)[layer]
    for kv in (0, 1):
        seen = as_offsets_view(layout, g, layout.side_view(g, kv, layer))
        expected = omap[:, kv]  # (B, N, H, D)
        if layout.is_tiled:
            x = g.x
            B, N, H, D = expected.shape
            if kv == 0:  # [B, H, D/x, N, x]
                expected = expected.reshape(B, N, H, D // x, x).permute(0, 2, 3, 1, 4)
            elif "x:n" in layout.v_dims:  # [B, H, N/x, D, x]
                expected = expected.reshape(B, N // x, x, H, D).permute(0, 3, 1, 4, 2)
            else:  # [B, H, D, N]
                expected = expected.permute(0, 2, 3, 1)
        assert torch.equal(seen, expected), f"{key} kv={kv} {g.short()}"


@pytest.mark.parametrize("key", [k for k, lay in LAYOUTS.items() if not lay.is_tiled])
@given(data=__import__("hypothesis").strategies.data())
def test_offset_map_is_affine_with_the_view_strides(key, data):
    layout = LAYOUTS[key]
    g = data.draw(geometries(layout), label="geometry")
    strides = R.strides_from_offsets(R.offset_map(layout, g))
    assert strides is not None
    for kv in (0, 1):
        shape, side_strides, _ = layout.side_view(g, kv)
        for size, found, axis in zip(shape, side_strides, (1, 3, 4, 5)):
            assert size == 1 or found == strides[axis]


def test_tiled_container_covers_the_same_elements():
    g = R.Geometry(num_blocks=3, block_size=16, num_kv_heads=2, head_size=32, dtype=torch.bfloat16, num_layers=2)
    for key, layout in LAYOUTS.items():
        if layout.container is None:
            continue
        lg = g if "L" in layout.k_dims else R.Geometry(**{**g.__dict__, "num_layers": 1})
        tiled = torch.sort(R.offset_map(layout, lg).flatten()).values
        container = torch.sort(R.offset_map(layout.container, lg).flatten()).values
        assert torch.equal(tiled, container), key


# E3 strides of SPEC LAYOUT-E3 in units of C: P = H·N·C, (sL, sB, sH, sN).
E3_STRIDE_TABLE = {
    "LBHNC": lambda L, B, H, N: (B * H * N, H * N, N, 1),
    "LBNHC": lambda L, B, H, N: (B * H * N, H * N, 1, H),
    "LHBNC": lambda L, B, H, N: (B * H * N, N, B * N, 1),
    "BLHNC": lambda L, B, H, N: (H * N, L * H * N, N, 1),
    "BLNHC": lambda L, B, H, N: (H * N, L * H * N, 1, H),
    "BHLNC": lambda L, B, H, N: (N, L * H * N, L * N, 1),
}
# (layer_compact, block_contiguous, block_compact, block_outermost) of SPEC §14.
E3_PROPERTY_TABLE = {
    "LBHNC": (True, True, True, False),
    "LBNHC": (True, False, True, False),
    "LHBNC": (True, False, False, False),
    "BLHNC": (False, True, True, True),
    "BLNHC": (False, False, True, True),
    "BHLNC": (False, False, False, True),
}


@pytest.mark.parametrize("name", E3_STRIDE_TABLE)
@pytest.mark.parametrize("spec", ["standard", "two_slot"])
def test_e3_strides_equal_compute_layout_strides(name, spec):
    g = R.Geometry(num_blocks=5, block_size=4, num_kv_heads=3, head_size=8, dtype=torch.bfloat16, num_layers=2)
    layout = R.standardized(name, spec=spec)
    heads, content = (3, 16) if spec == "standard" else (2, 24)
    shape, strides = layout.view_shape_strides(g)
    assert shape == (2, 5, heads, 4, content)
    expected = tuple(s * content for s in E3_STRIDE_TABLE[name](2, 5, heads, 4)) + (1,)
    assert strides == expected


@pytest.mark.parametrize("name", E3_PROPERTY_TABLE)
@pytest.mark.parametrize("spec", ["standard", "two_slot"])
def test_e3_properties_equal_the_spec_table(name, spec):
    g = R.Geometry(num_blocks=4, block_size=4, num_kv_heads=2, head_size=8, dtype=torch.bfloat16, num_layers=3)
    layout = R.standardized(name, spec=spec)
    omap = R.offset_map(layout, g)
    found = (
        R.is_layer_compact(omap), R.is_block_contiguous(omap, layout.slot_coord),
        R.is_block_compact(omap), R.is_block_outermost(omap),
    )
    assert found == E3_PROPERTY_TABLE[name]


def test_block_byte_runs_show_kv_first_planes_apart():
    g = R.Geometry(num_blocks=4, block_size=2, num_kv_heads=1, head_size=4, dtype=torch.float16)
    plane = 4 * 2 * 4 * 2  # B·N·H·D·e
    assert R.block_byte_runs(R.offset_map(R.kv_first(), g), 2, 0, 3) == [(48, 64), (48 + plane, 64 + plane)]
    assert R.block_byte_runs(R.offset_map(R.blocks_first(), g), 2, 0, 3) == [(96, 128)]
    ranges = R.block_byte_ranges(R.offset_map(R.blocks_first(), g), 2)
    assert ranges[0, 3].tolist() == [96, 128]


def test_padded_pages_keep_blocks_apart():
    g = R.Geometry(num_blocks=3, block_size=2, num_kv_heads=2, head_size=4, dtype=torch.bfloat16, num_layers=2)
    layout = R.standardized("LBNHC", block_pad=5)
    omap = R.offset_map(layout, g)
    assert layout.view_shape_strides(g)[1][:2] == (3 * (32 + 5), 32 + 5)
    assert R.is_injective(omap) and not R.is_layer_compact(omap) and not R.is_block_outermost(omap)


@pytest.mark.parametrize(
    "make, field",
    [
        (lambda: R.Geometry(num_blocks=0, block_size=16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16), "num_blocks"),
        (lambda: R.Geometry(num_blocks=2, block_size=-16, num_kv_heads=1, head_size=8, dtype=torch.bfloat16), "block_size"),
        (lambda: R.aiter_shuffle().validate(R.Geometry(num_blocks=2, block_size=16, num_kv_heads=1, head_size=36, dtype=torch.bfloat16)), "head_size"),
        (lambda: R.aiter_shuffle().validate(R.Geometry(num_blocks=2, block_size=8, num_kv_heads=1, head_size=64, dtype=torch.float8_e4m3fn)), "block_size"),
        (lambda: R.blocks_first().validate(R.Geometry(num_blocks=2, block_size=8, num_kv_heads=1, head_size=64, dtype=torch.bfloat16, num_layers=2)), "num_layers"),
        (lambda: R.permuted("E1", "bad", (("B",), ("2",)), (0, 0)), "stride_order"),
        (lambda: R.standardized("LBNHC", spec="two_slot", tile="shuffle"), "tile"),
        (lambda: R.blocks_first("NDH"), "NDH"),
    ],
)
def test_invalid_geometry_or_layout_names_the_field(make, field):
    with pytest.raises(ValueError, match=field):
        make()


def test_x_comes_from_the_cache_dtype():
    bf16 = R.Geometry(num_blocks=2, block_size=16, num_kv_heads=1, head_size=16, dtype=torch.bfloat16)
    fp8 = R.Geometry(num_blocks=2, block_size=16, num_kv_heads=1, head_size=16, dtype=torch.float8_e4m3fn)
    assert (bf16.x, fp8.x) == (8, 16)
    k_view = R.aiter_shuffle().side_view(fp8, 0)
    assert k_view[0] == (2, 1, 1, 16, 16)


def test_names_say_the_physical_shape():
    assert R.blocks_first("HND").name == "E1[B,2,H,N,D]"
    assert R.aiter_shuffle().name == "AITER[B,2,H|D/x,N,x|N/x,D,x]"
    assert R.standardized("NHD").name == "E3[L,B,N,H,2,D]"


@pytest.mark.parametrize("key", ["E1:HND", "AITER:shuffle-blocks_first", "E3:BHLNC"])
def test_coordinates_of_inverts_the_offset_map_chunk_by_chunk(key):
    layout = LAYOUTS[key]
    g = R.Geometry(num_blocks=5, block_size=16, num_kv_heads=2, head_size=16, dtype=torch.bfloat16, num_layers=2 if "L" in layout.k_dims else 1)
    omap = R.offset_map(layout, g)
    picks = [(0, 4, 1, 15, 1, 15), (g.num_layers - 1, 2, 0, 3, 0, 9), (0, 0, 0, 0, 0, 0)]
    offsets = [int(omap[p]) for p in picks] + [layout.numel(g) + 5]
    found = R.coordinates_of(layout, g, offsets, chunk_elements=100)
    assert [tuple(c.values()) if c else None for c in found] == picks + [None]


@given(st.lists(st.integers(1, 7), min_size=1, max_size=6), st.data())
def test_unravel_gives_torchs_coordinates_for_ints_and_tensors(shape, data):
    index = data.draw(st.lists(st.integers(0, math.prod(shape) - 1), min_size=1, max_size=5))
    expected = torch.stack(torch.unravel_index(torch.tensor(index), shape), dim=1)
    assert torch.equal(torch.stack(R.unravel(torch.tensor(index), shape), dim=1), expected)
    assert [list(R.unravel(i, shape)) for i in index] == expected.tolist()
