"""FlashInfer's NVFP4 KV writer, as vLLM 0.33.0 calls it on SM80/90/120, held byte for byte to SPEC §16.1.

    PYTHONPATH=FLASHINFER_TREE:TVM_FFI_SITE:. python3 -m tests.real_kernels_gpu.flashinfer_nvfp4_probe OUT_DIR   # on a GPU

On those GPUs vLLM's FlashInfer backend writes an ``nvfp4`` cache with
``flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping`` over ``_nvfp4_kv_views``
(vllm/v1/attention/backends/flashinfer.py:114-115, 126-146, 2822-2833; FlashInfer 0.7.2.post1's
``page`` JIT module, include/flashinfer/page.cuh:556-618). One page allocation per case, exactly as
vLLM allocates it (the logical ``(B, 2H, N, D/2 + D/16)`` uint8 tensor in HND or NHD strides, over
seeded random bytes), tiny exact inputs (edge groups below, blocks >= 2, a -1 padding slot, one key
row past the slot mapping), FlashInfer's write, then EVERY byte of the storage compared with what
kvconform's reference says (``quant_codecs.encoded_fields`` at ``quant_layouts.field_offsets``):
per field — K data, V data, K scales, V scales, untouched — agree, or how many differ and the
first by logical coordinates. Two named hypotheses are tested on the same bytes: V's scales
swizzled (NVFP4-SWIZZLE) or linear like K's, and the block scale's rounding. Writes
OUT_DIR/nvfp4-probe.json; prints a summary. The comparison is CPU code, tested with stand-in
writers in tests/test_flashinfer_nvfp4_probe.py; only :func:`flashinfer_writer` needs the GPU.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

# Pairwise-distinct sizes so a swapped dimension shows; D = 128 gives 8 scales a row (swizzle
# groups of 2 columns); N = 8 is two 4-slot swizzle tiles.
GEOMETRY = {"num_blocks": 6, "block_size": 8, "num_kv_heads": 3, "head_size": 128, "mode": QL.NVFP4}
# Block 2 whole, a padding slot, block 4's second tile, two slots of block 3 (a partial tile); the last
# slot (where a writer reading -1 as an index puts the padding row) stays unwritten.
# Each case passes one key/value row more than the mapping has: it must not be read.
SLOTS = [*range(16, 24), -1, *range(36, 40), 24, 25]
GLOBAL_SCALES = ((1.0, 2.0), (0.75, 1.25))  # (k_scale, v_scale): powers of two keep ties ties; the harness's pair
FIELD_NAMES = {"k_data": "K data", "v_data": "V data", "k_scale": "K scales", "v_scale": "V scales"}
SEED = 36


def geometry(order: str) -> QL.QuantGeometry:
    return QL.QuantGeometry(**GEOMETRY, order=order)


def nvfp4_kv_views(kv_cache: torch.Tensor, num_kv_heads: int):
    """vLLM 0.33.0's ``_nvfp4_kv_views`` (flashinfer.py:126-146) with its ``nvfp4_split_data_scale``
    (vllm/utils/torch_utils.py:547-595), stride for stride: each side ``[data | scales]``, K then V,
    rows (head, slot) in HND or (slot, head) in NHD. The CPU test holds it equal to vLLM's own."""
    num_blocks, num_slots, block_size, full_dim = kv_cache.shape
    hnd = kv_cache.stride()[1:] == (block_size * full_dim, full_dim, 1)
    if not hnd and kv_cache.stride()[1:] != (full_dim, num_slots * full_dim, 1):
        raise ValueError(f"NVFP4 KV pages must be dense, got {kv_cache.stride()}")
    dims = (num_kv_heads, block_size) if hnd else (block_size, num_kv_heads)
    data_dim = full_dim * 8 // 9
    scale_dim = full_dim - data_dim
    sides = []
    for side in range(2):
        base = kv_cache.storage_offset() + side * num_kv_heads * block_size * full_dim
        data = kv_cache.as_strided((num_blocks, *dims, data_dim), (kv_cache.stride(0), dims[1] * data_dim, data_dim, 1), base)
        scale = kv_cache.as_strided((num_blocks, *dims, scale_dim), (kv_cache.stride(0), dims[1] * scale_dim, scale_dim, 1),
                                    base + dims[0] * dims[1] * data_dim).view(torch.float8_e4m3fn)
        sides.append((data, scale))
    (k_data, k_scale), (v_data, v_scale) = sides
    return (k_data, v_data), (k_scale, v_scale), "HND" if hnd else "NHD"


