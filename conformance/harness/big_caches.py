"""Caches past 2^31 elements, cheaply enough to check on every run (SPEC ADDR-64BIT).

The probe geometry is the smallest such cache the backend declares: 1-byte elements where it
declares fp8, the smallest H·D, just enough blocks that the last block starts past element
2^31 (and so has a block id past 2^16). On a CPU its arenas are anonymous memory mappings:
they read as zeros and cost memory only for the pages something touches. After the op, the
kernel's ``mincore`` says which pages the backend or the reference touched; comparing those
pages compares everything, since every other page is zero in both arenas. So "nothing else
changed" (WRITE-ONLY-TARGET) holds exactly, in milliseconds and a few pages of memory.

On a GPU arenas are allocated in full, zero-filled as the mapping reads (no gigabytes of random
bytes to generate, pin and copy per probe), and compared whole; with ``--kvc-huge`` a GPU
random-fills them (a CPU allocates them in full, zero-filled).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec

from .assertions import assert_bytes_equal
from .case import FP8_KV_CACHE_DTYPES, GUARD, Arena, Case

PAGE = mmap.PAGESIZE
LIMIT = 1 << 31


@dataclasses.dataclass
class LazyArena(Arena):
    """An arena over an anonymous mapping: zeros, paid for page by page as it is touched."""

    def snapshot(self, on_device: bool = False) -> "LazyArena":
        raise TypeError("a lazily mapped arena is not copied: build the expected arena with expected_arena()")


def probe_geometry(case: Case, layout=None) -> tuple[R.Geometry, str]:
    """(geometry, kv_cache_dtype) of the smallest declared cache whose last block starts past 2^31."""
    caps = case.backend.capabilities
    kv_cache_dtype = next((d for d in FP8_KV_CACHE_DTYPES if d in caps.kv_cache_dtypes), "auto" if "auto" in caps.kv_cache_dtypes else caps.kv_cache_dtypes[0])
    small = min(((h, d) for h in caps.num_kv_heads for d in caps.head_sizes), key=lambda hd: hd[0] * hd[1])
    one = case.geometry(kv_cache_dtype=kv_cache_dtype, num_blocks=1, num_kv_heads=small[0], head_size=small[1])
    layout = layout or case.layout
    per_block = layout.numel(one)
    # Kv-first layouts put block b at b·plane inside each plane: the last V block must still start past 2^31.
    blocks = LIMIT // per_block + 2 if layout.k_dims[0] != "2" else (LIMIT // (per_block // 2)) + 2
    return dataclasses.replace(one, num_blocks=blocks), kv_cache_dtype


def lazy_zeros(nbytes: int) -> torch.Tensor:
    """``nbytes`` zero bytes over an anonymous private mapping (no memory until touched)."""
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)


def probe_arena(case: Case, spec: CacheSpec, *, host: bool = False) -> Arena:
    """The arena of a probe: lazily mapped on a CPU, zeros fully allocated on a GPU, random bytes with --kvc-huge."""
    if case.device != "cpu" or case.huge:
        return case.allocate(spec, host=host, seed_offset=int(host), zero=not case.huge)
    case.built(spec)
    arena = LazyArena(lazy_zeros(2 * GUARD + spec.layout.nbytes(spec.geometry)), spec)
    arena.cache = case.backend.allocate(arena.region, spec)
    return arena


def expected_arena(arena: Arena) -> Arena:
    """A twin of ``arena`` for the reference to run the same ops on (lazily mapped zeros for a
    lazy arena, which must not have been touched yet; a copy on the arena's device otherwise)."""
    if isinstance(arena, LazyArena):
        return LazyArena(lazy_zeros(arena.buffer.numel()), arena.spec)
    return arena.snapshot(on_device=True)


_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


def touched_pages(buffer: torch.Tensor) -> torch.Tensor:
    """Indices of the pages of a mapping that anything has touched (``mincore``: resident)."""
    pages = (buffer.numel() + PAGE - 1) // PAGE
    vector = torch.zeros(pages, dtype=torch.uint8)
    if _libc.mincore(buffer.data_ptr(), buffer.numel(), vector.data_ptr()) != 0:
        raise OSError(ctypes.get_errno(), "mincore failed on a lazily mapped arena")
    return torch.nonzero(vector & 1).flatten()


def assert_arenas_equal(prop: str, case: Case, expected: Arena, actual: Arena, note: str = "") -> None:
    """The whole arena equals the reference's: for lazy arenas, the pages either side touched."""
    if not isinstance(actual, LazyArena):
        assert_bytes_equal(prop, case, expected, actual, note)
        return
    pages = torch.unique(torch.cat([touched_pages(expected.buffer), touched_pages(actual.buffer)]))
    assert_bytes_equal(prop, case, expected, actual, note, pages=pages, zero_fill=True)  # untouched pages read zeros
