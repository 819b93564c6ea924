"""What the latent checks (SPEC §17) are written with: guarded latent arenas, the backend's op run
beside the reference's on twin arenas, and byte comparisons told in record coordinates.

A latent arena is the K/V arena's idea (case.py): ``GUARD`` seeded random bytes, the cache,
``GUARD`` bytes; the backend builds its cache over the middle, the reference runs the same op on a
copy, and the whole arena is compared, so a write anywhere it should not be shows. Every op's
inputs are cloned before the backend is called: the reference computes from the clones, and the
inputs must still equal them afterwards (an op does not modify its inputs). Probes past 2^31 bytes
use big_caches.py's lazily mapped memory on a CPU.
"""

from __future__ import annotations

import dataclasses

import torch
from kvconform.backends_under_test.contract import OpUnavailable
from kvconform.backends_under_test.latent_contract import LatentSpec

from kvconform import reference as R

from .applicability import NotApplicableHere, undeclared
from .assertions import SHOWN, ConformanceFailure, a_finding
from .big_caches import LIMIT, PAGE, lazy_zeros, touched_pages
from .case import GUARD, Case, random_bytes, storage_of_its_own

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)

OPS = {"write": ("latent_write", "indexer_write"), "gather": ("latent_gather", "indexer_gather")}


@dataclasses.dataclass
class LatentArena:
    buffer: torch.Tensor  # uint8: guard + cache + guard
    spec: LatentSpec
    cache: torch.Tensor | None = None  # the backend's view
    lazy: bool = False  # over an anonymous mapping (a probe): compared by the pages touched

    @property
    def region(self) -> torch.Tensor:
        return self.buffer[GUARD : GUARD + self.spec.geometry.nbytes()]

    def snapshot(self) -> LatentArena:
        """A CPU copy for the reference (a lazy probe arena gets a fresh lazy twin: see :func:`probe_twin`)."""
        if self.lazy:
            raise TypeError("a lazily mapped latent arena is not copied: use probe_twin()")
        return LatentArena(self.buffer.detach().cpu().clone(), self.spec)


@dataclasses.dataclass(frozen=True)
class LatentRows:
    """A write's inputs in the model dtype: ``kv_c [T, R]`` and ``k_pe [T, P]``; for the indexer
    ``kv_c`` is the key ``k [T, D]`` and ``k_pe`` is None."""

    kv_c: torch.Tensor
    k_pe: torch.Tensor | None

    def clone(self) -> LatentRows:
        return LatentRows(self.kv_c.clone(), None if self.k_pe is None else self.k_pe.clone())


# ----------------------------------------------------------------------------- specs and arenas
def declared_op(case: Case, fmt, verb: str) -> str:
    """The op that does ``verb`` (write, gather) on ``fmt``'s cache; not applicable when undeclared."""
    op = OPS[verb][fmt.kind == "indexer"]
    if op not in case.backend.capabilities.latent.ops:
        raise undeclared(case.backend, f"does not declare op '{op}' ({fmt.label()})")
    return op


def latent_spec(case: Case, fmt, *, num_blocks: int = 6, block_size: int | None = None, num_layers: int = 1, layer: int = 0) -> LatentSpec:
    """A small latent cache of ``fmt`` inside the backend's declaration (the first declared block size)."""
    block_size = block_size or case.block_size or case.backend.capabilities.latent.block_sizes[0]
    return LatentSpec(geometry=R.latent.LatentGeometry(num_blocks=num_blocks, block_size=block_size, fmt=fmt, num_layers=num_layers), layer=layer)


def allocate(case: Case, spec: LatentSpec, *, host: bool = False, seed_offset: int = 0, zero: bool = False) -> LatentArena:
    """A guarded arena, random-filled (or zeroed), with the backend's latent cache over its middle."""
    nbytes = spec.geometry.nbytes()
    if zero:
        data = torch.zeros(2 * GUARD + nbytes, dtype=torch.uint8)
    else:
        data = random_bytes(2 * GUARD + nbytes, torch.Generator().manual_seed(case.seed * 7919 + 31 + seed_offset))
    # A host cache is pinned where a GPU is (as vLLM's): a device kernel reaches it directly (UVA).
    arena = LatentArena((data.pin_memory() if torch.cuda.is_available() else data) if host else data.to(case.device), spec)
    case.facts.geometry = spec.geometry.short()
    arena.cache = case.backend.latent_allocate(storage_of_its_own(arena.region), spec)
    return arena


