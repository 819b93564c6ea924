"""The package's shape: one ``kvconform`` namespace, floors that import one way, no import cycles.

Floors, lowest first (docs/ARCHITECTURE.md): ``reference`` (the spec, with ``compat``, the runtime
handshake check a connector imports) ← ``backends_under_test`` ← the suite: ``conformance.harness``
(what checks are written with) ← the checks (``conformance/test_*.py``) and ``conformance.plugin``
(the pytest plugin), which do not import each other; ``reports`` is a plain library from results
JSON to matrix / HTML, importing only ``reference``; the ``kvconform`` package (the command, the
public ``kvconform.compat``, the stand-alone tools) sits on top. Below them all, ``kvconform.errors``:
the one error type of bad input, which every floor raises and which imports nothing of ours (so the
pytest plugin loads it without torch). Every module of every subpackage and every import of ours
is counted, also the ones inside functions.
"""

from __future__ import annotations

import ast
from collections import defaultdict

import pytest

from .import_graph import imports, modules, package_dirs
from .suite_runs import ROOT

DIRS = package_dirs(ROOT)  # the wheel's mapping (pyproject.toml force-include), read, not copied
PACKAGES = tuple(name.split(".")[1] for name in DIRS if name != "kvconform")
SUITE = {"reference", "backends_under_test", "reports"}
ERRORS = "kvconform.errors"
MAY_IMPORT = {
    "errors": set(),
    "reference": {"reference", "errors"},
    "backends_under_test": {"reference", "backends_under_test", "errors"},
    "reports": {"reports", "reference", "errors"},
    "harness": {"harness", "errors", *SUITE},
    "checks": {"harness", "errors", *SUITE},
    "plugin": {"plugin", "harness", "errors", *SUITE},
    "conformance": set(),  # the package's __init__: its docstring is the table of roles
    "": {"", "checks", "harness", "plugin", "conformance", "errors", *PACKAGES},  # kvconform/ itself: the command, the public compat, the tools
}
BARE = set(PACKAGES)  # top-level names that exist only in a checkout


@pytest.fixture(scope="module")
def graph():
    files = modules(DIRS)
    edges = {module: set() for module in files}
    for module, path in files.items():
        for i in imports(module, path):  # `from pkg import module` imports the module, `from module import name` the module
            target = f"{i.module}.{i.name}" if f"{i.module}.{i.name}" in files else i.module
            if target in files and target != module:
                edges[module].add(target)
    return edges, files


def floor(module: str) -> str:
    if module == ERRORS:
        return "errors"
    parts = module.split(".")
    if len(parts) < 2 or parts[1] not in PACKAGES:
        return ""
    if parts[1] != "conformance":
        return parts[1]
    if len(parts) == 2:
        return "conformance"
    return parts[2] if parts[2] in ("harness", "plugin") else "checks"


def test_every_subpackage_is_counted(graph):
    _, files = graph
    assert {"kvconform.conformance.harness.case", "kvconform.conformance.plugin.verdict", "kvconform.conformance.test_write",
            "kvconform.reference.compat"} <= set(files)


def test_no_module_imports_a_bare_top_level_package_of_the_checkout():
    offenders = []
    for path in [*(ROOT / "kvconform").glob("*.py"), *(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")),
                 *ROOT.glob("tests/**/*.py"), *ROOT.glob("benchmarks/*.py"), *ROOT.glob("examples/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
            offenders += [f"{path.relative_to(ROOT)}: import {n}" for n in names if n and n.split(".")[0] in BARE]
    assert offenders == []


def test_each_floor_imports_only_the_floors_below_it(graph):
    edges, _ = graph
    wrong = [f"{a} -> {b}" for a, targets in edges.items() for b in targets if floor(b) not in MAY_IMPORT[floor(a)]]
    assert wrong == []


def test_the_reports_library_imports_neither_backends_nor_the_suite(graph):
    edges, _ = graph
    assert not [b for a, targets in edges.items() if floor(a) == "reports" for b in targets if floor(b) in ("backends_under_test", "conformance")]


def test_no_two_modules_import_each_other_directly_or_in_a_loop(graph):
    edges, _ = graph
    state, cycles = defaultdict(int), []

    def visit(node, stack):
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state[nxt] == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [nxt]))
            elif state[nxt] == 0:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for module in sorted(edges):
        if state[module] == 0:
            visit(module, [module])
    assert cycles == []
