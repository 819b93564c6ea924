"""The report's block picture names misplaced rows for every cache element width: 1-byte fp8,
2-byte bf16/fp16 and 4-byte float32 caches (element values repeat in narrow dtypes; whole rows
do not)."""

import pytest
import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec
from kvconform.conformance.harness.byte_map import block_byte_map
from kvconform.conformance.harness.case import GUARD, Arena

K, V = 0, 1
B, N, H, D = 5, 16, 3, 32


def arenas(dtype, layout):
    """A seeded random expected arena and an actual one where block 2 has three rows wrong:
    (K, slot 1, head 0) holds V slot 3 head 2's row, (V, slot 0, head 1) holds block 4's
    K slot 5 head 0, and (K, slot 7, head 2) holds bytes no logical row has."""
    g = R.Geometry(num_blocks=B, block_size=N, num_kv_heads=H, head_size=D, dtype=dtype)
    spec = CacheSpec(layout=layout, geometry=g)
    data = torch.randint(0, 256, (2 * GUARD + layout.nbytes(g),), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    expected, actual = Arena(data, spec), Arena(data.clone(), spec)
    omap = R.offset_map(layout, g)
    want, got = expected.region.view(R.bits_dtype(dtype)), actual.region.view(R.bits_dtype(dtype))
    got[omap[0, 2, K, 1, 0]] = want[omap[0, 2, V, 3, 2]]
    got[omap[0, 2, V, 0, 1]] = want[omap[0, 4, K, 5, 0]]
    got[omap[0, 2, K, 7, 2]] = ~want[omap[0, 2, K, 7, 2]]
    return expected, actual


def wrong_cells(picture):
    return {tuple(c["row"]): (c["actual"], c.get("actual_block")) for c in picture["cells"] if not c["ok"]}


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16, torch.float16, torch.float32], ids=lambda d: f"{d.itemsize}-byte-{d}")
@pytest.mark.parametrize("layout", [R.blocks_first("NHD"), R.blocks_first("HND")], ids=str)
def test_byte_map_names_the_misplaced_rows_for_every_element_width(dtype, layout):
    picture = block_byte_map(*arenas(dtype, layout), layer=0, block=2)
    assert wrong_cells(picture) == {
        (K, 1, 0): ([V, 3, 2], None),
        (V, 0, 1): ([K, 5, 0], [0, 4]),
        (K, 7, 2): (None, None),
    }
    assert len(picture["cells"]) == 2 * N * H
    assert [c["offset"] for c in picture["cells"]] == sorted(c["offset"] for c in picture["cells"])


def test_byte_map_of_a_tiled_layout_follows_each_rows_scattered_elements():
    shuffled = next(layout for layout in R.named_layouts().values() if layout.is_tiled and layout.era == "AITER")
    picture = block_byte_map(*arenas(torch.bfloat16, shuffled), layer=0, block=2)
    assert wrong_cells(picture)[(K, 1, 0)] == ([V, 3, 2], None)
