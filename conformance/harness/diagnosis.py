"""Where the wrong bytes came from: a failed byte comparison explained in logical coordinates.

:func:`diagnose` takes the expected and actual arena bytes (guard + cache + guard), the initial
(pre-op) bytes when the caller kept them, the cache's spec, the differing element indices and,
for a write, its inputs. It groups the wrong elements by logical coordinate and explains each
group where the bytes allow it, with a fault class from the fixed vocabulary :data:`FAULTS`::

    kv-swapped: K[b=1, s=15, h=0..3] holds V[b=1, s=15]'s bytes: K and V swapped; V[b=1, s=15] is untouched
    never-written: V[b=1, s=15, h=0..3] was never written: it still holds its initial bytes; its bytes are at K[b=1, s=15]

Explanations are tried in a fixed order, each on the elements the earlier ones left:

1. a guard byte changed (``out-of-bounds``), or a padding byte of a padded page;
2. the element still holds its initial bytes though the op writes it (``never-written``) —
   taken here only where that is unmistakable (elements of 2+ bytes, or a whole row of a 1-byte
   cache; otherwise it competes in step 6);
3. the bytes are where a layout derived from the declared one by one confusion puts them
   (kv-first for blocks-first, HND for NHD, V in K's tile form, x of another element size):
   ``wrong-layout``, when that explains two thirds of what is left;
4. the bytes, with ``WINDOW`` bytes of context, are found exactly once at another element of the
   expected cache: the element holds that element's bytes (``kv-swapped``, ``neighbour-slot``,
   ``neighbour-block``, ``other-layer``, ``other-head``, ``other-element``); a move found for part
   of a row is then tried, element by element, on the rest of that row;
5. a whole row equals an input row that a write must not store (``padding-written``,
   ``extra-row``);
6. the same element under a transformation — never written, an fp8 code of another format,
   fnuz vs fn, the scale inverted or swapped, a constant factor, one bit, a rounding step, a
   value cast, reversed bytes, zeros. Single 1-byte elements match some of these by chance, so
   they compete: the transformation that explains the most elements of this failure goes first,
   and each is taken in a (layer, block, kv) group only where it explains at least half of what
   is left there;
7. an element whose expected bytes another element holds: the far end of a move;
8. an element the op leaves that changed: ``stray-write`` (``neighbour-block`` /
   ``neighbour-slot`` when it lies right next to bytes the op wrote correctly: a copy that ran on);
9. ``unexplained``.

Every address comes from the reference's offset map (:func:`R.offset_map` of the declared layout,
or of a layout derived from it by permuting its dimension list); fp8 transforms use
reference/fp8.py. The work is vectorised and capped: at most ``EXAMINED`` differing elements
are explained (a ``not-examined`` finding says how many were not), and caches past
``WHOLE_MAP`` elements are mapped only in the blocks the differences touch.

The work is split along its steps: ``diagnosis_grid`` locates the differing elements (arena
element ↔ grid index ↔ logical coordinates), ``diagnosis_examined`` holds what is known of each
examined element, ``diagnosis_steps`` runs steps 1–9 in their order (step 6's transformations in
``diagnosis_transforms``), ``diagnosis_wording`` groups the classified elements and words each
group; ``diagnosis_faults`` holds the vocabulary and the records they share.
"""

from __future__ import annotations

import contextlib

import torch

from . import diagnosis_steps, diagnosis_wording
from .diagnosis_examined import Examined
from .diagnosis_faults import EXAMINED, FAULTS, Finding, Span, WriteInputs
from .diagnosis_grid import WHOLE_MAP, Grid, distinct_rows, grid_for

# What the harness and the own tests import from here.
__all__ = ["EXAMINED", "FAULTS", "WHOLE_MAP", "Finding", "Grid", "Span", "WriteInputs", "diagnose", "distinct_rows", "grid_for",
           "one_thread"]


def diagnose(spec, expected: torch.Tensor, actual: torch.Tensor, differing: torch.Tensor, *, guard: int,
             initial: torch.Tensor | None = None, writes: WriteInputs | None = None, zero_fill: bool = False,
             grid: Grid | None = None) -> list[Finding]:
    """Findings for the differing arena elements (indices in cache-dtype units from the arena
    start, ascending). ``expected``, ``actual``, ``initial``: the uint8 arena bytes (guard + cache +
    guard) on the CPU. ``zero_fill``: the arena reads zeros where nothing wrote (lazily mapped).

    Runs on one CPU thread: its tensors are small, and a busy machine's thread pool costs more
    than it gives (searchsorted and isin ran 7-15 times slower on two loaded cores)."""
    with one_thread():  # EXAMINED read per call: a test lowers it here
        examined = Examined(spec, expected, actual, differing, guard, initial, writes, zero_fill,
                            grid or grid_for(spec, guard, differing, EXAMINED), EXAMINED)
        diagnosis_steps.classify(examined)
        return diagnosis_wording.findings(examined)


@contextlib.contextmanager
def one_thread():
    """torch on one CPU thread for the block (small tensors; see :func:`diagnose`)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
