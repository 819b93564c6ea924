"""docs/SPEC.md and the checks point at each other: every normative clause is verified by a
check, every check names the clauses it verifies, and every name it uses exists."""

import importlib
import re

from kvconform.conformance.plugin.collection import SUITE, suite_dir

from .suite_runs import ROOT

CLAUSE_DOCUMENTS = ("docs/SPEC.md",)
CLAUSE = re.compile(r'<a id="([A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+)"></a>\*\*\1\*\*')


def spec_clauses() -> list[str]:
    found = []
    for name in CLAUSE_DOCUMENTS:
        path = ROOT / name
        if path.exists():
            found += CLAUSE.findall(path.read_text())
    return found


def check_clauses() -> dict[str, list[str]]:
    """``conformance/<file>::<check>`` -> the clause ids of its ``kvc_clause`` markers."""
    out = {}
    for path in sorted(suite_dir().glob("test_*.py")):
        module = importlib.import_module(f"{SUITE}.{path.stem}")
        for name, fn in vars(module).items():
            if name.startswith("test_") and callable(fn) and fn.__module__ == module.__name__:
                marks = [*getattr(module, "pytestmark", []), *getattr(fn, "pytestmark", [])]
                out[f"conformance/{path.name}::{name}"] = [c for m in marks if m.name == "kvc_clause" for c in m.args]
    return out


def test_spec_clause_ids_are_unique():
    clauses = spec_clauses()
    assert clauses and len(clauses) == len(set(clauses)), sorted(c for c in clauses if clauses.count(c) > 1)


def test_every_check_names_the_clauses_it_verifies():
    assert [check for check, clauses in check_clauses().items() if not clauses] == []


def test_every_clause_a_check_names_is_in_the_spec():
    known = set(spec_clauses())
    assert {check: sorted(set(c) - known) for check, c in check_clauses().items() if set(c) - known} == {}


def test_every_clause_of_the_spec_is_verified_by_a_check():
    verified = {c for clauses in check_clauses().values() for c in clauses}
    assert [c for c in spec_clauses() if c not in verified] == []


def test_code_and_docs_cite_spec_clauses_not_the_external_layout_spec():
    files = [p for pattern in ("**/*.py", "**/*.md", "**/*.txt", "**/*.j2") for p in ROOT.glob(pattern)
             if not p.relative_to(ROOT).parts[0].startswith(".") and "runs" not in p.parts]
    assert [str(p.relative_to(ROOT)) for p in files if "LAYOUT_SPEC" in p.read_text(errors="replace") and p.name != "test_spec_clauses.py"] == []
