"""Hypothesis budgets for kvconform's own tests (``KVCONFORM_TEST_PROFILE=quick|full``), the
fast tier (``--fast``, tests/fast_tier.py), the suite runs against the real vLLM that several test
modules read, and the subprocesses started as collection ends (tests/background.py)."""

import atexit
import os
import sys

import pytest
from hypothesis import HealthCheck, settings

from kvconform.conformance.plugin import quiet_exit

from kvconform import builtin_coverage

from . import background, fast_tier, worker_groups
from .suite_runs import run_suite
from .vllm_cpu import runs as vllm_cpu_runs

settings.register_profile("quick", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("full", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("KVCONFORM_TEST_PROFILE", "quick"))
atexit.register(quiet_exit.drop_triton_leak_report)  # our own runs end with pytest's summary too, not Triton's leak report


def pytest_addoption(parser):
    fast_tier.add_options(parser)


def pytest_configure(config):
    if _runs_the_suite(config):
        # A suite run started in the checkout's root (run_suite's default, `./kvc suite`) loads this file
        # too: given `--pyargs kvconform.conformance`, no path, pytest takes its initial conftests from
        # the invocation directory's test* folders. Nothing here is for it — the own tests' scheduler
        # would replace the suite's, and their ordering walk the suite's items (~1 s a worker).
        config.pluginmanager.unregister(sys.modules[__name__])
        return
    fast_tier.configure(config)
    if hasattr(config, "workerinput"):
        worker_groups.forget_being_a_worker()


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
    return worker_groups.GroupScheduling(config, log)


@pytest.hookimpl(trylast=True)  # after the fast tier's deselection
def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput"):
        items[:] = worker_groups.order(items)


@pytest.fixture(scope="session")
def builtin_documents(tmp_path_factory):
    """The runs docs/COVERAGE.md is made of (every built-in, quick profile, seed 0; E3 again):
    read by the coverage tests and, for the correct built-ins' verdicts, by the mutant tests —
    the interpreted Triton backends over every family are the costliest runs of the session."""
    runs = [run_suite(tmp_path_factory.mktemp("builtin"), "-n", "2", *args) for args in builtin_coverage.runs()]
    return [run.document for run in runs]


@pytest.fixture(scope="session")
def vllm_runs():
    """The single-process suite runs against the real vLLM (tests/vllm_cpu/runs.py), forked from
    one set-up and started as collection ended: name -> results document with its exit status."""
    python = os.environ.get("KVCONFORM_VLLM_PYTHON")
    if not python:
        pytest.fail("KVCONFORM_REQUIRE_VLLM=1 but KVCONFORM_VLLM_PYTHON is not set")
    return vllm_cpu_runs.results(python)


def pytest_collection_finish(session):
    if os.environ.get("KVCONFORM_VLLM_PYTHON"):
        vllm_cpu_runs.register(os.environ["KVCONFORM_VLLM_PYTHON"])
    # An xdist worker collects every test but runs only its groups: its jobs start when a fixture reads them.
    if not hasattr(session.config, "workerinput"):
        background.start_for(session.items)


def _runs_the_suite(config) -> bool:
    return bool(config.option.pyargs) and any(str(arg).startswith("kvconform.conformance") for arg in config.args)


def pytest_sessionfinish(session):
    background.stop_all()
    vllm_cpu_runs.remove()
