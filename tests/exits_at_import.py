"""Backend modules whose import ends the process (tests/test_one_verdict.py): ``sys.exit(0)``, or
``os._exit(0)`` (no Python clean-up, no results written) when KVC_TEST_HARD_EXIT is set."""

import os
import sys

from kvconform.backends_under_test.reference_backend import ReferenceBackend

if os.environ.get("KVC_TEST_HARD_EXIT"):
    os._exit(0)
sys.exit(0)


class Backend(ReferenceBackend):
    """Never made: the import above ends first."""
