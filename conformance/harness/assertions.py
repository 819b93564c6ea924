"""Assertion helpers: property name first, logical coordinates, expected vs actual bytes, repro.

Every byte comparison that fails reads like::

    write: 192 elements differ (cache of 36864 bytes + 256-byte guards)
      where the wrong bytes came from:
        kv-swapped: K[b=1, s=15, h=0..2] holds V[b=1, s=15]'s bytes: K and V swapped; V[b=1, s=15] is untouched
        never-written: V[b=1, s=15, h=0..2] was never written: it still holds its initial bytes; its bytes are at K[b=1, s=15, h=0..2]
      first differing elements (192 elements in 2 rows (layer, block, kv, slot); the first of each row first):
      layer=0 block=1 kv=K slot=15 head=0 dim=0: expected 3f 80, actual 00 00
      ...
      geometry L1-B6-N16-H3-D32-bfloat16, layout HND E1[B,2,H,N,D]
      repro: pytest conformance/test_write.py --backend X --seed 0 --standard e1 -k '…'

``details["diagnosis"]`` holds every finding as a dict (diagnosis.Finding.as_dict).
"""

from __future__ import annotations

import mmap

import torch

from kvconform import reference as R

from .byte_map import block_byte_map, first_logical
from .case import GUARD, Arena, Case
from .diagnosis import EXAMINED, Grid, WriteInputs, diagnose, distinct_rows, grid_for, one_thread

KV_NAMES = ("K", "V")


class ConformanceFailure(AssertionError):
    """A failed check; ``details`` is the JSON-ready record the reports show."""

    def __init__(self, message: str, details: dict):
        super().__init__(message)
        self.details = details


def a_finding(excinfo) -> bool:
    """pytest's ``__tracebackhide__`` of the harness modules: a failure a helper formatted itself is
    shown from the check's own line (its message holds the coordinates, bytes and repro); any
    other exception (a harness bug, a backend raising) keeps every frame."""
    return excinfo is not None and excinfo.errisinstance(ConformanceFailure)


__tracebackhide__ = a_finding
SHOWN = 6  # differing elements listed per failure
LISTED_IN_MESSAGE = 8  # diagnosis findings in the message (all of them are in details["diagnosis"])
PAGE = mmap.PAGESIZE  # the unit of ``assert_bytes_equal(pages=...)``
SPAN = 64 << 20  # bytes compared at once inside a run of pages


def describe(coords: dict | None) -> str:
    if coords is None:
        return "padding (no logical element)"
    parts = [f"{k}={KV_NAMES[v] if k == 'kv' else v}" for k, v in coords.items()]
    return " ".join(parts)


def _hex(data: torch.Tensor) -> str:
    return " ".join(f"{b:02x}" for b in data.tolist())


