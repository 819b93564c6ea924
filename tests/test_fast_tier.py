"""The fast tier (``./kvc test --fast``, tests/fast_tier.py) touches every test module."""

import subprocess
import sys
from pathlib import Path

from .fast_tier import NOT_IN_TIER, module_of, select

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def test_every_test_module_has_a_test_in_the_fast_tier():
    collected = subprocess.run([sys.executable, "-m", "pytest", "tests", "--fast", "--collect-only", "-q", "-p", "no:randomly"],
                               cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    represented = {module_of(line) for line in collected.stdout.splitlines() if "::" in line}
    modules = {f"tests/{path.name}" for path in TESTS.glob("test_*.py")}
    missing = sorted(modules - represented - set(NOT_IN_TIER))
    assert not missing, (f"test modules with no test in the fast tier: {missing}; regenerate tests/fast_tier.txt "
                         f"(tests/fast_tier.py says how) or add one cheap node id of each by hand")


def test_the_selection_keeps_each_modules_cheapest_test_then_fills_the_budget_cheapest_first():
    measured = {"tests/test_a.py::test_slow": 50.0, "tests/test_a.py::test_slower": 70.0,
                "tests/test_b.py::test_quick": 0.1, "tests/test_b.py::test_quick_too": 0.2, "tests/test_b.py::test_slow": 9.0}
    assert set(select(measured, budget_s=51.0)) == {"tests/test_a.py::test_slow", "tests/test_b.py::test_quick", "tests/test_b.py::test_quick_too"}
    assert set(select(measured, budget_s=1.0)) == {"tests/test_a.py::test_slow", "tests/test_b.py::test_quick"}


def test_a_test_that_skipped_where_it_was_measured_only_represents_its_module():
    measured = {"tests/test_vllm.py::test_a": 0.0, "tests/test_vllm.py::test_b": 0.0, "tests/test_c.py::test_c": 1.0}
    chosen = select(measured, budget_s=100.0, skipped=frozenset({"tests/test_vllm.py::test_a", "tests/test_vllm.py::test_b"}))
    assert set(chosen) == {"tests/test_vllm.py::test_a", "tests/test_c.py::test_c"}
