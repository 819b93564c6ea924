"""The own tests on two workers: modules that read one session fixture share a worker, the longest
groups start first, and a worker's nested suite runs do not take themselves for xdist workers."""

from __future__ import annotations

import os
from types import SimpleNamespace

from . import worker_groups as W


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