def slots_of(spec: LatentSpec, pairs) -> torch.Tensor:
    """Slot ids of ``(block, row)`` pairs (``None`` for a padding slot, -1)."""
    N = spec.geometry.block_size
    return torch.tensor([-1 if p is None else p[0] * N + p[1] for p in pairs], dtype=torch.int64)


# ----------------------------------------------------------------------------- inputs
def latent_rows(fmt, rows: int, seed: int, *, contiguous: bool = False, magnitude: float = 4.0) -> LatentRows:
    """Seeded inputs. Not contiguous by default: kv_c and k_pe are column slices of one projection
    output ``[T, R + P + 32]`` (row stride R + P + 32), as vLLM passes them; the indexer key a
    slice of a wider row likewise."""
    gen = torch.Generator().manual_seed(seed)
    width = fmt.kv_lora_rank + fmt.rope_dim
    projection = (torch.randn(rows, width + 32, generator=gen) * magnitude).to(fmt.model_dtype)
    kv_c = projection[:, 16 : 16 + fmt.kv_lora_rank]
    k_pe = projection[:, 16 + fmt.kv_lora_rank : 16 + width] if fmt.rope_dim else None
    if contiguous:
        kv_c, k_pe = kv_c.contiguous(), None if k_pe is None else k_pe.contiguous()
    return LatentRows(kv_c, k_pe if fmt.kind != "indexer" else None)


def edge_rows(fmt, rows: int, seed: int, *, scale: float = 1.0) -> LatentRows:
    """Rows whose quantised part holds fp8 edge values, differently in every 128-value tile (the
    ds_mla tile, the indexer's token group): ±0 and a tiny negative (→ −0), a tile of zeros (the
    scale floor), a tile whose amax is exactly the format's max times a power of two, exact ties
    between adjacent codes, values past the largest code (a per-tensor fp8 cache saturates), and
    subnormal ties. ``scale``: a plain fp8 cache's per-tensor scale (values are ``y · scale``)."""
    e4m3 = R.fp8.fp8_format(R.fp8.cache_dtype_for("fp8", fmt.model_dtype, fmt.platform, fmt.arch))
    codes = torch.arange(256, dtype=torch.uint8)
    grid = torch.sort(R.fp8.decode_codes(codes, e4m3)).values
    grid = grid[torch.isfinite(grid)]
    ties = (grid[1:] + grid[:-1]) / 2
    top = e4m3.max_finite
    base = latent_rows(fmt, rows, seed, contiguous=True, magnitude=1.0).kv_c.float()
    gen = torch.Generator().manual_seed(seed + 1)
    pool = torch.cat([grid, ties])
    values = pool[torch.randint(0, pool.numel(), base.shape, generator=gen)]
    tiles = values.view(rows, -1, min(128, base.shape[1]))
    tiles[:, 0, :4] = torch.tensor([0.0, -0.0, -1e-9, top])  # signed zeros, a tiny negative, the max
    if tiles.shape[1] > 1:
        tiles[:, 1] = 0.0  # a tile of zeros: the scale floor decides
    if tiles.shape[1] > 2:
        tiles[:, 2, 0] = -top * 4  # amax a power of two times max: a tile scale exactly 4
    if tiles.shape[1] > 3:
        tiles[:, 3, :8] = ties[ties > 0][:8]  # subnormal ties
    if fmt.kind == "mla":
        tiles[:, 0, 4:6] = torch.tensor([top * 1.5, -top * 8])  # past the largest code: saturates
    kv_c = (values * scale).to(fmt.model_dtype)
    k_pe = latent_rows(fmt, rows, seed, contiguous=True).k_pe
    return LatentRows(kv_c, k_pe)


# ----------------------------------------------------------------------------- ops on twin arenas
def reference_write(expected: LatentArena, rows: LatentRows, slot_mapping: torch.Tensor, scale: torch.Tensor | None) -> None:
    spec, region = expected.spec, expected.region
    g, fmt = spec.geometry, spec.fmt
    if fmt.kind == "indexer":
        R.latent.indexer_k_quant_and_cache(rows.kv_c, region, g, slot_mapping, layer=spec.layer)
    elif fmt.kind == "fp8_ds_mla":
        R.latent.concat_and_cache_ds_mla(rows.kv_c, rows.k_pe, region, g, slot_mapping, layer=spec.layer)
    else:
        R.latent.concat_and_cache_mla(rows.kv_c, rows.k_pe, region, g, slot_mapping, scale=scale, layer=spec.layer)


