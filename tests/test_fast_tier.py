"""The fast tier (``./kvc test --fast``, tests/fast_tier.py) touches every test module."""

import subprocess
import sys
from pathlib import Path

import pytest

from .fast_tier import NOT_IN_TIER, Measured, module_of, select

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
    measured = {n: Measured(s) for n, s in {"tests/test_a.py::test_slow": 50.0, "tests/test_a.py::test_slower": 70.0,
                "tests/test_b.py::test_quick": 0.1, "tests/test_b.py::test_quick_too": 0.2, "tests/test_b.py::test_slow": 9.0}.items()}
    assert set(select(measured, budget_s=51.0)) == {"tests/test_a.py::test_slow", "tests/test_b.py::test_quick", "tests/test_b.py::test_quick_too"}
    assert set(select(measured, budget_s=1.0)) == {"tests/test_a.py::test_slow", "tests/test_b.py::test_quick"}


def test_a_test_that_skipped_where_it_was_measured_only_represents_its_module():
    measured = {n: Measured(s) for n, s in {"tests/test_vllm.py::test_a": 0.0, "tests/test_vllm.py::test_b": 0.0, "tests/test_c.py::test_c": 1.0}.items()}
    chosen = select(measured, budget_s=100.0, skipped=frozenset({"tests/test_vllm.py::test_a", "tests/test_vllm.py::test_b"}))
    assert set(chosen) == {"tests/test_vllm.py::test_a", "tests/test_c.py::test_c"}


def test_a_shared_fixtures_set_up_is_charged_to_the_first_chosen_test_that_requests_it():
    """In a full run a module fixture's minutes are recorded against the one test that paid for them;
    the module's other tests look free but would pay it again in the tier (6 min 29 s instead of ~1)."""
    measured = {
        "tests/test_m.py::test_paid": Measured(140.0, setup=138.0, shared=("mutant_runs",)),
        "tests/test_m.py::test_free_looking": Measured(0.2, setup=0.0, shared=("mutant_runs",)),
        "tests/test_m.py::test_alone": Measured(3.0),
        "tests/test_n.py::test_n": Measured(1.0),
    }
    chosen = select(measured, budget_s=120.0)
    assert set(chosen) == {"tests/test_m.py::test_alone", "tests/test_n.py::test_n"}
    wider = select(measured, budget_s=200.0)  # the first to request the fixture pays it; the next, only its own seconds
    assert wider == pytest.approx({"tests/test_m.py::test_alone": 3.0, "tests/test_n.py::test_n": 1.0,
                                   "tests/test_m.py::test_free_looking": 138.2, "tests/test_m.py::test_paid": 2.0})
