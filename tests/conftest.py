"""Hypothesis budgets for kvconform's own tests (``KVCONFORM_TEST_PROFILE=quick|full``), the
fast tier (``--fast``, tests/fast_tier.py), the suite runs against the real vLLM that several test
modules read, and the subprocesses started as collection ends (tests/background.py)."""

import atexit
import os

import pytest
from hypothesis import HealthCheck, settings

from kvconform.conformance.plugin import quiet_exit

from . import background, fast_tier
from .vllm_cpu import runs as vllm_cpu_runs

settings.register_profile("quick", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("full", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("KVCONFORM_TEST_PROFILE", "quick"))
atexit.register(quiet_exit.drop_triton_leak_report)  # our own runs end with pytest's summary too, not Triton's leak report


def pytest_addoption(parser):
    fast_tier.add_options(parser)


def pytest_configure(config):
    fast_tier.configure(config)


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
    background.start_for(session.items)


def pytest_sessionfinish(session):
    background.stop_all()
    vllm_cpu_runs.remove()
