"""Golden digests of quantised caches (SPEC §16, §16.1, EQUIV-CROSS-MACHINE): fixed inputs written
into a zeroed cache of each mode and order, as the reference wrote them when the file was made. A
backend's written pages must hash the same on every machine: the label names the order and, for
``fp8_per_token_head``, the platform's e4m3 variant (``-fnuz`` on gfx942, whose bound is 224), for
nvfp4 with linear V scales ``-linear_v`` (NVFP4-SCALE-PLACEMENT), so one digest holds for every
platform that writes that label.

The inputs are exact: every row's (nvfp4: every group's) largest magnitude is the mode's bound
times a power of two and every value is a code of the mode times that power, so scale, reciprocal
and codes are exact in float32 and in bf16 — an approximate division on a device cannot move a
byte. The write fills every slot of blocks 2-4 (padding rows between), and the digest covers
those pages only: PTH-SCALE-INIT lets a first use leave other slots' scales 1.0 or as allocated.

``quant_digests.json`` is kept beside this module; :func:`regenerate` writes it (run it only when
the spec itself changes, and say why in the commit).
"""

from __future__ import annotations

from pathlib import Path

import torch

from kvconform.backends_under_test.quant_contract import QuantSpec
from kvconform.reference import fp8
from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import golden_digest_files as files
from .golden_digest_files import PLATFORMS, digest
from .quant import VARIANTS

SCHEMA = "kvconform-quant-digests/1"
PATH = Path(__file__).with_name("quant_digests.json")
BLOCKS, BLOCK_SIZE, HEADS, HEAD_SIZE, SEED = 5, 16, 2, 64, 20261204
WRITTEN = range(2, BLOCKS)  # block ids >= 2: a writer that drops the block id lands in block 0
CHECKPOINT_SCALES = (1.0, 0.5)  # k_scale, v_scale: nvfp4's global scales 1 and 2, exact
BOUNDS = {"int8_per_token_head": 127.0, "fp8_per_token_head": 448.0, QL.NVFP4: 6.0}  # fnuz's 224 halves the fp8 scale: still exact


def label(mode: str, order: str, platform: str = "cpu", arch: str = "", v_scales: str = QL.SWIZZLED) -> str:
    fnuz = mode == "fp8_per_token_head" and fp8.platform_e4m3(platform, arch).dtype == torch.float8_e4m3fnuz
    return f"{mode}:{order}" + ("-fnuz" if fnuz else "") + ("" if v_scales == QL.SWIZZLED else f"-{v_scales}_v")


def golden_spec(mode: str, order: str, v_scales: str = QL.SWIZZLED) -> QuantSpec:
    g = QL.QuantGeometry(num_blocks=BLOCKS, block_size=BLOCK_SIZE, num_kv_heads=HEADS, head_size=HEAD_SIZE, mode=mode, order=order,
                         v_scales=v_scales)
    return QuantSpec(geometry=g, k_scale=CHECKPOINT_SCALES[0], v_scale=CHECKPOINT_SCALES[1])


def grid_values(mode: str, shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """Values the mode encodes exactly at scale 1, the row's (nvfp4: the group's) first one ±bound."""
    if mode == "int8_per_token_head":
        values = torch.randint(-127, 128, shape, generator=gen).float()
    elif mode == "fp8_per_token_head":
        codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
        values = torch.where((codes & 0x7F) == 0x7F, 0, codes).view(torch.float8_e4m3fn).float()  # no NaN
    else:
        values = QC.e2m1_values(torch.randint(0, 16, shape, generator=gen))
    values = values.unflatten(-1, (-1, QL.NVFP4_GROUP)) if mode == QL.NVFP4 else values[..., None, :]
    sign = torch.randint(0, 2, values.shape[:-1], generator=gen) * 2 - 1
    values[..., 0] = sign * BOUNDS[mode]
    return values.flatten(-2)


def golden_inputs(mode: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(key, value ``[T, H, D]`` bf16, slot mapping): every slot of blocks 2-4 once, scrambled, two -1."""
    gen = torch.Generator().manual_seed(SEED)
    slots = BLOCK_SIZE * WRITTEN.start + (torch.arange(len(WRITTEN) * BLOCK_SIZE) * 7) % (len(WRITTEN) * BLOCK_SIZE)
    slots = torch.cat([slots[:5], torch.tensor([-1]), slots[5:], torch.tensor([-1])])
    rows = []
    for _ in ("key", "value"):
        values = grid_values(mode, (len(slots), HEADS, HEAD_SIZE), gen)
        per = values.unflatten(-1, (-1, QL.NVFP4_GROUP)) if mode == QL.NVFP4 else values[..., None, :]
        powers = 2.0 ** torch.randint(-4, 3, per.shape[:-1], generator=gen).float()
        rows.append((per * powers[..., None]).flatten(-2).to(torch.bfloat16))
    return rows[0], rows[1], slots


def written_pages(region: torch.Tensor, g: QL.QuantGeometry) -> torch.Tensor:
    """The bytes of the golden write's pages (blocks 2-4 of layer 0), one contiguous run."""
    return region[WRITTEN.start * g.page_bytes : WRITTEN.stop * g.page_bytes]


def reference_bytes(mode: str, order: str, platform: str = "cpu", arch: str = "", v_scales: str = QL.SWIZZLED) -> torch.Tensor:
    """The reference's golden cache (a zeroed cache, then the golden write) on this platform."""
    spec = golden_spec(mode, order, v_scales)
    region = torch.zeros(spec.geometry.nbytes(), dtype=torch.uint8)
    key, value, slots = golden_inputs(mode)
    QC.write(key, value, region, spec.geometry, slots, platform=platform, arch=arch, k_scale=spec.k_scale, v_scale=spec.v_scale)
    return region


def reference_digests() -> dict[str, str]:
    """The digest of every mode (nvfp4: both V-scale placements) and order on each platform of ``PLATFORMS``."""
    return files.one_per_label((label(mode, order, platform, arch, v_scales), f"{platform}/{arch}",
                                digest(written_pages(reference_bytes(mode, order, platform, arch, v_scales), golden_spec(mode, order).geometry)))
                               for platform, arch in PLATFORMS for mode, v_scales in VARIANTS for order in QL.ORDERS)


def load() -> dict[str, str]:
    return files.load(PATH, SCHEMA)


def regenerate() -> dict[str, str]:
    """Write :func:`reference_digests` to the file."""
    digests = reference_digests()
    header = {"geometry": f"B{BLOCKS} N{BLOCK_SIZE} H{HEADS} D{HEAD_SIZE}", "written_blocks": list(WRITTEN), "seed": SEED}
    files.write(PATH, SCHEMA, header, digests)
    return digests
