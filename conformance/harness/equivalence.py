"""Golden cases for cross-platform byte equivalence (SPEC §12 EQUIV-*).

Each case is a fixed geometry, dtype and seeded input, generated on the CPU (then moved), so
every platform writes the same logical KV. After a backend's write, the written blocks give:

- ``page``: SHA-256 of the blocks' raw bytes in the backend's own layout (equal across
  platforms only for the same layout and format);
- ``canonical``: SHA-256 of the blocks' canonical bytes (per block: per layer, K then V,
  ``[N][H][D]``) — equal for any two layouts holding the same KV.

The reference's digests are committed in ``golden_digests.json``; ``python -m
kvconform.conformance.harness.equivalence`` rewrites it (tests/ prove the committed file is current).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import sys

import torch

from kvconform import reference as R

GOLDEN_PATH = os.path.join(os.path.dirname(__file__), "golden_digests.json")
DIGEST_SCHEMA = "kvconform-digests/1"


@dataclasses.dataclass(frozen=True)
class GoldenCase:
    name: str
    kv_cache_dtype: str
    model_dtype: torch.dtype
    block_size: int
    num_kv_heads: int
    head_size: int
    num_blocks: int = 6
    tokens: int = 40
    seed: int = 20261129

    def geometry(self, cache_dtype: torch.dtype) -> R.Geometry:
        return R.Geometry(num_blocks=self.num_blocks, block_size=self.block_size, num_kv_heads=self.num_kv_heads, head_size=self.head_size, dtype=cache_dtype)


CASES = (
    GoldenCase("bf16-N16-H2-D64", "auto", torch.bfloat16, 16, 2, 64),
    GoldenCase("fp16-N16-H3-D128", "auto", torch.float16, 16, 3, 128),
    GoldenCase("fp8-N16-H2-D64", "fp8", torch.bfloat16, 16, 2, 64),
    GoldenCase("fp8_e5m2-N32-H1-D128", "fp8_e5m2", torch.float16, 32, 1, 128),
)
FP8_FORMATS = ("float8_e4m3fn", "float8_e4m3fnuz")


def scales(fp8_format: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v scales: powers of two, unequal; doubled for e4m3fnuz, as vLLM doubles checkpoint
    scales on gfx94x so that in-range codes match the e4m3fn ones (SPEC FP8-FORMAT, EQUIV-CROSS-MACHINE)."""
    factor = 2.0 if fp8_format == "float8_e4m3fnuz" else 1.0
    return torch.tensor([0.5 * factor]), torch.tensor([2.0 * factor])


def inputs(case: GoldenCase):
    """Key, value ``[T, H, D]`` and slot_mapping: seeded on the CPU, ids ≥ 2, some -1."""
    gen = torch.Generator().manual_seed(case.seed)
    key, value = (torch.randn(2, case.tokens, case.num_kv_heads, case.head_size, generator=gen) * 3).to(case.model_dtype).unbind(0)
    capacity = case.num_blocks * case.block_size
    slots = torch.randperm(capacity - 2 * case.block_size, generator=gen)[: case.tokens] + 2 * case.block_size
    slots[:: 7] = -1
    return key, value, slots


def written_blocks(case: GoldenCase) -> list[int]:
    _, _, slots = inputs(case)
    return sorted({int(s) // case.block_size for s in slots.tolist() if s >= 0})


def page_bytes(storage: torch.Tensor, layout: R.Layout, g: R.Geometry, blocks: list[int]) -> torch.Tensor:
    """The written blocks' raw bytes in physical order (each block's byte runs, blocks in id order)."""
    omap = R.offset_map(layout, g)
    runs = [run for b in blocks for run in R.block_byte_runs(omap, g.element_size, 0, b)]
    raw = storage.view(torch.uint8).cpu()
    return torch.cat([raw[start:end] for start, end in runs])


def sha(data: torch.Tensor) -> str:
    return hashlib.sha256(data.contiguous().numpy().tobytes()).hexdigest()


def digest_record(storage, layout: R.Layout, case: GoldenCase, g: R.Geometry, fp8_format: str | None) -> dict:
    """What one backend's write produced for one case (hashes plus canonical bytes for conversions)."""
    blocks = written_blocks(case)
    canonical = R.canonical_block_bytes(storage.cpu(), layout, g, blocks)
    return {
        "case": case.name, "layout": f"{layout.era}:{layout.alias}", "layout_shape": layout.name, "era": layout.era,
        "dtype": str(g.dtype).removeprefix("torch."), "kv_cache_dtype": case.kv_cache_dtype, "fp8_format": fp8_format,
        "geometry": g.short(), "k_scale": float(scales(fp8_format)[0]), "v_scale": float(scales(fp8_format)[1]),
        "page": sha(page_bytes(storage, layout, g, blocks)), "canonical": sha(canonical),
        "canonical_b64": base64.b64encode(canonical.numpy().tobytes()).decode() if fp8_format else None,
    }


def reference_digests() -> dict:
    """Digests the reference produces for every case, fp8 format and named layout."""
    out = {"schema": DIGEST_SCHEMA, "cases": {}}
    for case in CASES:
        formats = FP8_FORMATS if case.kv_cache_dtype == "fp8" else (None,)
        for fmt in formats:
            dtype = R.fp8.cache_dtype_for(case.kv_cache_dtype, case.model_dtype, "rocm" if fmt == "float8_e4m3fnuz" else "cuda", "gfx942" if fmt == "float8_e4m3fnuz" else "sm90")
            g = case.geometry(dtype)
            key, value, slots = inputs(case)
            entry = {"canonical": None, "pages": {}}
            for name, layout in R.named_layouts().items():
                try:
                    layout.validate(g)
                except ValueError:
                    continue
                storage = torch.zeros(layout.nbytes(g), dtype=torch.uint8)
                k_scale, v_scale = scales(fmt)
                R.reshape_and_cache(key, value, storage, layout, g, slots, k_scale=k_scale, v_scale=v_scale)
                record = digest_record(storage, layout, case, g, fmt)
                entry["canonical"] = record["canonical"]
                entry["pages"][name] = record["page"]
            out["cases"][f"{case.name}@{fmt}" if fmt else case.name] = entry
    return out


def golden_key(case: GoldenCase, fp8_format: str | None) -> str:
    return f"{case.name}@{fp8_format}" if case.kv_cache_dtype == "fp8" else case.name


def load_golden() -> dict:
    with open(GOLDEN_PATH, encoding="utf-8") as fh:
        return json.load(fh)


if __name__ == "__main__":
    with open(GOLDEN_PATH, "w", encoding="utf-8") as fh:
        json.dump(reference_digests(), fh, indent=1, sort_keys=True)
        fh.write("\n")
    print(f"wrote {GOLDEN_PATH}", file=sys.stderr)
