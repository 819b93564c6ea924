"""What every check needs: guarded cache arenas, the per-test case, and exact input data.

An *arena* is one uint8 buffer: ``GUARD`` bytes, the cache, ``GUARD`` bytes, all filled with
seeded random bytes. The backend builds its cache over the middle (a storage of exactly the
cache's size: the guards are memory around it, not part of it); the reference applies
the same op to a copy; the checks compare the whole arena, so a write anywhere it should
not be — another slot, block or plane, padding, or past either end — is caught.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import Backend, CacheSpec

from .facts import TestFacts, UnavailableSpecs

GUARD = 256  # bytes before and after every cache; a multiple of every element size
FP8_KV_CACHE_DTYPES = R.fp8.KV_CACHE_DTYPES
HUGE_BYTES = 1 << 30  # arenas past this are filled on the device, not copied from the host


@dataclasses.dataclass
class Arena:
    buffer: torch.Tensor  # uint8, guard + cache + guard
    spec: CacheSpec
    cache: torch.Tensor | None = None  # the backend's view

    @property
    def region(self) -> torch.Tensor:
        """The cache bytes (no guards), as the reference sees them."""
        return self.buffer[GUARD : GUARD + self.spec.layout.nbytes(self.spec.geometry)]

    def strided(self, shape, strides, element_offset: int = 0) -> torch.Tensor:
        """A view of the cache region as integers of the cache element size, like a tensor view."""
        bits = self.region.view(R.bits_dtype(self.spec.geometry.dtype))
        return bits.as_strided(shape, strides, bits.storage_offset() + element_offset)

    def snapshot(self, on_device: bool = False) -> "Arena":
        """A copy for the reference to operate on (on the CPU unless ``on_device``)."""
        buffer = self.buffer.detach()
        return Arena(buffer.clone() if on_device else buffer.cpu().clone(), self.spec)


@dataclasses.dataclass
class Case:
    """One test's backend, layout, device, seed, how to reproduce it, and what it found out."""

    backend: Backend
    layout: R.Layout | None
    device: str
    seed: int
    standard: str
    test_id: str  # conformance/<file>::<name>, the same however the suite was started
    repro: str  # a shell line that re-runs this one test with this run's options
    facts: TestFacts = dataclasses.field(default_factory=TestFacts)  # what the test built and touched, for its record
    huge: bool = False  # --kvc-huge: probe caches past 2^31 elements fully allocated (random-filled on a GPU)
    devices: tuple[str, ...] = ()  # --kvc-devices: where the checks between devices put their ranks (harness/placement.py)
    backend_spec: str = ""  # what --kvc-backend said: a process of its own loads the backend by it (harness/device_transfer.py)
    block_size: int | None = None  # a fixed check run at one of several block sizes (examples.py)
    unavailable: UnavailableSpecs = dataclasses.field(default_factory=UnavailableSpecs)  # specs this machine cannot run (examples.py)
    # strategies.geometry_choices per kv_cache_dtypes: asked once per example drawn; not copied by replace()
    geometry_memo: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __repr__(self) -> str:  # stable across runs: reports must not differ by object addresses
        return f"Case(backend={self.backend.name!r}, layout={str(self.layout)!r}, device={self.device!r}, seed={self.seed})"

    def _repr_pretty_(self, printer, cycle) -> None:
        # Hypothesis prints a failing example's arguments with this (else every field, ~50 lines
        # of facts); the failure message above it already names the case and its repro.
        printer.text(repr(self))

    def spec(self, g: R.Geometry, kv_cache_dtype: str | None = None, model_dtype=None, layout=None, layer: int = 0) -> CacheSpec:
        """The spec of one case; pure (what a test built is noted when it allocates).

        Dtypes not given follow ``g.dtype``: an fp8 storage dtype means the first declared fp8
        ``kv_cache_dtype`` that stores it (model dtype: the first declared), any other ``auto``.
        """
        caps = self.backend.capabilities
        if kv_cache_dtype is None:
            fp8 = [k for k in caps.kv_cache_dtypes if k in FP8_KV_CACHE_DTYPES and self.backend.cache_dtype(k, caps.dtypes[0]) == g.dtype]
            kv_cache_dtype = fp8[0] if g.dtype in R.fp8.FP8_DTYPES and fp8 else "auto"
        if model_dtype is None:
            model_dtype = g.dtype if kv_cache_dtype == "auto" else caps.dtypes[0]
        return CacheSpec(layout=layout or self.layout, geometry=g, kv_cache_dtype=kv_cache_dtype, model_dtype=model_dtype, layer=layer)

    def built(self, spec: CacheSpec) -> None:
        """The test builds a cache of ``spec``: noted in its facts; a spec this machine is known
        not to run stops the example here (after all its draws: generation never depends on it)."""
        self.unavailable.start(spec)
        self.facts.built(spec)

    def spec_for(self, cache_dtype, **geometry) -> CacheSpec:
        """The spec of a case of one declared cache dtype (a ``cache_dtype`` sweep value)."""
        g = self.geometry(kv_cache_dtype=cache_dtype.kv_cache_dtype, model_dtype=cache_dtype.model_dtype, **geometry)
        return self.spec(g, cache_dtype.kv_cache_dtype, cache_dtype.model_dtype)

    def geometry(self, *, kv_cache_dtype=None, model_dtype=None, num_blocks=6, block_size=None, num_kv_heads=None, head_size=None, num_layers=1) -> R.Geometry:
        """A small geometry inside the backend's capabilities, N, H, D pairwise distinct when
        possible; dtypes default to declared ones (``auto``, else the first kv_cache_dtype; the
        first model dtype)."""
        caps = self.backend.capabilities
        kv_cache_dtype = kv_cache_dtype or ("auto" if "auto" in caps.kv_cache_dtypes else caps.kv_cache_dtypes[0])
        model_dtype = model_dtype or caps.dtypes[0]
        block_size = block_size or self.block_size or caps.block_sizes[0]
        head_size = head_size or next((d for d in caps.head_sizes if d != block_size), caps.head_sizes[0])
        heads = [h for h in caps.num_kv_heads if h not in (block_size, head_size)] or list(caps.num_kv_heads)
        return R.Geometry(
            num_blocks=num_blocks, block_size=block_size, num_kv_heads=num_kv_heads or max(heads),
            head_size=head_size, dtype=self.backend.cache_dtype(kv_cache_dtype, model_dtype), num_layers=num_layers,
        )

    def allocate(self, spec: CacheSpec, *, host: bool = False, seed_offset: int = 0, zero: bool = False) -> Arena:
        """A guarded, random-filled (or zeroed) arena with the backend's cache built over its middle."""
        self.built(spec)
        nbytes = spec.layout.nbytes(spec.geometry)
        pin = host and torch.cuda.is_available()
        if zero or nbytes > HUGE_BYTES and self.device == "cpu":
            # fully allocated where it lives, never copied (lazily mapped arenas: big_caches.py)
            buffer = torch.zeros(2 * GUARD + nbytes, dtype=torch.uint8, device="cpu" if host else self.device, pin_memory=pin)
        else:
            fill_device = self.device if nbytes > HUGE_BYTES and not host else "cpu"
            gen = torch.Generator(fill_device).manual_seed(self.seed * 7919 + seed_offset)
            data = random_bytes(2 * GUARD + nbytes, gen, fill_device)
            buffer = (data.pin_memory() if pin else data) if host else data.to(self.device)
        arena = Arena(buffer, spec)
        arena.cache = self.backend.allocate(storage_of_its_own(arena.region), spec)
        return arena


