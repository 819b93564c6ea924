"""What the connector checks share: a model's KV on one engine rank (a *shard*), the model's
logical KV that every rank's shard holds a slice of, and the region assertion.

A shard holds L ≥ 3 layers: one allocation when the layout has a layer dimension (E3), one
allocation per layer otherwise (E1, E0 and AITER caches are per layer, as vLLM allocates them).
Every allocation is a guarded arena (harness.Arena), so a connector op that writes anywhere it
should not is caught by the whole-arena comparison.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R

from .assertions import ConformanceFailure, a_finding, assert_bytes_equal, describe
from .case import Arena, Case, random_bytes

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)

LAYERS = 3


@dataclasses.dataclass
class Shard:
    """One rank's KV cache: ``arenas[i]`` holds the model layers ``layers[i]``."""

    arenas: list[Arena]
    layers: list[range]

    @property
    def spec(self):
        return self.arenas[0].spec

    def snapshot(self) -> "Shard":
        return Shard([a.snapshot() for a in self.arenas], self.layers)

    def place(self, blocks, values: torch.Tensor, heads=None) -> None:
        """Write model-wide logical bits ``(L, len(blocks), 2, N, h, D)`` into the blocks (heads)."""
        for arena, layers in zip(self.arenas, self.layers):
            g = arena.spec.geometry
            R.connector.scatter(arena.region, arena.spec.layout, g, blocks, values[layers.start:layers.stop], heads)

    def read(self, blocks, heads=None) -> torch.Tensor:
        """The blocks' (heads') logical bits, model-wide ``(L, len(blocks), 2, N, h, D)``."""
        return torch.cat([R.connector.gather(a.region, a.spec.layout, a.spec.geometry, blocks, heads).cpu() for a in self.arenas])


def allocate_shard(case: Case, layout: R.Layout, g: R.Geometry, *, kv_cache_dtype=None, model_dtype=None, seed_offset=0) -> Shard:
    """Random-filled arenas for a model of ``g.num_layers`` layers in ``layout`` (dtypes not
    given follow ``g.dtype``, as ``Case.spec``)."""
    per_arena = g.num_layers if "L" in layout.k_dims else 1
    spec = case.spec(dataclasses.replace(g, num_layers=per_arena), kv_cache_dtype, model_dtype, layout=layout)
    count = g.num_layers // per_arena
    return Shard([case.allocate(spec, seed_offset=seed_offset + i) for i in range(count)],
                 [range(i * per_arena, (i + 1) * per_arena) for i in range(count)])


def edge_codes(dtype: torch.dtype) -> torch.Tensor:
    """Bit patterns a value cast would not keep: every code of an 8-bit type; −0, ±inf, the
    largest value, the smallest subnormal and NaNs with payloads (signalling, negative) of wider ones."""
    bits = R.bits_dtype(dtype)
    width = torch.empty((), dtype=dtype).element_size() * 8
    if width == 8:
        return torch.arange(256, dtype=torch.int32).to(bits)
    finfo = torch.finfo(dtype)
    values = torch.tensor([-0.0, float("inf"), float("-inf"), finfo.max, finfo.smallest_normal * finfo.eps], dtype=dtype).view(bits)
    mantissa = round(-torch.log2(torch.tensor(finfo.eps)).item())
    inf, neg_inf = int(values[1]), int(values[2])
    nans = torch.tensor([inf | 1, neg_inf | (1 << (mantissa - 1)) | 3], dtype=torch.int64).to(bits)
    return torch.cat([values, nans])


def model_kv(g: R.Geometry, num_blocks: int, total_heads: int, seed: int) -> torch.Tensor:
    """A model's logical KV bits ``(L, num_blocks, 2, N, total_heads, D)``: seeded random bits
    with every edge code of the dtype at the front (so a cast instead of a bit copy shows)."""
    shape = (g.num_layers, num_blocks, 2, g.block_size, total_heads, g.head_size)
    gen = torch.Generator().manual_seed(seed)
    raw = random_bytes(torch.Size(shape).numel() * g.element_size, gen)
    flat = raw.view(R.bits_dtype(g.dtype)).clone()
    edges = edge_codes(g.dtype)
    flat[: edges.numel()] = edges[: flat.numel()]
    return flat.view(shape)


