"""What the quantised-cache checks (SPEC §16 per-token-head, §16.1 nvfp4) are written with: guarded arenas, the backend's op run
beside reference/quant_codecs.py on twin arenas, and byte comparisons told in cell coordinates
(layer, block, slot, head, field, byte).

An arena is ``GUARD`` seeded random bytes, the cache, ``GUARD`` bytes; the backend builds its cache
over the middle, the reference runs the same op on a CPU copy, and the whole arena is compared, so
a byte written anywhere it should not be shows. The reference computes from copies of the inputs
taken before the backend runs, and the inputs must still equal them afterwards.
"""

from __future__ import annotations

import dataclasses

import torch

from kvconform.backends_under_test.quant_contract import QuantSpec
from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from .applicability import undeclared
from .assertions import SHOWN, ConformanceFailure, a_finding
from .case import GUARD, Case, random_bytes

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)


# The (mode, nvfp4 V-scale placement) pairs each quant check runs, and their test ids: every mode as
# SPEC §16 and NVFP4-SWIZZLE place it, then nvfp4 as FlashInfer's SM80/90/120 writer does (NVFP4-SCALE-PLACEMENT).
VARIANTS = [(mode, QL.SWIZZLED) for mode in QL.MODES] + [(QL.NVFP4, QL.LINEAR)]
VARIANT_IDS = [mode if v_scales == QL.SWIZZLED else f"{mode}_{v_scales}_v" for mode, v_scales in VARIANTS]


def declared(case: Case, op: str, mode: str, order: str, v_scales: str = QL.SWIZZLED):
    """The backend's quant declaration; not applicable when it lacks ``op``, ``mode``, ``order`` or
    the nvfp4 V-scale placement."""
    caps = case.backend.capabilities.quant
    for lacks, what in ((caps is None, "declares no per-token-head quantised cache"),
                        (caps is not None and op not in caps.ops, f"does not declare op '{op}'"),
                        (caps is not None and mode not in caps.modes, f"does not declare kv_cache_dtype {mode}"),
                        (caps is not None and order not in caps.orders, f"does not declare the {order} order for {mode}"),
                        (caps is not None and mode == QL.NVFP4 and v_scales not in caps.v_scales,
                         f"does not declare nvfp4 V scales {v_scales} (its writer's: {', '.join(caps.v_scales) if caps else ''})")):
        if lacks:
            raise undeclared(case.backend, what)
    return caps


CHECKPOINT_SCALES = (0.75, 1.25)  # k_scale, v_scale: not 1, so a writer that drops nvfp4's global scale shows


def quant_spec(case: Case, op: str, mode: str, order: str, v_scales: str = QL.SWIZZLED, *, num_blocks: int = 5, num_layers: int = 1,
               layer: int = 0, num_kv_heads: int | None = None, head_size: int | None = None, block_size: int | None = None) -> QuantSpec:
    """A small cache inside the declaration (the first declared block size and head size the mode
    can take, most heads); not applicable when the mode can take none (QL.unmet)."""
    caps = declared(case, op, mode, order, v_scales)
    if num_layers not in caps.num_layers:
        raise undeclared(case.backend, f"declares quant num_layers={caps.num_layers}, not {num_layers}")
    if block_size is not None and block_size not in caps.block_sizes:
        raise undeclared(case.backend, f"declares quant block sizes {caps.block_sizes}, not {block_size}")
    fits = [(n, d) for n in ((block_size,) if block_size else caps.block_sizes) for d in ((head_size,) if head_size else caps.head_sizes) if not QL.unmet(mode, n, d)]
    if not fits:
        why = QL.unmet(mode, caps.block_sizes[0], head_size or caps.head_sizes[0]) or f"head size {head_size} is not declared"
        raise undeclared(case.backend, f"declares block sizes {caps.block_sizes} and head sizes {caps.head_sizes}: {why}")
    g = QL.QuantGeometry(num_blocks=num_blocks, block_size=fits[0][0], num_kv_heads=num_kv_heads or max(caps.num_kv_heads),
                         head_size=fits[0][1], mode=mode, order=order, num_layers=num_layers, v_scales=v_scales)
    return QuantSpec(geometry=g, layer=layer, k_scale=CHECKPOINT_SCALES[0], v_scale=CHECKPOINT_SCALES[1])