def flashinfer_writer(kv_cache, key, value, slots, k_scale: float, v_scale: float, g: QL.QuantGeometry) -> None:
    """vLLM's call (flashinfer.py:2822-2833): the views, then FlashInfer's writer; the global
    scales as float32 scalar tensors on the device, as ``layer._k_scale`` is
    (vllm/model_executor/layers/attention/attention.py:136)."""
    import flashinfer

    data, scales, layout = nvfp4_kv_views(kv_cache, g.num_kv_heads)
    k, v = (torch.tensor(s, dtype=torch.float32, device=key.device) for s in (k_scale, v_scale))
    flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping(key, value, slots, data, scales, k, v, kv_layout=layout)


def probe_values(rows: int, heads: int, head_size: int, unit: float, seed: int, dtype=torch.bfloat16) -> torch.Tensor:
    """``[rows, heads, D]`` in the model dtype (every planned value exact in bf16 and fp16); each 16-value group is one kind (cycling over rows, heads,
    groups), ``unit`` the side's global scale so that block scales come out as planned:
    zeros (and −0); every e2m1 tie with ±6 (block scale 1); amax first / last in its group (a
    writer with shifted groups fails); amax/(6·unit) on the e4m3 ties 1.0625, 1.9375, 2.125, 2.375;
    a block scale that saturates (512 → 448); a subnormal block scale (2^-8); random."""
    gen = torch.Generator().manual_seed(seed)
    ties = [6.0, -6.0, 0.25, -0.25, 0.75, -0.75, 1.25, -1.25, 1.75, -1.75, 2.5, -2.5, 3.5, -3.5, 5.0, -5.0]
    nan = float("nan")  # a free entry: filled with random values below the group's amax
    kinds = [([0.0, -0.0] * 8, 0.0), (ties, 6.0), ([6.0, -0.1] + [nan] * 14, 6.0), ([nan] * 15 + [-6.0], 6.0)]
    kinds += [([nan] * p + [6 * m] + [nan] * (15 - p), 6 * m) for p, m in ((3, 1.0625), (8, 1.9375), (11, 2.125), (14, 2.375))]
    kinds += [([3072.0, -3000.0] + [nan] * 14, 3072.0), ([6 / 256, -3 / 256] + [nan] * 14, 6 / 256), ([nan] * 16, -1.0)]
    template = torch.tensor([k for k, _ in kinds]) * unit
    amax = torch.tensor([a for _, a in kinds]) * unit
    groups = head_size // QL.NVFP4_GROUP
    kind = torch.arange(rows * heads * groups).reshape(rows, heads, groups) % len(kinds)
    noise = torch.randn(rows, heads, groups, QL.NVFP4_GROUP, generator=gen)
    free = torch.where(amax[kind, None] > 0, (noise * 0.3).clamp(-0.9, 0.9) * amax[kind, None], noise * 3 * unit)
    picked = template[kind]
    return torch.where(picked.isnan(), free, picked).reshape(rows, heads, head_size).to(dtype)


