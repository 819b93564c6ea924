"""A backend module that "aligns" the oracle with its bug when it is imported, as a vendor's
adapter module might: kvconform.reference.copy_blocks then drops the last pair, like its kernel
(tests/test_oracle_isolation.py). Imported only by the suite runs that load it."""

from kvconform import reference as R

from .hostile_backends import CopyBlocksDropsTheLastPair, drop_last_pair

R.copy_blocks = drop_last_pair(R.copy_blocks)


class PatchesTheReferenceAtImport(CopyBlocksDropsTheLastPair):
    """The bug, with the oracle patched to agree when this module is imported."""
