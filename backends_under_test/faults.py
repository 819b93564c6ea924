"""Backends that break the *process*, not the bytes: for proving fault isolation.

They are not in the mutant catalogue (a crash would end a run without isolation). Run them
with ``-n N --dist loadgroup --timeout S`` (docs/FAULT_ISOLATION.md): each backend's tests
stay on one xdist worker, a killed worker is restarted, a hung test is timed out.
"""

from __future__ import annotations

import os
import time

from .reference_backend import ReferenceBackend


class CrashesOnWrite(ReferenceBackend):
    """``write`` aborts the process, like a segfaulting extension."""

    def write(self, *args, **kwargs):
        os.abort()


class HangsOnWrite(ReferenceBackend):
    """``write`` never returns, like a kernel spinning on a lost semaphore."""

    def write(self, *args, **kwargs):
        while True:
            time.sleep(0.05)


class StickyDeviceError(ReferenceBackend):
    """The first write faults; from then on every call fails, like a CUDA context after an
    illegal memory access. Only this backend's worker process is poisoned."""

    def __init__(self):
        super().__init__()
        self.faulted = False

    def _check(self):
        if self.faulted:
            raise RuntimeError("device error: an illegal memory access was encountered (sticky: every later call fails)")

    def allocate(self, buffer, spec):
        self._check()
        return super().allocate(buffer, spec)

    def write(self, *args, **kwargs):
        self.faulted = True
        self._check()


FAULTS = {"crash_on_write": CrashesOnWrite, "hang_on_write": HangsOnWrite, "sticky_device_error": StickyDeviceError}