def backend_write(case: Case, arena: LatentArena, rows: LatentRows, slot_mapping: torch.Tensor, scale: torch.Tensor | None) -> None:
    dev, spec = case.device, arena.spec
    if spec.fmt.kind == "indexer":
        case.backend.indexer_write(arena.cache, rows.kv_c.to(dev), slot_mapping.to(dev), spec)
    else:
        case.backend.latent_write(arena.cache, rows.kv_c.to(dev), rows.k_pe.to(dev), slot_mapping.to(dev), spec,
                                  scale=None if scale is None else scale.to(dev, torch.float32))


def run_write(case: Case, arena: LatentArena, rows: LatentRows, slot_mapping: torch.Tensor, scale=None, *, expected: LatentArena | None = None) -> LatentArena:
    """The backend's writer into ``arena``; returns the reference's expected arena, computed from
    clones of the inputs taken before the backend ran. The inputs must be unchanged after it."""
    declared_op(case, arena.spec.fmt, "write")
    before = (rows.clone(), slot_mapping.clone(), None if scale is None else scale.clone())
    expected = expected or arena.snapshot()
    reference_write(expected, before[0], before[1], before[2])
    backend_write(case, arena, rows, slot_mapping, scale)
    synchronize(case)
    assert_inputs_unchanged("write", case, {"kv_c": (before[0].kv_c, rows.kv_c), "k_pe": (before[0].k_pe, rows.k_pe),
                                           "slot_mapping": (before[1], slot_mapping), "scale": (before[2], scale)})
    return expected


def write_and_compare(case: Case, prop: str, spec: LatentSpec, rows: LatentRows, slot_mapping, scale=None, note: str = "") -> LatentArena:
    """Backend write into a fresh random arena; the whole arena must equal the reference's."""
    arena = allocate(case, spec)
    initial = arena.snapshot()
    expected = run_write(case, arena, rows, slot_mapping, scale)
    assert_latent_bytes_equal(prop, case, expected, arena, note, initial=initial)
    return arena


def default_scale(fmt) -> torch.Tensor | None:
    """A plain fp8 cache's per-tensor scale (a power of two: ``x / scale`` stays exact); None otherwise."""
    return torch.tensor([0.5]) if fmt.kind == "mla" and fmt.cache_dtype != "auto" else (torch.ones(1) if fmt.kind == "mla" else None)


def filled(case: Case, spec: LatentSpec, seed: int, scale=None) -> tuple[LatentArena, LatentArena]:
    """An arena whose every slot of every layer holds a record the reference wrote (the backend's
    cache and a CPU twin): what the readers, copies and swaps act on."""
    arena = allocate(case, spec)
    twin = arena.snapshot()
    g = spec.geometry
    for layer in range(g.num_layers):
        rows = latent_rows(spec.fmt, g.num_blocks * g.block_size, seed + layer)
        reference_write(dataclasses.replace(twin, spec=dataclasses.replace(spec, layer=layer)), rows, torch.arange(g.num_blocks * g.block_size), scale)
    arena.buffer.copy_(twin.buffer.to(arena.buffer.device))
    return arena, twin


def inputs_of(case: Case, *tensors):
    """Device copies of a read's inputs and CPU clones taken before the backend sees them."""
    return [t.to(case.device) if t is not None else None for t in tensors], [t.clone() if t is not None else None for t in tensors]


def synchronize(case: Case) -> None:
    if case.device.startswith("cuda"):
        torch.cuda.synchronize()


def attempt(call) -> tuple[object, Exception | None]:
    """``(what call() returned, None)`` or ``(None, what it raised)``. A code path this machine
    lacks stays not applicable, and a finding or a not-applicable reason of the harness passes on."""
    try:
        return call(), None
    except (OpUnavailable, ConformanceFailure, NotApplicableHere):
        raise
    except Exception as exc:  # noqa: BLE001 - a refusal is the property some checks ask for
        return None, exc