def assert_shards_equal(prop: str, case: Case, expected: Shard, actual: Shard, note: str = "", *, initial: Shard | None = None) -> None:
    """Every arena of the shard (guards included) equals the reference's, byte for byte
    (``initial``: the shard before the op, for a failure's diagnosis)."""
    for i, (want, got) in enumerate(zip(expected.arenas, actual.arenas)):
        where = f"layers {actual.layers[i].start}..{actual.layers[i].stop - 1}" if len(actual.arenas) > 1 else ""
        assert_bytes_equal(prop, case, want, got, "; ".join(x for x in (note, where) if x), initial=initial.arenas[i] if initial else None)


def cache_origin(arena: Arena) -> int:
    """Bytes from the suite's buffer start to the backend's cache tensor's first byte."""
    return arena.cache.data_ptr() - arena.region.data_ptr()


def assert_regions_cover_exactly(prop: str, case: Case, arena: Arena, regions, blocks, heads, what: str) -> None:
    """The regions (byte offsets from the cache's first byte) cover every byte of the requested
    blocks' (heads') elements once, and no other byte."""
    spec = arena.spec
    g, e, size = spec.geometry, spec.geometry.element_size, spec.layout.nbytes(spec.geometry)
    origin = cache_origin(arena)
    counts = torch.zeros(size, dtype=torch.int32)
    outside = []
    for offset, length in regions:
        start, stop = offset + origin, offset + origin + length
        if length <= 0 or start < 0 or stop > size:
            outside.append((offset, length))
            continue
        counts[start:stop] += 1
    wanted = torch.zeros(size, dtype=torch.bool)
    wanted.view(-1, e)[R.offset_map(spec.layout, g, blocks, heads).flatten()] = True
    if not outside and torch.equal(counts, wanted.to(torch.int32)):  # every wanted byte once, no other: the common case, cheaply
        return
    per_element = lambda mask: mask.view(-1, e).any(dim=1)  # noqa: E731
    extra, missing, twice = per_element((counts > 0) & ~wanted), per_element((counts == 0) & wanted), per_element(counts > 1)
    mismatches = [{"where": f"region {r}", "expected": f"inside the cache's {size} bytes", "actual": "outside"} for r in outside[:3]]
    for mask, expected, actual in ((extra, "not covered", "covered"), (missing, "covered", "not covered"), (twice, "covered once", "covered twice")):
        for element in torch.nonzero(mask).flatten()[:2].tolist():
            coords = R.coordinates_of(spec.layout, g, [element])[0]
            mismatches.append({"where": f"byte {element * e}: {describe(coords)}", "expected": expected, "actual": actual})
    lines = [f"{prop}: regions {what}: {int(extra.sum())} elements covered that were not asked for, {int(missing.sum())} asked-for "
             f"elements not covered, {int(twice.sum())} covered twice, {len(outside)} regions outside the cache ({len(regions)} regions)"]
    lines += [f"  {m['where']}: expected {m['expected']}, actual {m['actual']}" for m in mismatches]
    lines += [f"  geometry {g.short()}, layout {spec.layout}", f"  repro: {case.repro}"]
    raise ConformanceFailure("\n".join(lines), {"property": prop, "differing_elements": int((extra | missing | twice).sum()), "mismatches": mismatches})


def region_overlaps(regions) -> str | None:
    """Why a list of byte regions is not a set of disjoint runs (a connector registering a run
    twice ships its bytes twice and the byte counts of the two sides disagree), or None."""
    runs = sorted((int(offset), int(length)) for offset, length in regions)
    for (a, n), (b, m) in zip(runs, runs[1:]):
        if b < a + n:
            twice = min(a + n, b + m) - b
            return f"regions ({a}, {n}) and ({b}, {m}) cover {twice} bytes twice (from byte {b})"
    return None


def assert_regions_disjoint(prop: str, case: Case, regions, what: str) -> None:
    """The regions a backend reported for one transfer cover no byte twice."""
    overlap = region_overlaps(regions)
    if overlap:
        raise ConformanceFailure(f"{prop}: regions {what}: {overlap}\n  repro: {case.repro}",
                                 {"property": prop, "mismatches": [{"where": f"regions {what}", "expected": "each byte once", "actual": overlap}]})