@dataclasses.dataclass
class QuantArena:
    buffer: torch.Tensor  # uint8: guard + cache + guard
    spec: QuantSpec
    cache: torch.Tensor | None = None  # the backend's (L, B, H, N, C)

    @property
    def region(self) -> torch.Tensor:
        return self.buffer[GUARD : GUARD + self.spec.geometry.nbytes()]

    def snapshot(self) -> torch.Tensor:
        return self.buffer.detach().cpu().clone()


def allocate(case: Case, spec: QuantSpec, seed_offset: int = 0) -> tuple[QuantArena, torch.Tensor]:
    """A random-filled guarded arena with the backend's cache over its middle, and the expected
    arena: the same bytes with layer ``spec.layer``'s scales initialised (PTH-SCALE-INIT)."""
    gen = torch.Generator().manual_seed(case.seed + seed_offset)
    buffer = random_bytes(2 * GUARD + spec.geometry.nbytes(), gen).to(case.device)
    expected = buffer.cpu().clone()
    arena = QuantArena(buffer, spec)
    first_use(case, arena, expected)
    return arena, expected


def reallocate(case: Case, arena: QuantArena, expected: torch.Tensor, layer: int) -> None:
    """The backend's first use of another layer of the same allocation (vLLM: another layer's impl)."""
    arena.spec = dataclasses.replace(arena.spec, layer=layer)
    first_use(case, arena, expected)


def first_use(case: Case, arena: QuantArena, expected: torch.Tensor) -> None:
    """The backend builds layer ``arena.spec.layer``'s cache; ``expected`` becomes what PTH-SCALE-INIT
    allows it to have done: that layer's scales all 1.0 (vLLM 0.33.0) or every byte as it was (0.34.0)."""
    g, layer = arena.spec.geometry, arena.spec.layer
    arena.cache = case.backend.quant_allocate(arena.region, arena.spec)
    if torch.equal(arena.snapshot(), expected):
        return
    QC.initialise_scales(region_of(expected, g), g, layer)
    assert_arena_equal("quant first use", case, expected, arena, f"layer {layer}'s scales neither all 1.0 nor left as allocated")


def region_of(arena_bytes: torch.Tensor, g: QL.QuantGeometry) -> torch.Tensor:
    """The cache bytes of an arena's bytes (a view: the reference writes into it)."""
    return arena_bytes[GUARD : GUARD + g.nbytes()]


