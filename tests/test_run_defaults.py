"""Options a run does not give come from what its backends declare (conformance/plugin/run_plan.py):
the layout standard the named backends share, a usage error when they disagree, and the
backends' own per-test timeout (vLLM's adapters: 300 s)."""

from __future__ import annotations

import pytest

from kvconform.backends_under_test.registry import Loaded
from kvconform.backends_under_test.reference_backend import ReferenceBackend, e3_model, kv_first_model
from kvconform.conformance.plugin.run_plan import default_standard, default_timeout
from kvconform.errors import InputError

from .suite_runs import KV_CHECKS, run_suite


def loaded(**backends):
    return {name: Loaded(name, backend=backend) for name, backend in backends.items()}


def test_the_standard_every_named_backend_declares_is_chosen():
    assert default_standard(None, loaded(a=e3_model()), explicit=True) == "e3"
    assert default_standard(None, loaded(a=ReferenceBackend(), b=kv_first_model()), explicit=True) == "e1"
    assert default_standard("e1", loaded(a=e3_model()), explicit=True) == "e1"  # given wins


def test_backends_declaring_different_standards_need_one_given():
    with pytest.raises(InputError, match="a: e1, b: e3"):
        default_standard(None, loaded(a=ReferenceBackend(), b=e3_model()), explicit=True)
    assert default_standard(None, loaded(a=ReferenceBackend(), b=e3_model()), explicit=False) == "e1"  # the default set


def test_a_backend_default_timeout_applies_unless_one_is_given():
    slow = ReferenceBackend()
    slow.default_timeout = 300.0
    assert default_timeout(None, loaded(a=ReferenceBackend(), b=slow)) == 300.0
    assert default_timeout(5.0, loaded(b=slow)) == 5.0
    assert default_timeout(None, loaded(a=ReferenceBackend())) is None


def test_mixed_standards_without_standard_is_a_usage_error_naming_the_option(tmp_path):
    result = run_suite(tmp_path, "--backend", "reference,reference_e3", "-k", "shape")
    assert result.returncode == 4 and "--kvc-standard" in result.output and result.document is None


def test_an_e3_only_backend_is_checked_against_e3_when_no_standard_is_given(tmp_path):
    result = run_suite(tmp_path, "--backend", "reference_e3", "-k", f"shape and {KV_CHECKS}")
    assert result.document["environment"]["standard"] == "e3" and result.outcomes("reference_e3", "shape") == {"passed"}
