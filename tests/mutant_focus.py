"""A pytest plugin for kvconform's own mutant runs (``-p tests.mutant_focus``): each seeded
fault runs only the check families it is aimed at (``Mutant.catches``), the only ones
test_mutants_are_caught asserts on. Correct backends still run every check. Deselected tests
are announced through ``pytest_deselected``, so the run's results say it was filtered."""

import pytest

from kvconform.backends_under_test.mutants import MUTANTS
from kvconform.backends_under_test.registry import MUTANT_PREFIX
from kvconform.conformance.plugin.collection import PLANNED


@pytest.hookimpl(trylast=True)  # after kvconform's own hook has planned each test
def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        planned = item.stash.get(PLANNED, None)
        name = planned.backend if planned else ""
        aimed = name.startswith(MUTANT_PREFIX) and planned.family in MUTANTS[name.removeprefix(MUTANT_PREFIX)].catches
        (keep if aimed or not name.startswith(MUTANT_PREFIX) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
