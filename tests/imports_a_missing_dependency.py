"""A backend module that is found but whose import fails: the vendor's adapter imports a runtime
library this environment lacks. Its checks error in its own cells while other backends run
(tests/test_runner.py, tests/test_fault_isolation.py); a module that is not found at all is a
usage error instead (registry.missing_module)."""

import kvconform_test_missing_vendor_runtime  # noqa: F401  (absent on purpose)

from kvconform.backends_under_test.reference_backend import ReferenceBackend


class Backend(ReferenceBackend):
    """Never made: the import above fails first."""
