"""A pytest plugin (``-p tests.hides_failures``) that does what pytest-rerunfailures does to a test
that fails and then passes on a rerun, or any plugin that rewrites reports: the failing call
report pytest sees is made a pass. kvconform's verdict must still decide every output."""

import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: it has the last word on the report
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        report.outcome, report.longrepr = "passed", None
