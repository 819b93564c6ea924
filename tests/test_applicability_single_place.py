"""Every not-applicable reason is built in one module: a ``NotApplicable``, ``NotApplicableHere`` or
``OpUnavailable`` is constructed only in conformance/harness/applicability.py (the reasons checks and
the harness give) and in backends_under_test/ (a backend's code path that cannot run here). Checks
call applicability's functions (``undeclared``, ``no_digest_for``, ``unavailable_…``) instead.

Read as a static reader sees the source (AST over every module of the wheel's packages), so a call
inside a function, a bare ``raise``, an attribute (``applicability.NotApplicable(…)``) or a name
imported under an alias counts too. And a new need is what docs/ARCHITECTURE.md says: one row.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvconform.conformance.harness import applicability as A

from .import_graph import modules, package_dirs
from .suite_runs import ROOT

REASON_TYPES = {"NotApplicable", "NotApplicableHere", "OpUnavailable"}
ALLOWED = ("kvconform.conformance.harness.applicability", "kvconform.backends_under_test")


def constructions(path: Path) -> list[int]:
    """The lines of ``path`` that construct (call, or raise bare) a reason type, under any name."""
    tree = ast.parse(path.read_text(), str(path))
    aliases = {alias.asname for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               for alias in node.names if alias.name in REASON_TYPES and alias.asname}
    names = REASON_TYPES | aliases

    def is_reason_type(expr: ast.expr | None) -> bool:
        return (isinstance(expr, ast.Name) and expr.id in names) or (isinstance(expr, ast.Attribute) and expr.attr in REASON_TYPES)

    return sorted(node.lineno for node in ast.walk(tree)
                  if (isinstance(node, ast.Call) and is_reason_type(node.func)) or (isinstance(node, ast.Raise) and is_reason_type(node.exc)))


def misplaced(names: dict[str, Path], root: Path) -> list[str]:
    """``file:line`` of each construction outside the allowed modules."""
    return [f"{path.relative_to(root)}:{line}" for name, path in sorted(names.items())
            if not any(name == allowed or name.startswith(allowed + ".") for allowed in ALLOWED)
            for line in constructions(path)]


def test_reasons_are_constructed_only_in_the_applicability_module_and_backends():
    names = modules(package_dirs(ROOT))
    assert "kvconform.conformance.harness.applicability" in names and len(names) > 100, "the scan lost the tree"
    assert misplaced(names, ROOT) == []


def test_a_reason_built_anywhere_else_is_named_by_file_and_line(tmp_path):
    built = ("from .harness.applicability import NotApplicable, NotApplicableHere\n"
             "from kvconform.backends_under_test.contract import OpUnavailable as Gone\n"
             "from .harness import applicability\n"
             "def test_x(case):\n"
             "    raise NotApplicableHere(NotApplicable('declaration', 'backend x', 'lacks y'))\n"
             "def helper():\n"
             "    raise Gone\n"
             "REASON = applicability.NotApplicable('run', 'this run', 'lacks z')\n")
    files = {name: tmp_path / f"{name}.py" for name in
             ("kvconform.conformance.test_x", "kvconform.conformance.harness.applicability", "kvconform.backends_under_test.vllm_x")}
    for path in files.values():
        path.write_text(built)
    assert misplaced(files, tmp_path) == [f"kvconform.conformance.test_x.py:{line}" for line in (5, 5, 7, 8)]


class Marked:
    """What needs_of reads of a collected check: its kvc_needs markers, no other marker."""

    def __init__(self, *features: str):
        self.marks = [pytest.mark.kvc_needs(feature).mark for feature in features]

    def get_closest_marker(self, name):
        return None

    def iter_markers(self, name):
        return [mark for mark in self.marks if mark.name == name]


def test_a_new_need_is_one_row_of_the_table(monkeypatch):
    monkeypatch.setitem(A.NEEDS, "warp_drive", A.Need(A.DECLARATION, lambda ctx: f"backend {ctx.backend.name}", lambda ctx, _: "declares no warp drive"))
    needs = A.needs_of(Marked("warp_drive"))
    assert ("warp_drive", None) in needs
    ctx = A.Context(backend=SimpleNamespace(name="b", capabilities=SimpleNamespace(standards=())), layout=None, standard="e1", device="cpu", huge=False, compare_digests=False)
    assert A.not_applicable(ctx, needs) == A.NotApplicable(A.DECLARATION, "backend b", "declares no warp drive")
    with pytest.raises(ValueError, match="unknown feature 'op'"):  # a row another marker states is no kvc_needs feature
        A.needs_of(Marked("op"))