def token_rows(spec: QuantSpec, tokens: int, seed: int, spread: float = 3.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Key and value ``[T, H, D]`` in the model dtype, as rows of one ``qkv`` tensor (row stride 3·H·D)."""
    g = spec.geometry
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(tokens, 3, g.num_kv_heads, g.head_size, generator=gen) * spread
    _, key, value = qkv.to(spec.model_dtype).unbind(1)
    return key, value


def platform_of(case: Case) -> dict:
    """The backend's platform and arch, which choose the fp8 variant and its bound (QC.code_dtype):
    the reference computes what *this* platform's writer stores."""
    return {"platform": case.backend.platform, "arch": case.backend.arch()}


def write_and_compare(case: Case, spec: QuantSpec, key, value, slot_mapping, note: str = "", arena=None, expected=None) -> tuple[QuantArena, torch.Tensor]:
    """Backend write beside the reference's; the whole arena must equal the reference's."""
    if arena is None:
        arena, expected = allocate(case, spec)
    pristine = [t.detach().cpu().clone() for t in (key, value, slot_mapping)]
    QC.write(*pristine[:2], region_of(expected, spec.geometry), spec.geometry, pristine[2], layer=spec.layer, k_scale=spec.k_scale, v_scale=spec.v_scale,
             **platform_of(case))
    dev = case.device
    inputs = (key.to(dev), value.to(dev), slot_mapping.to(dev))
    case.backend.quant_write(arena.cache, *inputs, spec)
    assert_inputs_unchanged(case, "quant_write", inputs, pristine)
    assert_arena_equal("quant write", case, expected, arena, note)
    return arena, expected


def assert_inputs_unchanged(case: Case, op: str, inputs, pristine) -> None:
    for name, now, before in zip(("key", "value", "slot_mapping"), inputs, pristine):
        if not torch.equal(now.cpu(), before):
            raise ConformanceFailure(f"{op} changed its input {name}\n  repro: {case.repro}", {"property": "inputs unchanged", "argument": name})


def assert_arena_equal(prop: str, case: Case, expected: torch.Tensor, arena: QuantArena, note: str = "") -> None:
    """Every byte of the arena (guards, codes, scales) equals the reference's; a mismatch is told
    in cell coordinates with the expected and actual bytes (scales also as float32)."""
    actual = arena.snapshot()
    differs = (expected != actual).nonzero().flatten()
    if differs.numel() == 0:
        return
    g = arena.spec.geometry
    lines = [f"{prop}: {differs.numel()} bytes differ from the reference ({g.short()}){': ' + note if note else ''}"]
    for at in differs[:SHOWN].tolist():
        where = QL.coordinates_of(g, at - GUARD) if GUARD <= at < GUARD + g.nbytes() else {"guard": "before" if at < GUARD else "after"}
        lines.append(f"  {describe(where)}: expected 0x{int(expected[at]):02x}, actual 0x{int(actual[at]):02x}{scale_values(where, at, expected, actual, g)}")
    lines.append(f"  repro: {case.repro}")
    raise ConformanceFailure("\n".join(lines), {"property": prop, "differing_bytes": differs.numel()})


def assert_byte_sets_equal(prop: str, case: Case, spec: QuantSpec, expected: torch.Tensor, actual: torch.Tensor, note: str = "") -> None:
    """Two sorted sets of cache byte offsets (regions) must be equal, each byte once: bytes left
    out and bytes taken besides are told in cell coordinates."""
    g = spec.geometry
    twice = actual[1:][actual[1:] == actual[:-1]]
    missing = expected[~torch.isin(expected, actual)]
    extra = actual[~torch.isin(actual, expected)]
    if not (missing.numel() or extra.numel() or twice.numel()):
        return
    lines = [f"{prop}: {missing.numel()} bytes left out, {extra.numel()} taken besides, {twice.numel()} twice ({g.short()}){': ' + note if note else ''}"]
    for what, offsets in (("left out", missing), ("taken besides", extra), ("twice", twice)):
        lines += [f"  {what}: {describe(QL.coordinates_of(g, at))}" for at in offsets[:SHOWN].tolist()]
    lines.append(f"  repro: {case.repro}")
    raise ConformanceFailure("\n".join(lines), {"property": prop, "missing": missing.numel(), "extra": extra.numel(), "twice": twice.numel()})


def describe(where: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in where.items())


def scale_values(where: dict, at: int, expected: torch.Tensor, actual: torch.Tensor, g: QL.QuantGeometry) -> str:
    if not where.get("field", "").endswith("scale"):
        return ""
    if g.mode == QL.NVFP4:  # one e4m3 byte a scale
        want, got = (t[at : at + 1].view(torch.float8_e4m3fn).item() for t in (expected, actual))
        return f" (e4m3 block scale {want!r} expected, {got!r} actual)"
    first = at - where["byte"]
    want, got = (QC.scales_from_bytes(t[first : first + QL.SCALE_BYTES]).item() for t in (expected, actual))
    return f" (scale {want!r} expected, {got!r} actual)"
