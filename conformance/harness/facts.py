"""What one test found out while it ran, for its record.

A :class:`TestFacts` belongs to one test (the ``case`` fixture holds it). The harness fills it
with plain calls as the test runs — the caches it built, the addresses and values its ops
touched (exercised.py), a digest, an interop row, the cases this machine could not run — and
the plugin reads it once, when the test's verdict is made. Nothing here decides an outcome.
"""

from __future__ import annotations

import dataclasses


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

    def count_unavailable(self, reason: str) -> None:
        self.examples_not_applicable[reason] = self.examples_not_applicable.get(reason, 0) + 1

    def as_record_fields(self) -> dict:
        """The record's fields these facts fill (empty collections as null)."""
        facts = dataclasses.asdict(self)
        return {name: value if value or value == 0 else None for name, value in facts.items()}
