"""A backend module that "aligns" kvconform.reference.copy_blocks with its bug at import and then
re-takes the oracle guard's record, so the in-process guard sees nothing changed: only the canary
(conformance/harness/canary.py) is left to notice (tests/test_canary.py). Imported only by the
runs and tests that load it."""

import torch

from kvconform import reference as R
from kvconform.backends_under_test.contract import Capabilities
from kvconform.backends_under_test.reference_backend import ReferenceBackend
from kvconform.conformance.harness import oracle_guard

from .hostile_backends import drop_last_pair

R.copy_blocks = drop_last_pair(R.copy_blocks)
oracle_guard._PRISTINE = oracle_guard.take()  # the guard's record now holds the patched oracle


class PatchesTheReferenceAndTheGuard(ReferenceBackend):
    """Its copy_blocks is the reference's, patched above: it skips the last ``[src, dst]`` pair, and
    so does the oracle. It declares little (one layout, bf16, write and copy) so that its certified
    run is short."""

    def __init__(self):
        super().__init__()
        self._capabilities = Capabilities(layouts=(R.blocks_first("NHD"),), ops=frozenset({"write", "copy"}), standards=frozenset({"e1"}),
                                          dtypes=(torch.bfloat16,), head_sizes=(64,), block_sizes=(16,), num_kv_heads=(2,))
