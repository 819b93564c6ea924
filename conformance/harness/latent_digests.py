"""Golden digests of latent records (SPEC §17, equivalence): fixed inputs written into a zeroed cache
of each record format, as the reference wrote them when the file was made. A backend's bytes must
hash the same on every machine: the format's label names its fp8 variant (``-fnuz`` on gfx942,
which also divides by 224), so one digest holds for every platform that writes that label.

``latent_digests.json`` is kept beside this module; :func:`regenerate` writes it (run it only when
the spec itself changes, and say why in the commit).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvconform import reference as R

from . import golden_digest_files as files
from .golden_digest_files import PLATFORMS, digest
from .latent import LatentArena, default_scale, latent_rows, reference_write

SCHEMA = "kvconform-latent-digests/1"
PATH = Path(__file__).with_name("latent_digests.json")
BLOCKS, BLOCK_SIZE, SEED = 4, 16, 20261204


def golden_inputs(fmt):
    """(rows, slot mapping) of the golden write: 2N - 3 tokens scattered over all blocks, one -1."""
    tokens = 2 * BLOCK_SIZE - 3
    slots = (torch.arange(tokens) * 7) % (BLOCKS * BLOCK_SIZE)
    slots[5] = -1
    return latent_rows(fmt, tokens, SEED, contiguous=True), slots


def golden_geometry(fmt) -> R.latent.LatentGeometry:
    return R.latent.LatentGeometry(num_blocks=BLOCKS, block_size=BLOCK_SIZE, fmt=fmt)


def reference_bytes(fmt) -> torch.Tensor:
    """The reference's golden cache of ``fmt`` (a zeroed cache, then the golden write)."""
    from kvconform.backends_under_test.latent_contract import LatentSpec

    spec = LatentSpec(geometry=golden_geometry(fmt))
    arena = LatentArena(torch.zeros(spec.geometry.nbytes() + 512, dtype=torch.uint8), spec)
    rows, slots = golden_inputs(fmt)
    reference_write(arena, rows, slots, default_scale(fmt))
    return arena.region


def load() -> dict[str, str]:
    return files.load(PATH, SCHEMA)


def reference_digests() -> dict[str, str]:
    """The digest of every format reference_mla declares on each platform of ``PLATFORMS``."""
    from kvconform.backends_under_test.reference_mla import latent_formats

    return files.one_per_label((fmt.label(), f"{platform}/{arch}", digest(reference_bytes(fmt)))
                               for platform, arch in PLATFORMS for fmt in latent_formats(platform, arch))


def regenerate() -> dict[str, str]:
    """Write :func:`reference_digests` to the file."""
    digests = reference_digests()
    files.write(PATH, SCHEMA, {"geometry": f"B{BLOCKS} N{BLOCK_SIZE}", "seed": SEED}, digests)
    return digests
