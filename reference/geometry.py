"""Geometry of one KV-cache allocation, in the symbols of SPEC §0.

``B`` num_blocks, ``N`` block_size, ``H`` num_kv_heads (this rank), ``D`` head_size,
``L`` num_layers packed into one allocation, ``e`` bytes per element of the *cache* dtype,
``x = 16 // e`` elements per 16-byte vector (always from the cache dtype, pitfall F.7).
"""

from __future__ import annotations

import dataclasses

import torch

# Integer dtypes with the same width as each cache dtype: every byte-exact op works on these
# views so that fp8/bf16 bit patterns (NaN codes, -0) are copied, never converted.
_BITS_DTYPE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits_dtype(dtype: torch.dtype) -> torch.dtype:
    """The integer dtype with the element size of ``dtype``."""
    return _BITS_DTYPE[torch.empty((), dtype=dtype).element_size()]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Geometry:
    """Sizes of one cache: ``B, N, H, D, L`` and the cache dtype (storage element type)."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_size: int
    dtype: torch.dtype
    num_layers: int = 1

    def __post_init__(self):
        for field in ("num_blocks", "block_size", "num_kv_heads", "head_size", "num_layers"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Geometry.{field} must be a positive int, got {value!r}")
        if not isinstance(self.dtype, torch.dtype):
            raise ValueError(f"Geometry.dtype must be a torch.dtype, got {self.dtype!r}")
        if self.element_size not in _BITS_DTYPE:
            raise ValueError(f"Geometry.dtype {self.dtype} has unsupported element size")

    @property
    def element_size(self) -> int:
        """``e``: bytes per element of the cache dtype."""
        return self.dtype.itemsize

    @property
    def x(self) -> int:
        """``x = 16 // e``: elements of the cache dtype per 16-byte vector."""
        return 16 // self.element_size

    def extent(self, symbol: str) -> int:
        """Size of a layout dimension named by its symbol (``'B'``, ``'D/x'``, ``'2'`` …)."""
        sizes = {
            "L": self.num_layers,
            "B": self.num_blocks,
            "2": 2,
            "N": self.block_size,
            "H": self.num_kv_heads,
            "D": self.head_size,
            "x": self.x,
            "D/x": self.head_size // self.x,
            "N/x": self.block_size // self.x,
        }
        return sizes[symbol]

    def short(self) -> str:
        """Compact id used in test ids and reports: ``L1-B6-N16-H3-D32-bfloat16``."""
        return (
            f"L{self.num_layers}-B{self.num_blocks}-N{self.block_size}-H{self.num_kv_heads}"
            f"-D{self.head_size}-{str(self.dtype).removeprefix('torch.')}"
        )
