"""A pytest plugin for kvconform's own mutant runs (``-p tests.mutant_focus``): each seeded
fault runs only the checks it names in ``Mutant.kills`` — at least one of each family in its
``catches`` — the only ones test_mutants_are_caught asserts on. Over whole families the run
took 8 335 mutant tests (3 093 of them passing) and 562 s on two cores; on the named checks 891,
and 150 s with the reference's 470 (docs/PERFORMANCE.md). Correct backends still run every check.
Deselected tests are announced through ``pytest_deselected``, so the run's results say it was filtered."""

import pytest

from kvconform.backends_under_test.mutants import MUTANTS
from kvconform.backends_under_test.registry import MUTANT_PREFIX
from kvconform.conformance.plugin.collection import PLANNED


def aimed(item) -> bool:
    planned = item.stash.get(PLANNED, None)
    name = planned.backend if planned else ""
    if not name.startswith(MUTANT_PREFIX):
        return True
    mutant = MUTANTS[name.removeprefix(MUTANT_PREFIX)]
    return planned.family in mutant.catches and item.originalname in mutant.kills


@pytest.hookimpl(trylast=True)  # after kvconform's own hook has planned each test
def pytest_collection_modifyitems(config, items):
    keep, drop = [], []
    for item in items:
        (keep if aimed(item) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