# ----------------------------------------------------------------------------- assertions
def assert_inputs_unchanged(prop: str, case: Case, pairs: dict) -> None:
    """An op must not modify its inputs: each ``name: (clone before, tensor after)`` equal bit for bit."""
    for name, (before, after) in pairs.items():
        if before is None:
            continue
        got = after.detach().cpu()
        if before.shape != got.shape or not torch.equal(before.contiguous().view(torch.uint8), got.contiguous().view(torch.uint8)):
            index = (before != got).nonzero()
            where = f" first at index {index[0].tolist()}" if index.numel() and before.shape == got.shape else ""
            raise ConformanceFailure(f"{prop}: the op modified its input {name}{where} (an op must not change its inputs)\n  repro: {case.repro}",
                                     {"property": prop, "mismatches": [{"where": f"input {name}{where}"}]})


def _places(spec: LatentSpec, inner: list[int]) -> list[str]:
    """Logical coordinates of cache byte offsets (``R.latent.coordinates_of``), guards by distance."""
    nbytes = spec.geometry.nbytes()
    inside = [i for i in inner if 0 <= i < nbytes]
    coords = R.latent.coordinates_of(spec.geometry, torch.tensor(inside, dtype=torch.int64)) if inside else {}
    columns = {k: (v.tolist() if isinstance(v, torch.Tensor) else list(v)) for k, v in coords.items()}
    places, at = [], 0
    for i in inner:
        if i < 0:
            places.append(f"guard before cache ({-i} bytes before)")
        elif i >= nbytes:
            places.append(f"guard after cache (+{i - nbytes} bytes past the end)")
        else:
            places.append(" ".join(f"{k}={v[at]}" for k, v in columns.items()))
            at += 1
    return places


def _record_of(spec: LatentSpec, inner: torch.Tensor) -> torch.Tensor:
    """A (layer, block, row) key per cache byte offset, -1 for guard bytes (for 'first of each record')."""
    g = spec.geometry
    nbytes = g.nbytes()
    key = torch.full_like(inner, -1)
    inside = (inner >= 0) & (inner < nbytes)
    if bool(inside.any()):
        c = R.latent.coordinates_of(g, inner[inside])
        key[inside] = (c["layer"] * g.num_blocks + c["block"]) * g.block_size + c["row"]
    return key


