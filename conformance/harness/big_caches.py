"""Caches past 2^31 elements, cheaply enough to check on every run (SPEC ADDR-64BIT).

The probe geometry is the smallest such cache the backend declares: 1-byte elements where it
declares fp8, the smallest H·D, just enough blocks that the last block starts past element
2^31 (and so has a block id past 2^16). On a CPU its arenas are anonymous memory mappings:
they read as zeros and cost memory only for the pages something touches. After the op, the
kernel's ``mincore`` says which pages the backend or the reference touched; comparing those
pages compares everything, since every other page is zero in both arenas. So "nothing else
changed" (WRITE-ONLY-TARGET) holds exactly, in milliseconds and a few pages of memory.

On a GPU device arenas are allocated in full, zero-filled as the mapping reads (no gigabytes of
random bytes to generate, pin and copy per probe), and compared whole. The host arena of a swap
probe is the process's one :class:`PinnedArenas` buffer: an anonymous mapping registered with
CUDA once (pinned, exactly the bytes the largest probe so far needed) and reused by every probe
of the process, zero again before each (the pages holding anything else, found by a scan, are
cleared). Its twin is lazily mapped, and the comparison covers the pages the reference touched
plus every page of the pinned arena that is not all zeros: everywhere else both are zero, so
this too compares everything. (Before, each swap probe pinned a fresh 2–8 GiB host arena, copied
it and compared it whole on the CPU: 3–13 s per probe on an H200.) With ``--kvc-huge`` a GPU
random-fills its arenas and compares them whole (a CPU allocates them in full, zero-filled).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import mmap

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import CacheSpec

from .assertions import a_finding, assert_bytes_equal
from .case import FP8_KV_CACHE_DTYPES, GUARD, Arena, Case, storage_of_its_own
from .lazy_memory import lazy_mapping

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)

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
    return torch.frombuffer(lazy_mapping(nbytes), dtype=torch.uint8)


def probe_arena(case: Case, spec: CacheSpec, *, host: bool = False) -> Arena:
    """The arena of a probe: lazily mapped on a CPU, zeros fully allocated on a GPU (the host side
    of a GPU: the process's pinned arena, zero again), random bytes with --kvc-huge."""
    if host and case.device != "cpu" and not case.huge and torch.cuda.is_available():
        case.built(spec)
        arena = PinnedArena(PINNED.take(2 * GUARD + spec.layout.nbytes(spec.geometry), case.device), spec)
        arena.cache = case.backend.allocate(storage_of_its_own(arena.region), spec)
        return arena
    if case.device != "cpu" or case.huge:
        if not host and case.device != "cpu":
            torch.cuda.empty_cache()  # the last probe's gigabytes go back to the GPU, for the other workers' probes
        return case.allocate(spec, host=host, seed_offset=int(host), zero=not case.huge)
    case.built(spec)
    arena = LazyArena(lazy_zeros(2 * GUARD + spec.layout.nbytes(spec.geometry)), spec)
    arena.cache = case.backend.allocate(arena.region, spec)
    return arena


def expected_arena(arena: Arena) -> Arena:
    """A twin of ``arena`` for the reference to run the same ops on (lazily mapped zeros for a
    lazy or pinned probe arena, which must not have been touched yet; a copy on the arena's
    device otherwise)."""
    if isinstance(arena, (LazyArena, PinnedArena)):
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
    """The whole arena equals the reference's: for lazy arenas, the pages either side touched
    (for the pinned arena, the pages that hold anything but zeros)."""
    if not isinstance(actual, (LazyArena, PinnedArena)):
        assert_bytes_equal(prop, case, expected, actual, note)
        return
    written = nonzero_pages(actual.buffer, case.device) if isinstance(actual, PinnedArena) else touched_pages(actual.buffer)
    pages = torch.unique(torch.cat([touched_pages(expected.buffer), written]))
    assert_bytes_equal(prop, case, expected, actual, note, pages=pages, zero_fill=True)  # untouched pages read zeros


# ----------------------------------------------------------------------------- the pinned host arena
@dataclasses.dataclass
class PinnedArena(Arena):
    """A probe's host arena on a GPU machine: the front of the process's pinned buffer, all zeros
    when the probe takes it."""

    def snapshot(self, on_device: bool = False) -> "PinnedArena":
        raise TypeError("the pinned probe arena is not copied: build the expected arena with expected_arena()")


SCAN_BYTES = 256 << 20  # the pinned buffer is scanned on the GPU in pieces this large


MANY_PAGES = 4096  # more pages left non-zero than this: the whole pinned buffer is cleared at once


def nonzero_pages(buffer: torch.Tensor, device: str | None = "cuda") -> torch.Tensor:
    """Indices of the pages of a host buffer holding a byte other than zero, read on ``device``
    (pinned memory: a copy at bus speed, then a reduction there; None: on the CPU) in
    ``SCAN_BYTES`` pieces."""
    found = []
    for start in range(0, buffer.numel(), SCAN_BYTES):
        piece = buffer[start : start + SCAN_BYTES]
        if device is not None:
            piece = piece.to(device, non_blocking=True)
        tail = (-piece.numel()) % PAGE
        if tail:
            piece = torch.cat([piece, piece.new_zeros(tail)])
        found.append(piece.view(-1, PAGE).any(dim=1).nonzero().flatten().cpu().add(start // PAGE))
    return torch.cat(found) if found else torch.empty(0, dtype=torch.int64)


class PinnedArenas:
    """The process's one pinned host buffer for probe arenas: an anonymous private mapping registered
    with CUDA (``cudaHostRegister``: pinned and mapped for every device, so kernels reach it
    directly), grown when a probe needs more, and zero again each time a probe takes it."""

    PORTABLE_AND_MAPPED = 1 | 2  # cudaHostRegisterPortable | cudaHostRegisterMapped

    def __init__(self):
        self.mapping: mmap.mmap | None = None
        self.buffer: torch.Tensor | None = None

    def take(self, nbytes: int, device: str = "cuda") -> torch.Tensor:
        """The first ``nbytes`` of the buffer, all zeros (a page that is not is cleared)."""
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.release()
            self.mapping = lazy_mapping(nbytes)
            buffer = torch.frombuffer(self.mapping, dtype=torch.uint8)
            status = int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), nbytes, self.PORTABLE_AND_MAPPED))
            if status != 0:
                raise RuntimeError(f"cudaHostRegister of {nbytes} bytes for a probe's host arena failed: cudaError {status}")
            self.buffer = buffer  # fresh pages: zeros
        else:
            left = nonzero_pages(self.buffer, device)  # what the last probe left, wherever it is
            if left.numel() > MANY_PAGES:
                self.buffer.zero_()
            for page in left.tolist() if left.numel() <= MANY_PAGES else ():
                self.buffer[page * PAGE : (page + 1) * PAGE].zero_()
        return self.buffer[:nbytes]

    def release(self) -> None:
        if self.buffer is not None:
            torch.cuda.cudart().cudaHostUnregister(self.buffer.data_ptr())
            self.buffer = None
            self.mapping = None  # unmapped once the last view is gone


PINNED = PinnedArenas()
