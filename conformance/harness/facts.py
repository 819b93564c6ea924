"""What one test found out while it ran, for its record.

A :class:`TestFacts` belongs to one test (the ``case`` fixture holds it). The harness fills it
with plain calls as the test runs — the caches it built, the addresses and values its ops
touched (exercised.py), a digest, an interop row, the cases this machine could not run — and
the plugin reads it once, when the test's verdict is made. Nothing here decides an outcome.
:class:`UnavailableSpecs` keeps which specs of the test this machine cannot run (examples.py).
"""

from __future__ import annotations

import dataclasses
import hashlib

from kvconform.backends_under_test.contract import CacheSpec, OpUnavailable
from kvconform.reports.coverage import geometry_classes

from .applicability import unavailable_again, unavailable_for_every_candidate


COMPARED_HASHED = 1 << 22  # bytes of one compared arena that enter the result digest


@dataclasses.dataclass
class TestFacts:
    __test__ = False  # not a pytest test class

    layout: str | None = None  # of the last cache built
    geometry: str | None = None
    kv_cache_dtype: str | None = None
    model_dtype: str | None = None
    exercised: list[dict] = dataclasses.field(default_factory=list)  # one entry per cache built (exercised.py)
    digest: dict | None = None  # equivalence: the golden case's digests
    interop: dict | None = None  # connector: one producer row of the interop table
    examples_not_applicable: dict[str, int] = dataclasses.field(default_factory=dict)  # reason -> cases that could not run here
    block_sizes: list[int] | None = None  # a fixed check run at several block sizes: those that ran
    compared_sha256: str | None = None  # the bytes the test compared with the reference, hashed in order (result digest)

    def built(self, spec: CacheSpec) -> None:
        """The test built a cache of ``spec``: one more ``exercised`` entry, and the cache its record names."""
        g = spec.geometry
        self.layout, self.geometry, self.kv_cache_dtype, self.model_dtype = str(spec.layout), g.short(), spec.kv_cache_dtype, str(spec.model_dtype)
        self.exercised.append({
            "kv_cache_dtype": spec.kv_cache_dtype, "dtype": str(g.dtype).removeprefix("torch."), "model_dtype": str(spec.model_dtype).removeprefix("torch."),
            "layout": str(spec.layout), "geometry": g.short(),
            "sizes": geometry_classes(num_layers=g.num_layers, block_size=g.block_size, num_kv_heads=g.num_kv_heads, head_size=g.head_size),
            "values": [],  # fp8 value classes the writes put in (exercised.note_write)
        })

    def compared(self, arena_bytes) -> None:
        """The test compares these bytes (a uint8 arena) with the reference's: they enter the
        result digest a receiver's rerun must reproduce. Arenas past COMPARED_HASHED bytes (the
        2^31 probes) enter by size only: hashing gigabytes would cost more than the check."""
        digest = hashlib.sha256((self.compared_sha256 or "").encode())
        digest.update(arena_bytes.detach().cpu().numpy().tobytes() if arena_bytes.numel() <= COMPARED_HASHED else str(arena_bytes.numel()).encode())
        self.compared_sha256 = digest.hexdigest()

    def count_unavailable(self, reason: str) -> None:
        self.examples_not_applicable[reason] = self.examples_not_applicable.get(reason, 0) + 1

    def as_record_fields(self) -> dict:
        """The record's fields these facts fill (empty collections as null)."""
        facts = dataclasses.asdict(self)
        return {name: value if value or value == 0 else None for name, value in facts.items()}


def spec_key(layout, model_dtype, kv_cache_dtype, geometry) -> tuple:
    """What decides the backend's code path for one example (not the block count or data)."""
    g = geometry
    return (str(layout), str(model_dtype), kv_cache_dtype, g.block_size, g.num_kv_heads, g.head_size, str(g.dtype))


def key_of(spec) -> tuple:
    return spec_key(spec.layout, spec.model_dtype, spec.kv_cache_dtype, spec.geometry)


@dataclasses.dataclass
class UnavailableSpecs:
    """The specs of one test this machine cannot run, and the spec the current example runs."""

    reasons: dict = dataclasses.field(default_factory=dict)  # spec key -> the OpUnavailable it raised
    current: tuple | None = None  # the key of the spec the running example allocated last

    def start(self, spec) -> None:
        """An example allocates ``spec``: remember it; stop here if it is known unavailable."""
        self.current = key_of(spec)
        known = self.reasons.get(self.current)
        if known is not None:
            raise unavailable_again(known)

    def every_candidate(self, candidates: set[tuple]) -> OpUnavailable | None:
        """One ``OpUnavailable`` for the test once every spec it can draw is known unavailable."""
        if not candidates or not candidates <= set(self.reasons):
            return None
        return unavailable_for_every_candidate([self.reasons[k] for k in candidates])
