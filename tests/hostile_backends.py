"""Backends that attack the oracle instead of (or as well as) computing right, for
tests/test_oracle_isolation.py: each is what a vendor might do innocently ("align the spec with
our hardware's rounding") or a careless kernel does to its caller's tensors."""

from __future__ import annotations

import sys

from kvconform import reference as R
from kvconform.backends_under_test.reference_backend import ReferenceBackend


def drop_last_pair(copy_blocks):
    def copy_blocks_without_the_last_pair(storage, layout, g, block_mapping):
        return copy_blocks(storage, layout, g, block_mapping[:-1])

    return copy_blocks_without_the_last_pair


class CopyBlocksDropsTheLastPair(ReferenceBackend):
    """A copy_blocks that skips the last ``[src, dst]`` pair: the bug itself, without any patch."""

    def copy_blocks(self, cache, block_mapping, spec):
        super().copy_blocks(cache, block_mapping[:-1], spec)


class PatchesTheReferenceInItsOp(CopyBlocksDropsTheLastPair):
    """The same bug; the oracle is "aligned" the first time its copy_blocks runs."""

    def copy_blocks(self, cache, block_mapping, spec):
        if not getattr(R.copy_blocks, "aligned", False):
            R.copy_blocks = drop_last_pair(R.copy_blocks)
            R.copy_blocks.aligned = True
        super().copy_blocks(cache, block_mapping, spec)


class RewritesTheExpectedArena(ReferenceBackend):
    """Writes nothing, then finds the harness's expected arena in its caller's frames and makes
    it equal the cache it did not write: what no in-process guard can stop (docs/RELIABILITY.md)."""

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        frame = sys._getframe(1)
        while frame is not None:
            expected = frame.f_locals.get("expected")
            arena = frame.f_locals.get("arena")
            if expected is not None and arena is not None and hasattr(expected, "buffer"):
                expected.buffer.copy_(arena.buffer.cpu())
                return
            frame = frame.f_back


class RaisesWithAnEscapeSequence(ReferenceBackend):
    """Its write raises, and prints, text holding terminal control sequences: an OSC that retitles
    the window and a CSI that clears the screen. pytest's failure text must show them as escapes."""

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        print("kernel log \x1b[2J")
        raise RuntimeError("kernel said: \x1b]0;pwned\x07 \x1b[2J")


class RaisesWithALoneSurrogate(ReferenceBackend):
    """Its write raises an exception whose message holds a lone surrogate (text decoded with
    ``surrogateescape`` from a C library's bytes): every report must still be written."""

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        raise RuntimeError("kernel said: \ud800\udcff bytes")


class PatchesTheReferenceWhileItShips(ReferenceBackend):
    """Ships right; describing its layout "aligns" kvconform.reference.copy_blocks, in the device
    process of a transfer between devices (tests/test_multi_device.py)."""

    def layout_descriptor(self, *args, **kwargs):
        R.copy_blocks = drop_last_pair(R.copy_blocks)
        return super().layout_descriptor(*args, **kwargs)
