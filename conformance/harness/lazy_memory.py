"""Address space that costs no memory until touched: the lazily mapped arenas of the probes past
2^31 elements (big_caches.py), and the check that such a mapping can be made at all (applicability.py).
A module of its own so that applicability need not import the probes' harness."""

from __future__ import annotations

import mmap


def lazy_mapping(nbytes: int) -> mmap.mmap:
    """An anonymous *private* mapping. Python's default for ``mmap(-1, n)`` is a shared one, which
    the kernel backs with a shmem file: a page read there is allocated, and ``mincore`` looks every
    page up in the file (40 ms for 4 GiB on the CI machine). Private: a read maps the zero page
    (no memory), and ``mincore`` skips the holes (1.5 ms)."""
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
