"""The own tests on two workers: modules that read one session fixture share a worker, the longest
groups start first, and a worker's nested suite runs do not take themselves for xdist workers."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

from . import worker_groups as W
from .suite_runs import ROOT, run_suite

# In a suite run: is the own tests' conftest imported, and still a plugin once the run is configured?
CONFTEST_PROBE = """
import json, os, sys

def pytest_sessionstart(session):
    conftest = sys.modules.get("tests.conftest")
    seen = {"imported": conftest is not None, "plugin": conftest is not None and session.config.pluginmanager.is_registered(conftest)}
    with open(os.environ["KVC_PROBE_OUT"], "w") as out:
        json.dump(seen, out)
"""


def synthetic_tests(tmp_path, files: dict[str, str]):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_modules_reading_one_session_fixture_form_one_group(tmp_path):
    root = synthetic_tests(tmp_path, {
        "conftest.py": "import pytest\n@pytest.fixture(scope='session')\ndef runs():\n    return 1\n",
        "test_b.py": "import pytest\n@pytest.fixture\ndef built(runs):\n    return runs\ndef test_one(built):\n    pass\n",
        "test_a.py": "def test_two(runs):\n    pass\n",
        "test_c.py": "def test_three(tmp_path):\n    pass\n",
    })
    assert W.groups.__wrapped__(root) == {"test_a.py": "test_a.py", "test_b.py": "test_a.py", "test_c.py": "test_c.py"}


def test_the_checkouts_shared_runs_are_grouped_with_their_readers():
    groups = W.groups()
    assert groups["test_mutants_are_caught.py"] == groups["test_coverage.py"]  # builtin_documents
    assert {groups[m] for m in ("test_vllm_adapter.py", "test_vllm_mla.py", "test_vllm_quant.py", "test_vllm_regressions.py")} == {groups["test_vllm_adapter.py"]}
    assert groups["test_byte_map.py"] == "test_byte_map.py"


def test_every_longest_first_name_is_a_test_module_of_the_checkout():
    assert [m for m in W.LONGEST_FIRST if m not in W.groups()] == []


def test_the_longest_groups_come_first_each_group_together():
    ids = ["tests/test_byte_map.py::t1", "tests/test_coverage.py::t2", "tests/test_byte_map.py::t3",
           "tests/test_aiter_adapter.py::t4", "tests/test_mutants_are_caught.py::t5"]
    ordered = [item.nodeid for item in W.order([SimpleNamespace(nodeid=i) for i in ids])]
    assert ordered == ["tests/test_coverage.py::t2", "tests/test_mutants_are_caught.py::t5", "tests/test_aiter_adapter.py::t4",
                       "tests/test_byte_map.py::t1", "tests/test_byte_map.py::t3"]


def test_a_worker_forgets_the_xdist_variables_its_suite_runs_would_inherit(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_TESTRUNUID", "abc")
    W.forget_being_a_worker()
    assert not [n for n in os.environ if n.startswith("PYTEST_XDIST_")]


def test_a_suite_run_started_in_the_checkouts_root_leaves_the_own_tests_plugin_out(tmp_path):
    """pytest loads tests/conftest.py into it (its initial conftests come from the invocation
    directory's test* folders); the own tests' scheduler and ordering must not reach it."""
    (tmp_path / "conftest_probe.py").write_text(CONFTEST_PROBE)
    out = tmp_path / "seen.json"
    result = run_suite(tmp_path, "-p", "conftest_probe", "-n", "2", "--kvc-backend", "reference", "-m", "shape", cwd=ROOT,
                       env={"PYTHONPATH": str(tmp_path), "KVC_PROBE_OUT": str(out)})
    assert result.returncode == 0, result.output
    assert json.loads(out.read_text()) == {"imported": True, "plugin": False}
