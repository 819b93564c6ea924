"""kvconform's own tests on several xdist workers (``KVCONFORM_TEST_WORKERS=N ./kvc test``, or
``-n N``): what must share a worker, and what starts first.

CI runs two (``.ci/run``): on its two cores a serial run left one idle while single-process tests
ran (docs/PERFORMANCE.md, 2026-12-05 fourth session); ``./kvc test`` runs one process unless asked.
The conditions below keep a run on workers right:

- a **group** is the unit a worker takes: a test module, or several modules that read one
  session-scoped fixture of tests/ (the built-in runs, the forked vLLM runs): a session fixture is
  made once per worker, so its readers must share one (:func:`groups`, read from the source);
- the **longest groups start first** (:data:`LONGEST_FIRST`, measured), so neither worker is left
  with a long group at the end while the other idles;
- the suite runs a worker starts are sessions of their own: xdist's ``PYTEST_XDIST_*`` variables
  are dropped from the worker's environment (:func:`forget_being_a_worker`), or every nested suite
  run would take itself for a worker (and, for one, not fork its own workers: ~2 s of CPU apiece).
"""

from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

from xdist.scheduler import LoadScopeScheduling

TESTS = Path(__file__).resolve().parent

# Measured in a clean-clone CI run (2026-12-05, serial): the modules whose tests and fixtures took
# a minute or more. Their groups start first, in this order; every other group follows in collection order.
LONGEST_FIRST = ("test_mutants_are_caught.py", "test_vllm_adapter.py", "test_aiter_adapter.py", "test_fault_isolation.py",
                 "test_report_in_chromium.py", "test_lmcache_adapter.py", "test_certify.py", "test_any_device.py")


def _session_fixtures(tree: ast.Module) -> set[str]:
    """Names of the functions decorated ``@pytest.fixture(scope="session")`` in one file."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and any(k.arg == "scope" and getattr(k.value, "value", None) == "session" for k in deco.keywords):
                    names.add(node.name)
    return names


def _parameters(tree: ast.Module) -> set[str]:
    return {a.arg for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) for a in node.args.args}


@functools.cache
def groups(root: Path = TESTS) -> dict[str, str]:
    """Test module (file name) -> its group: the alphabetically first module of those that read a
    session fixture it reads (through a test's or a fixture's parameters), itself otherwise."""
    trees = {path.name: ast.parse(path.read_text()) for path in sorted(root.glob("*.py"))}
    shared = set().union(*(_session_fixtures(tree) for tree in trees.values()))
    parent = {name: name for name in trees if name.startswith("test_")}

    def find(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    for fixture in sorted(shared):
        readers = sorted(name for name in parent if fixture in _parameters(trees[name]))
        for reader in readers[1:]:
            a, b = sorted((find(readers[0]), find(reader)))
            parent[b] = a
    return {name: find(name) for name in parent}


def group_of(nodeid: str) -> str:
    module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
    return groups().get(module, module)


def _rank(group: str) -> int:
    members = [m for m, g in groups().items() if g == group] or [group]
    return min((LONGEST_FIRST.index(m) for m in members if m in LONGEST_FIRST), default=len(LONGEST_FIRST))


def order(items: list) -> list:
    """The collection with each group's tests together, the longest groups first (stable otherwise):
    every worker computes the same order, as xdist requires."""
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(group_of(item.nodeid), len(first_seen))
    return sorted(items, key=lambda item: (_rank(group_of(item.nodeid)), first_seen[group_of(item.nodeid)]))


class GroupScheduling(LoadScopeScheduling):
    """xdist's scope scheduling with :func:`group_of` as the scope, in collection order."""

    def __init__(self, config, log=None):
        config.option.loadscopereorder = False  # by test count otherwise: the order above is by measured time
        super().__init__(config, log)

    def _split_scope(self, nodeid: str) -> str:
        return group_of(nodeid)


def forget_being_a_worker() -> None:
    for name in [n for n in os.environ if n.startswith("PYTEST_XDIST_")]:
        del os.environ[name]