def _places(arena: Arena, elements: list[int], grid: Grid | None = None) -> list[str]:
    """Where each element of the arena (in cache-dtype units from the arena start) lies: from
    ``grid`` (the diagnosis' offset map) where it maps the element, else ``R.coordinates_of``."""
    spec = arena.spec
    e = spec.geometry.element_size
    span = spec.layout.numel(spec.geometry)
    inner = [element - GUARD // e for element in elements]
    mapped = grid.index_of(torch.tensor(inner, dtype=torch.int64)).tolist() if grid is not None and inner else [-1] * len(inner)
    lookup = [i for i, index in zip(inner, mapped) if 0 <= i < span and index < 0]
    coords = iter(R.coordinates_of(spec.layout, spec.geometry, lookup)) if lookup else iter(())
    places = []
    for i, index in zip(inner, mapped):
        if i < 0:
            places.append(f"guard before cache ({-i * e} bytes before)")
        elif i >= span:
            places.append(f"guard after cache (+{(i - span) * e} bytes past the end)")
        elif index >= 0:
            places.append(describe(dict(zip(R.LOGICAL_DIMS, grid.coords(torch.tensor([index]))[0].tolist()))))
        else:
            places.append(describe(next(coords)))
    return places


def assert_bytes_equal(prop: str, case: Case, expected: Arena, actual: Arena, note: str = "", *, pages=None,
                       initial: Arena | None = None, writes: WriteInputs | None = None, zero_fill: bool = False) -> None:
    """The whole arena (guards included) must equal the reference's, byte for byte; ``pages``
    (indices of ``PAGE``-byte pages) limits the comparison to them, for arenas whose other
    pages are known to be equal (big_caches.py).

    A failure says where the wrong bytes came from (diagnosis.py) before the first differing
    rows: ``initial`` (the arena before the op), a write's ``writes`` and ``zero_fill`` (the
    arena reads zeros where nothing wrote) let it say more. They are read only when bytes differ;
    a passing check pays for nothing but the caller's snapshot of ``initial``."""
    e = actual.spec.geometry.element_size
    if pages is None:
        case.facts.compared(actual.buffer)
        if torch.equal(expected.buffer.to(actual.buffer.device), actual.buffer):
            return
        want = expected.buffer.cpu()
        got = actual.buffer.detach().cpu()
        differs = (want != got).view(-1, e).any(dim=1).nonzero().flatten()
    else:
        want, got = expected.buffer, actual.buffer.detach()
        differs = _differing_elements_in_pages(want, got, pages, e)
    differs = differs[~_both_nan_codes(want, got, differs, actual.spec)]  # FP8-NAN: any NaN code will do
    if differs.numel() == 0:
        return
    with one_thread():  # a failure's report: small tensors, many calls (diagnosis.one_thread)
        lines, details = _failure_report(prop, expected, actual, want, got, differs, note, initial, writes, zero_fill)
    raise ConformanceFailure("\n".join(lines + _footer(case, actual)), details)


def _failure_report(prop, expected, actual, want, got, differs, note, initial, writes, zero_fill) -> tuple[list[str], dict]:
    """The message lines (findings first, then the first element of each differing row) and details."""
    e = actual.spec.geometry.element_size
    grid = grid_for(actual.spec, GUARD, differs)
    findings = diagnose(actual.spec, want, got, differs, guard=GUARD, grid=grid, writes=writes, zero_fill=zero_fill,
                        initial=initial.buffer.detach().cpu() if initial is not None else None)
    shown, rows = _first_of_each_row(grid, actual.spec, differs)
    lines = [
        f"{prop}: {differs.numel()} element{'s differ' if differs.numel() != 1 else ' differs'} (cache of {actual.spec.layout.nbytes(actual.spec.geometry)} bytes "
        f"+ {GUARD}-byte guards){' — ' + note if note else ''}",
        "  where the wrong bytes came from:",
        *(f"    {f.line()}" for f in _in_message(findings)),
    ]
    if len(findings) > len(_in_message(findings)):
        lines.append(f"    … {len(findings) - len(_in_message(findings))} more findings (failure.diagnosis in the results lists them)")
    lines.append(f"  first differing elements ({rows}; the first of each row first):")
    mismatches = []
    for element, where in zip(shown, _places(actual, shown, grid)):
        span = slice(element * e, (element + 1) * e)
        mismatches.append({"where": where, "expected": _hex(want[span]), "actual": _hex(got[span])})
        lines.append(f"  {mismatches[-1]['where']}: expected {mismatches[-1]['expected']}, actual {mismatches[-1]['actual']}")
    if differs.numel() > len(shown):
        lines.append(f"  … {differs.numel() - len(shown)} more")
    where = first_logical(actual, differs[:64].tolist())
    details = {
        "property": prop, "differing_elements": differs.numel(), "mismatches": mismatches,
        "byte_map": block_byte_map(expected, actual, *where) if where else None,
        "diagnosis": [f.as_dict() for f in findings],
    }
    return lines, details


def _in_message(findings: list) -> list:
    """At most ``LISTED_IN_MESSAGE`` findings, every fault class among them at least once (its
    first finding), in their order."""
    if len(findings) <= LISTED_IN_MESSAGE:
        return findings
    chosen, seen = set(), set()
    for i, f in enumerate(findings):
        if f.fault not in seen:
            seen.add(f.fault)
            chosen.add(i)
    for i in range(len(findings)):
        if len(chosen) >= LISTED_IN_MESSAGE:
            break
        chosen.add(i)
    return [findings[i] for i in sorted(chosen)][: max(LISTED_IN_MESSAGE, len(seen))]


def _first_of_each_row(grid: Grid, spec, differs: torch.Tensor) -> tuple[list[int], str]:
    """``SHOWN`` differing elements, the first of each differing (layer, block, kv, slot) row
    first (so that six rows name six places, not one row six times), in arena order; and how
    many rows differ."""
    examined = differs[:EXAMINED]
    row = distinct_rows(grid, spec, GUARD, examined)
    _, inverse = torch.unique(row, return_inverse=True)
    firsts = torch.full((int(inverse.max()) + 1,), examined.numel(), dtype=torch.int64).scatter_reduce(
        0, inverse, torch.arange(examined.numel()), "amin")
    picked = torch.sort(firsts).values[:SHOWN]
    if picked.numel() < SHOWN:
        rest = torch.ones(examined.numel(), dtype=torch.bool)
        rest[picked] = False
        picked = torch.cat([picked, torch.nonzero(rest).flatten()[: SHOWN - picked.numel()]])
    count = firsts.numel()
    more = "+" if differs.numel() > examined.numel() else ""
    text = f"{differs.numel()} elements in {count}{more} row{'s' if count != 1 else ''} (layer, block, kv, slot)"
    return examined[torch.sort(picked).values].tolist(), text


def _both_nan_codes(want: torch.Tensor, got: torch.Tensor, elements: torch.Tensor, spec) -> torch.Tensor:
    """Which of these fp8 cache elements hold a NaN code on both sides (SPEC FP8-NAN leaves the
    NaN code open); all False for other caches, and for guard bytes."""
    g = spec.geometry
    inside = (elements >= GUARD) & (elements < GUARD + spec.layout.nbytes(g))
    if g.dtype not in R.fp8.FP8_DTYPES or not bool(inside.any()):
        return torch.zeros_like(elements, dtype=torch.bool)
    index = elements.to(want.device)
    nan = lambda codes: torch.isnan(R.fp8.decode_codes(codes.cpu(), g.dtype))  # noqa: E731
    return inside & nan(want[index]) & nan(got[index.to(got.device)])


def _differing_elements_in_pages(want: torch.Tensor, got: torch.Tensor, pages: torch.Tensor, e: int) -> torch.Tensor:
    """Arena element indices that differ, looking only inside ``pages`` (CPU buffers, sorted
    page indices). Runs of consecutive pages are compared ``SPAN`` bytes at a time: a fault that
    touched a whole multi-GiB arena is millions of pages, one Python step each took minutes."""
    found = []
    pages = pages.to(torch.int64)
    breaks = torch.nonzero(pages[1:] != pages[:-1] + 1).flatten() + 1
    for run in torch.tensor_split(pages, breaks) if pages.numel() else ():
        end = min((int(run[-1]) + 1) * PAGE, want.numel())
        for start in range(int(run[0]) * PAGE, end, SPAN):
            span = slice(start, min(start + SPAN, end))
            if not torch.equal(want[span], got[span]):
                found.append((want[span] != got[span]).nonzero().flatten().add(start).div(e, rounding_mode="floor"))
    return torch.unique(torch.cat(found)) if found else torch.empty(0, dtype=torch.int64)


def assert_equal(prop: str, case: Case, expected, actual, what: str) -> None:
    """A declared fact (shape, stride, pointer delta, flag) must equal the spec's."""
    if expected != actual:
        details = {"property": prop, "mismatches": [{"where": what, "expected": repr(expected), "actual": repr(actual)}]}
        raise ConformanceFailure(f"{prop}: {what}: expected {expected!r}, actual {actual!r}\n" + "\n".join(_footer(case, None)), details)


def assert_offsets_equal(prop: str, case: Case, expected: torch.Tensor, actual: torch.Tensor, what: str) -> None:
    """Where each logical ``(L, B, 2, N, H, D)`` element lives: the tensor's element offsets
    (from the cache start) must equal the declared layout's, element for element."""
    differs = (expected != actual).nonzero()
    if differs.numel() == 0:
        return
    names = ("layer", "block", "kv", "slot", "head", "dim")
    mismatches = [
        {"where": describe(dict(zip(names, (int(i) for i in idx)))), "expected": f"offset {int(expected[tuple(idx)])}", "actual": f"offset {int(actual[tuple(idx)])}"}
        for idx in differs[:SHOWN]
    ]
    lines = [f"{prop}: {what}: {differs.shape[0]} logical elements are not where the layout puts them"]
    lines += [f"  {m['where']}: expected {m['expected']}, actual {m['actual']}" for m in mismatches]
    raise ConformanceFailure("\n".join(lines + _footer(case, None)), {"property": prop, "differing_elements": differs.shape[0], "mismatches": mismatches})


def assert_true(prop: str, case: Case, condition: bool, message: str) -> None:
    if not condition:
        raise ConformanceFailure(f"{prop}: {message}\n" + "\n".join(_footer(case, None)), {"property": prop, "mismatches": [{"where": message}]})


def assert_close(prop: str, case: Case, expected: torch.Tensor, actual: torch.Tensor, *, atol: float, rtol: float, dims: tuple[str, ...]) -> None:
    """Numeric read-side results within tolerance; names the worst logical index."""
    expected, actual = expected.float().cpu(), actual.float().cpu()
    if expected.shape != actual.shape:
        raise AssertionError(f"{prop}: shape: expected {tuple(expected.shape)}, actual {tuple(actual.shape)}\n" + "\n".join(_footer(case, None)))
    err = (actual - expected).abs()
    bad = (err > atol + rtol * expected.abs()) | actual.isnan()
    if not bool(bad.any()):
        return
    worst = int(torch.where(bad, err.nan_to_num(float("inf")), torch.zeros_like(err)).argmax())
    index = R.unravel(worst, expected.shape)
    where = " ".join(f"{d}={int(i)}" for d, i in zip(dims, index))
    mismatch = {"where": where, "expected": f"{float(expected.flatten()[worst]):.6g}", "actual": f"{float(actual.flatten()[worst]):.6g}"}
    raise ConformanceFailure(
        f"{prop}: {int(bad.sum())} of {bad.numel()} values outside atol={atol} rtol={rtol}; worst at {where}: "
        f"expected {mismatch['expected']}, actual {mismatch['actual']}\n" + "\n".join(_footer(case, None)),
        {"property": prop, "differing_elements": int(bad.sum()), "mismatches": [mismatch]},
    )


def _footer(case: Case, arena: Arena | None) -> list[str]:
    lines = []
    if arena is not None:
        lines.append(f"  geometry {arena.spec.geometry.short()}, kv_cache_dtype {arena.spec.kv_cache_dtype}, layout {arena.spec.layout}")
    elif case.layout is not None:
        lines.append(f"  layout {case.layout}")
    lines.append(f"  repro: {case.repro}")
    return lines
