"""Backends whose declarations are at odds with themselves (tests/test_declarations.py; loaded
with ``--kvc-backend tests.declaration_backends:NAME``): V quantised with K's scale, declared as a
vendor did in #38 — fp8_e4m3 without its alias fp8 — and with both."""

import dataclasses

from kvconform.backends_under_test.mutants.write import KScaleForVOnWrite


class E4m3WithoutItsAlias(KScaleForVOnWrite):
    name = "e4m3_without_alias"

    def __init__(self):
        super().__init__()
        self._capabilities = dataclasses.replace(self._capabilities, kv_cache_dtypes=("auto", "fp8_e4m3"))


class E4m3AndItsAlias(KScaleForVOnWrite):
    name = "e4m3_and_alias"

    def __init__(self):
        super().__init__()
        self._capabilities = dataclasses.replace(self._capabilities, kv_cache_dtypes=("auto", "fp8", "fp8_e4m3"))
