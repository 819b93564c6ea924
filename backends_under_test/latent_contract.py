"""The latent-cache part of the backend contract (SPEC §17): MLA, ``fp8_ds_mla`` and the sparse
indexer cache.

A latent cache is one record per token, no K/V planes, so it does not fit ``CacheSpec`` (a K/V
``Layout`` and ``Geometry``): a backend declares the record formats it keeps
(:class:`LatentCapabilities`, ``Capabilities.latent``) and every latent op receives the
:class:`LatentSpec` the cache was allocated with. The formats, geometry and address formulas are
the reference's (``kvconform.reference.latent``); this module only names what a backend declares.
"""

from __future__ import annotations

import dataclasses
import typing

if typing.TYPE_CHECKING:
    from kvconform.reference.latent import LatentFormat, LatentGeometry

# What a latent backend may declare: its writers (the grouped multi-layer one too), gathers and decode, block copies and swaps, and
# for a connector the byte regions of whole blocks and the TP transfer plan of a replicated cache.
LATENT_OPS = frozenset({"latent_write", "latent_grouped_write", "latent_gather", "latent_decode", "latent_copy", "latent_swap",
                        "indexer_write", "indexer_gather", "latent_regions", "latent_plan"})
LATENT_KINDS = ("mla", "fp8_ds_mla", "indexer")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentCapabilities:
    """The latent caches a backend keeps; the suite generates latent cases only inside these sets.

    ``formats``: each record format with the backend's platform filled in (its fp8 variant and
    scale policy follow from it); ``num_layers``: layers per allocation the ops accept (a
    multi-layer allocation puts the layer dim first); ``padding_slots``: the writers skip slot -1.
    """

    formats: tuple[LatentFormat, ...]
    ops: frozenset[str]
    block_sizes: tuple[int, ...] = (16, 64)
    num_layers: tuple[int, ...] = (1,)
    padding_slots: bool = True

    def __post_init__(self):
        unknown = set(self.ops) - LATENT_OPS
        if unknown:
            raise ValueError(f"LatentCapabilities.ops: unknown ops {sorted(unknown)}; expected a subset of {sorted(LATENT_OPS)}")
        if not self.formats:
            raise ValueError("LatentCapabilities.formats: declare at least one record format")
        kinds = [getattr(fmt, "kind", None) for fmt in self.formats]
        if set(kinds) - set(LATENT_KINDS):
            raise ValueError(f"LatentCapabilities.formats: kinds {kinds}; expected each of {LATENT_KINDS}")
        if not self.block_sizes or min(self.block_sizes) < 1 or not self.num_layers or min(self.num_layers) < 1:
            raise ValueError(f"LatentCapabilities: block_sizes {self.block_sizes} and num_layers {self.num_layers} must be positive")
        from kvconform.reference import latent

        for fmt in self.formats:  # a record the reference cannot lay out is refused here, at declaration, not at run time
            for block_size in self.block_sizes:
                latent.LatentGeometry(num_blocks=1, block_size=block_size, fmt=fmt).nbytes()


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentSpec:
    """One latent cache: its geometry (record format included) and the layer per-layer ops act on."""

    geometry: LatentGeometry
    layer: int = 0

    @property
    def fmt(self) -> LatentFormat:
        return self.geometry.fmt
