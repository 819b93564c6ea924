"""What every file of golden digests (latent records, quantised caches) shares: the SHA-256 of a
cache region, one digest per label across the platforms that write it, and the JSON file kept
beside its module (a schema line, the inputs' header, the digests by label)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import torch

PLATFORMS = (("cuda", "sm90"), ("rocm", "gfx942"), ("rocm", "gfx950"))  # (platform, arch) each file's labels cover


def digest(region: torch.Tensor) -> str:
    return hashlib.sha256(region.detach().cpu().numpy().tobytes()).hexdigest()


def one_per_label(labelled: Iterable[tuple[str, str, str]]) -> dict[str, str]:
    """``(label, where, digest)`` rows → digest by label; a label whose bytes differ between two
    platforms (``where``) is an error: its label would not name its bytes."""
    digests: dict[str, str] = {}
    for label, where, value in labelled:
        if digests.setdefault(label, value) != value:
            raise AssertionError(f"{label} hashes differently on {where}: its label does not name its bytes")
    return dict(sorted(digests.items()))


def load(path: Path, schema: str) -> dict[str, str]:
    document = json.loads(path.read_text())
    if document.get("schema") != schema:
        raise ValueError(f"{path}: schema {document.get('schema')!r}, expected {schema}")
    return document["digests"]


def write(path: Path, schema: str, header: dict, digests: dict[str, str]) -> None:
    path.write_text(json.dumps({"schema": schema, **header, "digests": digests}, indent=1) + "\n")
