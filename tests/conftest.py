"""Hypothesis budgets for kvconform's own tests (``KVCONFORM_TEST_PROFILE=quick|full``)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("quick", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("full", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("KVCONFORM_TEST_PROFILE", "quick"))
