"""The layering, held statically: every ``kvconform.*`` import of the tree resolves to a real module
file through the build's one mapping (pyproject.toml's wheel ``force-include``; tests/import_graph.py),
and the layering contract below holds for every import, inside functions too.

The contract is declared here, beside the one checker that reads it, with the reason of each rule;
tests/test_package_layout.py holds the finer floor-by-floor order on the same graph. Each rule is
shown to fail on a synthetic tree that breaks it, so none of them can pass by matching nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from .import_graph import Import, imports, modules, package_dirs, unresolved
from .suite_runs import ROOT

# (importer, what it must not import, why): module-name prefixes, a prefix covering its submodules.
CONTRACT = (
    ("kvconform.reference", "kvconform.conformance",
     "the spec stands alone: the harness, the plugin and the checks compute from it, never it from them"),
    ("kvconform.reference", "kvconform.backends_under_test",
     "the spec is the oracle of the code under test; importing a backend would let it shape its own expected values"),
    ("kvconform.reference", "kvconform.reports", "the spec does not depend on how a run is shown"),
    ("kvconform.conformance.harness", "kvconform.conformance.plugin",
     "harness <- plugin: the checks are written with the harness, which must work without pytest's plugin"),
    ("kvconform.reports", "kvconform.conformance",
     "reports are a plain library from results JSON: they render a run without importing the suite"),
    ("kvconform.backends_under_test", "kvconform.conformance.plugin",
     "a backend (a vendor's adapter among them) is loaded by the plugin and must not depend on it"),
)
# (importer module, imported module): reason. An import the contract forbids but the tree keeps.
EXCEPTIONS: dict[tuple[str, str], str] = {}
# Files outside the packages whose kvconform.* imports must resolve too.
OTHER_IMPORTERS = ("conftest.py", "tests/**/*.py", "benchmarks/**/*.py", "examples/**/*.py")


def within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def all_imports(root: Path) -> list[Import]:
    found = [i for name, path in modules(package_dirs(root)).items() for i in imports(name, path)]
    return found + [i for pattern in OTHER_IMPORTERS for path in sorted(root.glob(pattern)) for i in imports("", path)]


def unresolved_imports(root: Path) -> list[str]:
    dirs = package_dirs(root)
    return [f"{i.where(root)}: {why}" for i in all_imports(root) if (why := unresolved(i, dirs))]


def contract_violations(root: Path, contract=CONTRACT, exceptions=EXCEPTIONS) -> list[str]:
    names = modules(package_dirs(root))
    found = []
    for i in all_imports(root):
        # `from package import module` imports the module; `from module import name`, the module.
        imported = f"{i.module}.{i.name}" if f"{i.module}.{i.name}" in names else i.module
        for importer, forbidden, why in contract:
            if within(i.importer, importer) and within(imported, forbidden) and (i.importer, imported) not in exceptions:
                found.append(f"{i.where(root)}: {i.importer} imports {imported} ({importer} must not import {forbidden}: {why})")
    return found


def test_every_kvconform_import_of_the_tree_resolves_to_a_module_file():
    assert unresolved_imports(ROOT) == []
    seen = all_imports(ROOT)
    assert len(seen) > 1000, f"the graph saw only {len(seen)} imports: it lost most of the tree's"
    assert {i.file.relative_to(ROOT).parts[0] for i in seen} >= {"kvconform", "reference", "conformance", "backends_under_test",
                                                                  "reports", "tests", "benchmarks", "examples"}


def test_the_tree_keeps_the_layering_contract():
    assert contract_violations(ROOT) == []
    names = modules(package_dirs(ROOT))
    assert all(importer in names and imported in names for importer, imported in EXCEPTIONS), "an exception names a module that is gone"


def test_the_module_names_are_the_wheels():
    names = modules(package_dirs(ROOT))
    assert names["kvconform.reference.layouts"] == ROOT / "reference" / "layouts.py"
    assert names["kvconform.conformance.plugin"] == ROOT / "conformance" / "plugin" / "__init__.py"
    assert names["kvconform.errors"] == ROOT / "kvconform" / "errors.py"


def synthetic_tree(tmp_path: Path, files: dict[str, str]) -> Path:
    """A tree with the real build mapping and the given files (each package gets its __init__.py)."""
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for package in package_dirs(tmp_path).values():
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").touch()
    for relative, text in files.items():
        path = tmp_path / relative
        for directory in path.relative_to(tmp_path).parents[:-1]:
            (tmp_path / directory).mkdir(parents=True, exist_ok=True)
            (tmp_path / directory / "__init__.py").touch()
        path.write_text(text)
    return tmp_path


def file_of(module: str, dirs: dict[str, Path], root: Path) -> str:
    prefix = max((p for p in dirs if within(module, p)), key=len)
    return str(dirs[prefix].relative_to(root).joinpath(*module[len(prefix) + 1:].split("."), "m.py"))


@pytest.mark.parametrize("rule", CONTRACT, ids=[f"{a}-must-not-import-{b}" for a, b, _ in CONTRACT])
def test_each_rule_of_the_contract_fails_a_tree_that_breaks_it(tmp_path, rule):
    importer, forbidden, _ = rule
    dirs = package_dirs(ROOT)  # the synthetic tree's, too: it has the same pyproject.toml
    importer_file, forbidden_file = file_of(importer, dirs, ROOT), file_of(forbidden, dirs, ROOT)
    root = synthetic_tree(tmp_path, {
        forbidden_file: "X = 1\n",
        importer_file: f"import os\n\ndef late():\n    from {forbidden}.m import X\n    return X\n",
    })
    assert unresolved_imports(root) == []
    found = contract_violations(root)
    assert [line.split(": ", 1)[0] for line in found] == [f"{importer_file}:4"], found
    assert f"must not import {forbidden}" in found[0]
    assert contract_violations(root, exceptions={(f"{importer}.m", f"{forbidden}.m"): "kept on purpose"}) == []


def test_a_relative_import_across_a_forbidden_line_is_caught(tmp_path):
    root = synthetic_tree(tmp_path, {"conformance/plugin/hooks.py": "X = 1\n",
                                     "conformance/harness/case.py": "from ..plugin.hooks import X\n"})
    assert [line.split(": ", 1)[0] for line in contract_violations(root)] == ["conformance/harness/case.py:1"]


def test_an_import_that_names_nothing_of_the_tree_is_named_by_file_and_line(tmp_path):
    root = synthetic_tree(tmp_path, {
        "reference/layouts.py": "from kvconform.errors import InputError\nLayout = object\n",
        "kvconform/errors.py": "class InputError(Exception):\n    pass\n",
        "reports/results.py": ("from kvconform.reference.layouts import Layout\n"
                               "from kvconform.reference.layouts import Gone\n"
                               "import kvconform.reference.gone\n"
                               "from .missing import y\n"
                               "from kvconform.reference import layouts\n"),
    })
    assert unresolved_imports(root) == [
        "reports/results.py:2: kvconform.reference.layouts (layouts.py) has no Gone",
        "reports/results.py:3: kvconform.reference.gone is no module of the tree",
        "reports/results.py:4: kvconform.reports.missing is no module of the tree",
    ]


def test_the_type_checker_reads_an_import_between_packages_by_its_wheel_name(tmp_path):
    pytest.importorskip("mypy", reason="mypy is installed by CI (.ci/run), not by ./kvc setup")
    from .typecheck import check

    root = synthetic_tree(tmp_path, {
        "reference/layouts.py": "def width() -> int:\n    return 1\n",
        "backends_under_test/contract.py": "from ..reference.layouts import width\n\ndef height() -> int:\n    return width()\n\nunchecked: int = ''\n",
        "reports/matrix.py": "from kvconform.backends_under_test.contract import height\n\nlabel: str = height()\n",
    })
    messages, checked = check(root, cache_dir=str(tmp_path / "mypy-cache"))
    assert checked == 4  # [tool.mypy] files: reference/ and reports/, each an __init__.py and a module
    assert [m for m in messages if "error" in m] == [  # backends_under_test/ is read for its types, not checked
        f'{root}/reports/matrix.py:3: error: Incompatible types in assignment (expression has type "int", variable has type "str")  [assignment]']