def _findings(expected, actual, initial, differs: torch.Tensor, spec: LatentSpec) -> list[str]:
    """Why the differing bytes differ, in words: guard bytes, bytes left as they were though the
    op writes them, bytes changed where the op writes nothing, and whole records that hold
    another record's expected bytes."""
    found = []
    inner = differs - GUARD
    nbytes = spec.geometry.nbytes()
    guard = int(((inner < 0) | (inner >= nbytes)).sum())
    if guard:
        found.append(f"out-of-bounds: {guard} guard bytes around the cache changed")
    if initial is not None:
        # A random byte equals its initial value one time in 256: only a majority says what happened.
        never = int(((actual[differs] == initial[differs]) & (expected[differs] != initial[differs])).sum())
        stray = int(((expected[differs] == initial[differs]) & (actual[differs] != initial[differs])).sum())
        if 2 * never >= differs.numel():
            found.append(f"never-written: {never} of the differing bytes, which the op writes, still hold their initial bytes")
        if 2 * stray >= differs.numel():
            found.append(f"stray-write: {stray} of the differing bytes, which the op leaves alone, were changed")
    fmt = spec.fmt
    if fmt.kind != "indexer" and nbytes <= 1 << 24:  # per-token records: is a wrong record another one's?
        E = fmt.entry_bytes()
        want = expected[GUARD : GUARD + nbytes].view(-1, E)
        got = actual[GUARD : GUARD + nbytes].view(-1, E)
        wrong = torch.unique(inner[(inner >= 0) & (inner < nbytes)] // E)[:SHOWN]
        for r in wrong.tolist():
            same = (want == got[r]).all(dim=1).nonzero().flatten()
            same = same[same != r]
            if same.numel():
                here, there = _places(spec, [r * E])[0], _places(spec, [int(same[0]) * E])[0]
                found.append(f"moved: the record at {here.rsplit(' field', 1)[0]} holds the bytes expected at {there.rsplit(' field', 1)[0]}")
    return found


def assert_latent_bytes_equal(prop: str, case: Case, expected: LatentArena, actual: LatentArena, note: str = "", *,
                              initial: LatentArena | None = None, pages: torch.Tensor | None = None) -> None:
    """The whole latent arena (guards included) equals the reference's, byte for byte; ``pages``
    limits the comparison to those ``PAGE``-byte pages (lazily mapped probes: every other page is
    zero in both). A failure names the differing bytes by layer, block, row, field and byte."""
    want, got = expected.buffer.detach(), actual.buffer.detach()
    if pages is None:
        case.facts.compared(got)
        # Compared where the backend's arena lives (a GPU probe's gigabytes stay there); only a difference comes to the host.
        if torch.equal(want.to(got.device), got):
            return
        want, got = want.cpu(), got.cpu()
        differs = (want != got).nonzero().flatten()
    else:
        differs = _differing_in_pages(want, got, pages)
        if differs.numel() == 0:
            return
    spec = actual.spec
    start = initial.buffer if initial is not None else None
    inner = differs - GUARD
    key = _record_of(spec, inner[:4096])
    firsts = torch.unique(key, return_inverse=True)[1]
    order = torch.full((int(firsts.max()) + 1,), key.numel(), dtype=torch.int64).scatter_reduce(0, firsts, torch.arange(key.numel()), "amin")
    shown = differs[torch.sort(order).values[:SHOWN]]
    g = spec.geometry
    lines = [(f"{prop}: {differs.numel()} byte{'s differ' if differs.numel() != 1 else ' differs'} in {int(order.numel())}"
              f"{'+' if differs.numel() > 4096 else ''} record(s) (latent cache {g.short()}, {g.nbytes()} bytes + {GUARD}-byte guards)"
              f"{' — ' + note if note else ''}")]
    findings = _findings(want, got, start, differs, spec)
    if findings:
        lines += ["  where the wrong bytes came from:", *(f"    {f}" for f in findings)]
    lines.append("  first differing byte of each record (layer, block, row; field and byte in it):")
    mismatches = []
    for element, where in zip(shown.tolist(), _places(spec, (shown - GUARD).tolist())):
        mismatches.append({"where": where, "expected": f"{int(want[element]):02x}", "actual": f"{int(got[element]):02x}"})
        lines.append(f"  {where}: expected {mismatches[-1]['expected']}, actual {mismatches[-1]['actual']}")
    if differs.numel() > shown.numel():
        lines.append(f"  … {differs.numel() - shown.numel()} more bytes")
    lines += [f"  format {spec.fmt.label()}, geometry {g.short()}, layer {spec.layer}", f"  repro: {case.repro}"]
    raise ConformanceFailure("\n".join(lines), {"property": prop, "differing_elements": int(differs.numel()), "mismatches": mismatches,
                                                "diagnosis": [{"fault": f.split(":")[0], "what": f} for f in findings]})


def _differing_in_pages(want: torch.Tensor, got: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    found = []
    for page in pages.tolist():
        span = slice(page * PAGE, min((page + 1) * PAGE, want.numel()))
        if not torch.equal(want[span], got[span]):
            found.append((want[span] != got[span]).nonzero().flatten().add(span.start))
    return torch.cat(found) if found else torch.empty(0, dtype=torch.int64)


def assert_rows_equal(prop: str, case: Case, expected: torch.Tensor, actual: torch.Tensor, what: str, dims: tuple[str, ...]) -> None:
    """A reader's output equals the reference's bit for bit (shape, dtype, every byte); a failure
    names the first differing rows by ``dims`` with their expected and actual bytes."""
    got, expected = actual.detach().cpu(), expected.cpu()  # a probe's reference twin lives on the device
    if got.shape != expected.shape or got.dtype != expected.dtype:
        raise ConformanceFailure(f"{prop}: {what}: expected {tuple(expected.shape)} {expected.dtype}, actual {tuple(got.shape)} {got.dtype}\n  repro: {case.repro}",
                                 {"property": prop, "mismatches": [{"where": what, "expected": f"{tuple(expected.shape)} {expected.dtype}",
                                                                    "actual": f"{tuple(got.shape)} {got.dtype}"}]})
    e = expected.element_size()
    want_bytes, got_bytes = expected.contiguous().view(torch.uint8).view(*expected.shape[:-1], -1), got.contiguous().view(torch.uint8).view(*got.shape[:-1], -1)
    bad = (want_bytes != got_bytes).view(*expected.shape, e).any(dim=-1) if expected.dim() else torch.tensor(False)
    if not bool(bad.any()):
        return
    index = bad.nonzero()
    first_rows = torch.unique(index[:, :-1], dim=0, return_inverse=True)[1] if index.shape[1] > 1 else torch.zeros(index.shape[0], dtype=torch.int64)
    picked = [int((first_rows == r).nonzero()[0]) for r in range(min(SHOWN, int(first_rows.max()) + 1))]
    mismatches = []
    for i in picked:
        at = tuple(index[i].tolist())
        where = " ".join(f"{d}={v}" for d, v in zip(dims, at))
        w, a = expected[at].reshape(1).view(torch.uint8), got[at].reshape(1).view(torch.uint8)
        mismatches.append({"where": where, "expected": " ".join(f"{b:02x}" for b in w.tolist()), "actual": " ".join(f"{b:02x}" for b in a.tolist())})
    lines = [f"{prop}: {what}: {int(bad.sum())} of {bad.numel()} values differ; the first of each row:"]
    lines += [f"  {m['where']}: expected {m['expected']}, actual {m['actual']}" for m in mismatches]
    raise ConformanceFailure("\n".join(lines + [f"  repro: {case.repro}"]), {"property": prop, "differing_elements": int(bad.sum()), "mismatches": mismatches})


def assert_facts_equal(prop: str, case: Case, expected, actual, what: str) -> None:
    if expected != actual:
        raise ConformanceFailure(f"{prop}: {what}: expected {expected!r}, actual {actual!r}\n  repro: {case.repro}",
                                 {"property": prop, "mismatches": [{"where": what, "expected": repr(expected), "actual": repr(actual)}]})


# ----------------------------------------------------------------------------- probes past 2^31 bytes
def probe_spec(case: Case, fmt) -> LatentSpec:
    """The smallest declared cache of ``fmt`` whose last block starts past 2^31 bytes (its id past 2^16)."""
    block_size = min(case.backend.capabilities.latent.block_sizes)
    one = R.latent.LatentGeometry(num_blocks=1, block_size=block_size, fmt=fmt)
    return LatentSpec(geometry=dataclasses.replace(one, num_blocks=LIMIT // one.block_bytes() + 2))


def probe_arena(case: Case, spec: LatentSpec) -> LatentArena:
    """A probe's arena: lazily mapped zeros on a CPU (pages cost memory only when touched), zeros
    allocated in full on a GPU."""
    nbytes = 2 * GUARD + spec.geometry.nbytes()
    if case.device == "cpu":
        arena = LatentArena(lazy_zeros(nbytes), spec, lazy=True)
    else:
        torch.cuda.empty_cache()
        arena = LatentArena(torch.zeros(nbytes, dtype=torch.uint8, device=case.device), spec)
    case.facts.geometry = spec.geometry.short()
    arena.cache = case.backend.latent_allocate(storage_of_its_own(arena.region) if not arena.lazy else arena.region, spec)
    return arena


def probe_twin(arena: LatentArena) -> LatentArena:
    """The reference's twin of an untouched probe arena."""
    if arena.lazy:
        return LatentArena(lazy_zeros(arena.buffer.numel()), arena.spec, lazy=True)
    return LatentArena(arena.buffer.clone(), arena.spec)


def copy_records(src: LatentArena, dst: LatentArena, slot_mapping: torch.Tensor) -> None:
    """Put the records of these slots (layer ``src.spec.layer``) from ``src`` into ``dst`` — a
    probe's backend arena gets what the reference wrote into its twin without a copy of gigabytes."""
    spec = src.spec
    N = spec.geometry.block_size
    index = R.latent.record_offsets(spec.geometry, slot_mapping // N, slot_mapping % N, spec.layer).flatten()
    dst.region[index.to(dst.region.device)] = src.region[index].to(dst.region.device)


def assert_probe_equal(prop: str, case: Case, expected: LatentArena, actual: LatentArena, note: str) -> None:
    """A probe arena equals its twin: the pages either side touched (lazy), or every byte."""
    if not actual.lazy:
        assert_latent_bytes_equal(prop, case, expected, actual, note)
        return
    pages = torch.unique(torch.cat([touched_pages(expected.buffer), touched_pages(actual.buffer)]))
    assert_latent_bytes_equal(prop, case, expected, actual, note, pages=pages)