def random_bytes(n: int, generator: torch.Generator, device=None) -> torch.Tensor:
    """``n`` seeded random bytes, drawn eight at a time: an int64 draw costs what a byte draw
    costs (a MiB: 0.5 ms instead of 2.9 ms on the CI machine's CPU)."""
    words = torch.randint(-(1 << 63), (1 << 63) - 1, (-(-n // 8),), dtype=torch.int64, generator=generator, device=device)
    data = words.view(torch.uint8)
    return data if data.numel() == n else data[:n].clone()  # a tensor whose storage is its n bytes


def storage_of_its_own(region: torch.Tensor) -> torch.Tensor:
    """``region`` as a tensor whose storage is exactly the cache: the guard bytes around it stay
    in memory (and in every comparison) but outside the storage the backend sees, so code that
    picks a path from ``untyped_storage().nbytes()`` (vLLM's whole-storage block copy) takes the
    path a worker's exact-size allocation takes. DLPack shares the memory without copying; on a
    device DLPack has no code for (a PrivateUse1 backend's) the region is handed over as it is, a
    view whose storage is the whole guarded buffer (its guard bytes are still compared)."""
    try:
        return torch.from_dlpack(region)
    except ValueError as exc:  # "Unknown device type … for Dlpack"
        if "Dlpack" not in str(exc):
            raise
        return region


def fixed_scales() -> tuple[torch.Tensor, torch.Tensor]:
    """``(k_scale, v_scale)`` of the fixed fp8 checks: powers of two, so ``x / scale`` is exact and
    the expected codes are exact, and unequal and not reciprocal, so each scale fault gives codes of
    its own — V quantised with k_scale (``x / 0.5``) is not V quantised as ``x · v_scale``
    (``x · 4``), which 0.5 and 2.0 made identical (#38 item 4; tests/test_fixed_scales.py)."""
    return torch.tensor([0.5]), torch.tensor([4.0])


def token_rows(spec: CacheSpec, rows: int, seed: int, *, contiguous: bool = False, magnitude: float = 4.0):
    """Key and value ``[rows, H, D]`` in the model dtype.

    Non-contiguous by default: the K and V rows of one ``qkv [rows, 3, H, D]`` tensor, as
    vLLM feeds them (row stride ``3·H·D``).
    """
    g = spec.geometry
    gen = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(rows, 3, g.num_kv_heads, g.head_size, generator=gen) * magnitude).to(spec.model_dtype)
    key, value = qkv[:, 1], qkv[:, 2]
    if contiguous:
        key, value = key.contiguous(), value.contiguous()
    return key, value


def fp8_edge_rows(spec: CacheSpec, rows: int, seed: int, k_scale: float, v_scale: float):
    """Rows of fp8 edge values ``y`` (the scaled value ``x / scale`` the encoder rounds), every
    class in every side: ±0, a tiny negative (rounds to −0), ±NaN, ±max, beyond max (1.5·max,
    −8·max, ±inf), exact ties between adjacent codes (subnormal, normal, near max); the rest
    seeded picks of those and of the format's grid. ``x = y · scale`` is exact in the model
    dtype for ties and the grid when ``scale`` is a power of two."""
    fmt = R.fp8.fp8_format(spec.geometry.dtype)
    codes = torch.arange(256, dtype=torch.uint8)
    grid = torch.sort(R.fp8.decode_codes(codes, fmt)).values
    grid = grid[torch.isfinite(grid)]
    ties = (grid[1:] + grid[:-1]) / 2
    positive_ties = ties[ties > 0]
    top, inf, nan = fmt.max_finite, float("inf"), float("nan")
    specials = torch.tensor([-0.0, 0.0, -1e-9, nan, -nan, top, -top, top * 1.5, -top * 8, inf, -inf,
                             positive_ties[0], positive_ties[positive_ties.numel() // 2], -positive_ties[-1]])
    pool = torch.cat([specials, ties, grid])
    gen = torch.Generator().manual_seed(seed)
    g = spec.geometry
    values = pool[torch.randint(0, pool.numel(), (2, rows, g.num_kv_heads, g.head_size), generator=gen)]
    values.view(2, -1)[:, : specials.numel()] = specials
    key = (values[0] * k_scale).to(spec.model_dtype)
    value = (values[1] * v_scale).to(spec.model_dtype)
    return key, value


def block_ids(g: R.Geometry, count: int, seed: int, *, minimum: int = 2) -> torch.Tensor:
    """``count`` distinct block ids ≥ ``minimum`` in a seeded random order."""
    gen = torch.Generator().manual_seed(seed)
    pool = torch.arange(minimum, g.num_blocks)
    return pool[torch.randperm(pool.numel(), generator=gen)][:count]
