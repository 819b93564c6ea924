"""The package's shape: one ``kvconform`` namespace, floors that import one way, no import cycles.

Floors, lowest first: ``reference`` (the spec) ← ``kvconform.compat`` (the runtime handshake check
a connector imports) ← ``backends_under_test`` ← ``conformance`` (the checks and the pytest plugin);
``reports`` is a plain library from results JSON to matrix / HTML, importing only ``reference`` and
``kvconform.compat``; the ``kvconform`` command sits on top. Every import of ours
is counted, also the ones inside functions.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

from .suite_runs import ROOT

PACKAGES = ("reference", "backends_under_test", "conformance", "reports")
RUNTIME = {"kvconform.compat": "compat"}  # namespace-root modules a connector imports at run time: a floor of their own
MAY_IMPORT = {
    "reference": {"reference"},
    "compat": {"reference"},
    "backends_under_test": {"reference", "compat", "backends_under_test"},
    "reports": {"reports", "reference", "compat"},
    "conformance": {"conformance", "reference", "compat", "backends_under_test", "reports"},
    "": {"", "compat", *PACKAGES},  # kvconform/ itself: the command
}
BARE = set(PACKAGES)  # top-level names that exist only in a checkout


def module_files() -> dict[str, Path]:
    files = {f"kvconform.{p.stem}" if p.stem != "__init__" else "kvconform": p for p in (ROOT / "kvconform").glob("*.py")}
    for package in PACKAGES:
        for path in (ROOT / package).glob("*.py"):
            files[f"kvconform.{package}" + ("" if path.stem == "__init__" else f".{path.stem}")] = path
    return files


def imports_of(module: str, path: Path, files) -> set[str]:
    is_package = path.stem == "__init__"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for alias in node.names:  # `from pkg import module` imports the module, `from pkg import name` the package
                found.add(f"{target}.{alias.name}" if f"{target}.{alias.name}" in files else target)
    return found


@pytest.fixture(scope="module")
def graph():
    files = module_files()
    return {module: {i for i in imports_of(module, path, files) if i in files and i != module} for module, path in files.items()}, files


def floor(module: str) -> str:
    if module in RUNTIME:
        return RUNTIME[module]
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else ""


def test_no_module_imports_a_bare_top_level_package_of_the_checkout():
    offenders = []
    for path in [*(ROOT / "kvconform").glob("*.py"), *(p for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")),
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
