"""The words of a diagnosis (conformance/harness/diagnosis.py): the fixed vocabulary of fault
classes, the records a diagnosis returns (:class:`Finding`, :class:`Span`) and what a write was given."""

from __future__ import annotations

import dataclasses

import torch

EXAMINED = 4096  # differing elements explained per failure

FAULTS = {
    "out-of-bounds": "a guard byte before or after the cache changed: written out of bounds",
    "never-written": "an element the op writes still holds its initial (pre-op) bytes",
    "wrong-layout": "the bytes are where a layout derived from the declared one puts them (kv-first for "
                    "blocks-first, HND for NHD, V in K's tile form, x of another element size)",
    "kv-swapped": "holds the expected bytes of the same element of the other side (K for V, V for K)",
    "neighbour-slot": "holds the bytes of the same element one slot before or after; or, changed though the op "
                      "leaves it, lies right next to a slot the op wrote correctly",
    "neighbour-block": "holds the bytes of the same element in the block before or after; or, changed though the "
                       "op leaves it, lies right next to a block the op wrote correctly (a copy that ran on)",
    "block-id-wrap": "holds the bytes of the same element of a block whose id is the same modulo 2^16, 2^20 or 2^32: "
                     "block ids truncated to 16, 20 or 32 bits (or an address past 2^31 computed in 32 bits)",
    "other-layer": "holds the bytes of the same element of another layer",
    "other-head": "holds the bytes of the same element of another head",
    "other-element": "holds the expected bytes of another logical element",
    "padding-written": "holds the input row of a token whose slot is negative (padding)",
    "extra-row": "holds an input row past len(slot_mapping)",
    "fp8-format": "an fp8 code of another format (e4m3 where e5m2 was expected, or the reverse)",
    "fp8-fnuz-vs-fn": "an e4m3fn code where e4m3fnuz was expected, or the reverse (with or without the x2 scale convention)",
    "scale-inverted": "quantised as x*scale instead of x/scale",
    "scale-swapped": "quantised with the other side's scale (k_scale for V, v_scale for K)",
    "value-scaled": "fp8 values a constant factor off the expected (a scale applied wrongly; the inputs were not at hand)",
    "fp8-rounding": "an fp8 code one step from the expected: not rounded to nearest-even (truncation, near-ties)",
    "fp8-nan": "a NaN stored as a finite code",
    "value-cast": "the same value with other bits (NaN payload, -0): a value conversion where a bit copy was meant",
    "byte-order": "the expected bytes of the element in reverse order",
    "bit-flip": "the expected bytes with one bit flipped",
    "zeroed": "zero bytes where the expected bytes are not zero",
    "stray-write": "changed though the op must leave it untouched, to bytes found nowhere else (or page padding written)",
    "unexplained": "none of the above fits",
    "not-examined": "differing elements not explained: past the examined ones, outside the mapped blocks of a large cache, or in groups past the listed ones",
}
FAULT_ID = {name: i for i, name in enumerate(FAULTS)}
MOVES = ("kv-swapped", "neighbour-slot", "neighbour-block", "block-id-wrap", "other-layer", "other-head", "other-element")
HOLDERS = MOVES + ("wrong-layout",)  # classes whose elements hold another element's bytes
KV_NAMES = ("K", "V")
DIMS = ("layer", "block", "kv", "slot", "head", "dim")
ID_WIDTHS = (16, 20, 32)  # block id fields a kernel truncates to: int16, a 20-bit field, int32


@dataclasses.dataclass(frozen=True)
class WriteInputs:
    """What a ``reshape_and_cache`` was given: its rows explain bytes no expected element has."""

    key: torch.Tensor
    value: torch.Tensor
    slot_mapping: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor


@dataclasses.dataclass(frozen=True)
class Span:
    """Logical elements as a box (each coordinate's distinct values), or guard / padding bytes."""

    kind: str  # "cache" | "guard-before" | "guard-after" | "padding"
    elements: int  # distinct elements in it
    layer: tuple[int, ...] = ()
    block: tuple[int, ...] = ()
    kv: tuple[int, ...] = ()
    slot: tuple[int, ...] = ()
    head: tuple[int, ...] = ()
    dim: tuple[int, ...] = ()
    bytes: tuple[int, int] | None = None  # guard-before: offsets before the cache start (< 0); after: past its end
    text: str = ""  # K[b=1, s=0,15, h=0..2]; guard bytes +0..+7 past the end of the cache

    def as_dict(self) -> dict:
        if self.kind != "cache":
            return {self.kind: list(self.bytes), "elements": self.elements, "text": self.text}
        out = {name: [min(getattr(self, name)), max(getattr(self, name))] for name in DIMS}
        out["kv"] = "/".join(KV_NAMES[k] for k in self.kv)
        return {**out, "elements": self.elements, "text": self.text}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One group of wrong elements, its fault class (a key of :data:`FAULTS`) and one sentence."""

    fault: str
    where: Span | None  # None for not-examined
    sentence: str
    source: Span | None = None  # whose bytes they hold (for the far end of a move: who holds theirs)

    def as_dict(self) -> dict:
        return {
            "fault": self.fault,
            "elements": self.where.elements if self.where else None,
            "where": self.where.as_dict() if self.where else None,
            "source": self.source.as_dict() if self.source else None,
            "sentence": self.sentence,
        }

    def line(self) -> str:
        return f"{self.fault}: {self.sentence}"


def wrap_widths(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``(n, len(ID_WIDTHS))``: for which widths w the smaller of two block ids is the larger one
    modulo 2^w (what the larger id becomes truncated to w bits)."""
    low, high = torch.minimum(a, b), torch.maximum(a, b)
    return torch.stack([(low != high) & (high % (1 << w) == low) for w in ID_WIDTHS], dim=1)