def placements(g: QL.QuantGeometry, slots: torch.Tensor, v_scales: str) -> dict[str, torch.Tensor]:
    """Byte offsets ``[T, H, n]`` of each field of the written (slot, head) cells, V's scales
    ``swizzled`` (SPEC NVFP4-SWIZZLE) or ``linear`` (where K's sit, one side on): the reference's
    ``field_offsets`` at that placement (NVFP4-SCALE-PLACEMENT; tests/test_nvfp4_placements.py)."""
    placed = dataclasses.replace(g, v_scales=v_scales)
    return QL.field_offsets(placed, (slots // g.block_size)[:, None], (slots % g.block_size)[:, None], torch.arange(g.num_kv_heads))


def expected_storage(initial, g, key, value, slots, k_scale, v_scale, v_scales: str = "swizzled"):
    """The storage after the write the reference specifies: ``initial`` with each written cell's
    data and scale bytes (``encoded_fields``) at ``placements``; padding rows skipped."""
    rows = torch.nonzero(slots >= 0).flatten()
    where = placements(g, slots[rows], v_scales)
    out = initial.clone()
    for side, x, scale in (("k", key, k_scale), ("v", value, v_scale)):
        data, sf = QC.encoded_fields(x[rows], g, k_scale=scale)
        out[where[f"{side}_data"]], out[where[f"{side}_scale"]] = data, sf
    return out


def first_difference(differ: torch.Tensor, where: torch.Tensor, expected, got, slots, g, field: str) -> dict:
    """Logical coordinates of the first differing byte of a field (``differ``/``where`` ``[T, H, n]``)."""
    row, head, byte = (int(i) for i in torch.nonzero(differ)[0])
    slot = int(slots[row])
    offset = int(where[row, head, byte])
    group = byte // (QL.NVFP4_GROUP // 2) if field.endswith("data") else byte
    return {"token": row, "block": slot // g.block_size, "slot": slot % g.block_size, "head": head, "group": group,
            "byte": byte, "offset": offset, "expected": f"0x{int(expected[offset]):02x}", "actual": f"0x{int(got[offset]):02x}"}


def field_verdicts(initial, got, expected, g, slots, v_scales: str) -> dict[str, dict]:
    """Per field: bytes compared, how many differ, the first differing one. "untouched" is every
    storage byte outside the written cells' fields, which must still hold its initial value."""
    rows = torch.nonzero(slots >= 0).flatten()
    where = placements(g, slots[rows], v_scales)
    verdicts = {}
    written = torch.zeros_like(initial, dtype=torch.bool)
    for field, name in FIELD_NAMES.items():
        offs = where[field]
        written[offs] = True
        differ = got[offs] != expected[offs]
        verdicts[name] = {"bytes": offs.numel(), "differ": int(differ.sum())}
        if differ.any():
            verdicts[name]["first"] = first_difference(differ, offs, expected, got, slots[rows], g, field)
    changed = torch.nonzero(~written & (got != initial)).flatten()
    verdicts["untouched"] = {"bytes": int((~written).sum()), "differ": len(changed)}
    if len(changed):
        offset = int(changed[0])
        verdicts["untouched"]["first"] = {**QL.coordinates_of(g, offset), "offset": offset,
                                          "expected": f"0x{int(initial[offset]):02x}", "actual": f"0x{int(got[offset]):02x}"}
    return verdicts


def block_scale_candidates(x: torch.Tensor, global_scale: float) -> dict[str, torch.Tensor]:
    """e4m3 block-scale bytes ``[..., D/16]`` of ``x [..., D]`` by each rounding hypothesis."""
    amax = x.float().unflatten(-1, (-1, QL.NVFP4_GROUP)).abs().amax(-1)
    exact = amax / (torch.tensor(6.0) * torch.tensor(global_scale, dtype=torch.float32))  # page.cuh:329, IEEE division
    nearest = exact.clamp(max=QC.E4M3_MAX).to(torch.float8_e4m3fn)
    below = nearest.float() < exact
    up = torch.where(below & (nearest.float() < QC.E4M3_MAX), nearest.view(torch.uint8) + 1, nearest.view(torch.uint8))
    return {"reference: e4m3 RNE of (1/s)·(amax·rcp(6))": QC.nvfp4_encode(x, global_scale)[1],
            "e4m3 RNE of amax / (6·s)": nearest.view(torch.uint8),
            "e4m3 rounded up from amax / (6·s)": up}


def codes_from_scales(x: torch.Tensor, sf: torch.Tensor, global_scale: float) -> torch.Tensor:
    """Packed e2m1 of ``x`` given block-scale bytes ``sf``: ``x · 1/(sf·s)`` (page.cuh:334-344)."""
    scales = sf.view(torch.float8_e4m3fn).float() * torch.tensor(global_scale, dtype=torch.float32)
    out = torch.where(scales != 0, 1.0 / scales, 0.0)
    return QC.pack_nibbles(QC.e2m1_codes(x.float().unflatten(-1, (-1, QL.NVFP4_GROUP)) * out[..., None]).flatten(-2))


def hypotheses(got, g, key, value, slots, k_scale, v_scale) -> dict:
    """V's scales swizzled or linear (bytes matching the reference's encoding at each placement);
    which block-scale rounding the stored scales follow (K's, and V's at the placement that
    matched more); whether the stored codes are e2m1 of x at the writer's own stored scales."""
    rows = torch.nonzero(slots >= 0).flatten()
    x = {"k": key[rows], "v": value[rows]}
    scale = {"k": k_scale, "v": v_scale}
    where = {p: placements(g, slots[rows], p) for p in ("swizzled", "linear")}
    want_v = QC.encoded_fields(x["v"], g, k_scale=v_scale)[1]
    placement = {p: int((got[where[p]["v_scale"]] == want_v).sum()) for p in where}
    best = max(placement, key=placement.get)
    stored = {"k": got[where[best]["k_scale"]], "v": got[where[best]["v_scale"]]}
    rounding, off_reference = {}, []
    for side in "kv":
        candidates = block_scale_candidates(x[side], scale[side])
        for name, sf in candidates.items():
            rounding[name] = rounding.get(name, 0) + int((sf == stored[side]).sum())
        amax = x[side].float().unflatten(-1, (-1, QL.NVFP4_GROUP)).abs().amax(-1)
        reference = next(iter(candidates.values()))
        for row, head, group in torch.nonzero(reference != stored[side])[:4].tolist():  # the first four a side
            off_reference.append({"side": side.upper(), "slot": int(slots[rows][row]), "head": head, "group": group,
                                  "amax": float(amax[row, head, group]), "reference": float(reference[row, head, group:group + 1].view(torch.float8_e4m3fn)),
                                  "stored": float(stored[side][row, head, group:group + 1].view(torch.float8_e4m3fn))})
    codes = sum(int((codes_from_scales(x[s], stored[s], scale[s]) == got[where[best][f"{s}_data"]]).sum()) for s in "kv")
    return {"v_scale_placement": {"of": want_v.numel(), **placement},
            "block_scale_rounding": {"of": 2 * want_v.numel(), **rounding}, "block_scales_off_the_reference": off_reference,
            "codes_at_stored_scales": {"of": 2 * rows.numel() * g.num_kv_heads * g.data_bytes, "agree": codes, "v_scales_read": best}}


def run_case(writer, order: str, k_scale: float, v_scale: float, device: str = "cpu", slot_mapping=SLOTS, dtype=torch.bfloat16) -> dict:
    """One write through ``writer(kv_cache, key, value, slots, k_scale, v_scale, g)`` on ``device``
    over vLLM's allocation; every byte judged against NVFP4-* and the linear-V-scales variant."""
    g = geometry(order)
    rows = len(slot_mapping) + 1
    gen = torch.Generator().manual_seed(SEED)
    initial = torch.randint(0, 256, (g.nbytes(),), dtype=torch.uint8, generator=gen)
    key = probe_values(rows, g.num_kv_heads, g.head_size, k_scale, SEED + 1, dtype)
    value = probe_values(rows, g.num_kv_heads, g.head_size, v_scale, SEED + 2, dtype)
    slots = torch.tensor(slot_mapping, dtype=torch.int64)
    storage = initial.clone().to(device)
    writer(torch.as_strided(storage, g.shape(), g.strides()), key.to(device), value.to(device), slots.to(device), k_scale, v_scale, g)
    if device != "cpu":
        torch.cuda.synchronize()
    got = storage.cpu()
    verdicts = {}
    for label, v_scales in (("NVFP4 (V scales swizzled)", "swizzled"), ("variant: V scales linear", "linear")):
        expected = expected_storage(initial, g, key, value, slots, k_scale, v_scale, v_scales)
        verdicts[label] = field_verdicts(initial, got, expected, g, slots, v_scales)
    return {"geometry": g.short(), "dtype": str(dtype)[6:], "order": order, "k_scale": k_scale, "v_scale": v_scale, "slots": list(slot_mapping), "rows": rows,
            "verdicts": verdicts, "hypotheses": hypotheses(got, g, key, value, slots, k_scale, v_scale)}


def describe(verdict: dict) -> str:
    if not verdict["differ"]:
        return f"agree ({verdict['bytes']} bytes)"
    f = verdict["first"]
    at = ", ".join(f"{k} {f[k]}" for k in ("block", "slot", "head", "group", "field", "byte") if k in f)
    return f"{verdict['differ']} of {verdict['bytes']} differ, first at {at}: expected {f['expected']}, actual {f['actual']}"


def summary(case: dict) -> list[str]:
    lines = [f"{case['geometry']} {case['dtype']} k_scale={case['k_scale']} v_scale={case['v_scale']}"]
    for label, fields in case["verdicts"].items():
        lines.append(f"  against {label}:")
        lines += [f"    {name}: {describe(v)}" for name, v in fields.items()]
    h = case["hypotheses"]
    p, r, c = h["v_scale_placement"], h["block_scale_rounding"], h["codes_at_stored_scales"]
    lines.append(f"  V scales placed swizzled: {p['swizzled']}/{p['of']} match, linear: {p['linear']}/{p['of']}")
    lines += [f"  block scales (K and V) as {name}: {n}/{r['of']}" for name, n in r.items() if name != "of"]
    lines += [f"    off the reference: {o}" for o in h["block_scales_off_the_reference"][:3]]
    lines.append(f"  codes = e2m1 of x at the writer's own stored scales: {c['agree']}/{c['of']} bytes")
    return lines


def main(out_dir: str) -> None:
    import flashinfer

    started = time.monotonic()
    cases = [run_case(flashinfer_writer, order, k, v, device="cuda", dtype=dtype)
             for dtype in (torch.bfloat16, torch.float16) for order in QL.ORDERS for k, v in GLOBAL_SCALES]
    report = {"writer": "flashinfer.nvfp4_quantize_append_paged_kv_cache_with_slot_mapping", "flashinfer": getattr(flashinfer, "__version__", "?"),
              "device": torch.cuda.get_device_name(), "cases": cases, "wall_s": round(time.monotonic() - started, 1)}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    (Path(out_dir) / "nvfp4-probe.json").write_text(json.dumps(report, indent=1))
    for case in cases:
        print("\n".join(summary(case)), flush=True)
    print(f"FlashInfer {report['flashinfer']} on {report['device']}: {report['wall_s']} s, page-module JIT included", flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
