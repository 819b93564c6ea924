"""What the plugin shows of itself to a person and leans on in pytest (issue #22): every sweep
parameter is a documented fixture, runs that execute no test write no results, and the pytest
internals the plugin uses exist in the pytest versions it supports."""

from __future__ import annotations

import subprocess
import sys

import pytest
from _pytest.config.argparsing import Parser

from kvconform.conformance.plugin import hooks, options
from kvconform.conformance.plugin.collection import SuiteModule, suite_command

from . import fork_server

SWEEPS_AND_CASE = ("case", "cache_dtype", "fp8_cache_dtype", "size_class", "latent_format", "exported_digests", "peers")


def suite(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return fork_server.run(suite_command("--kvc-backend", "reference", *args, python=sys.executable), cwd=tmp_path, timeout=600)


def test_fixtures_lists_every_sweep_parameter_with_its_docstring(tmp_path):
    listing = suite(tmp_path, "--fixtures").stdout
    for name in SWEEPS_AND_CASE:
        block = listing.split(f"\n{name}", 1)
        assert len(block) == 2, f"{name} is not listed"
        assert not block[1].lstrip(" -").split("\n", 2)[1].strip().startswith("no docstring available"), f"{name} has no docstring"


@pytest.mark.parametrize("mode", ["--fixtures", "--collect-only"])
def test_a_run_that_executes_no_test_writes_no_results(tmp_path, mode):
    proc = suite(tmp_path, mode, "-m", "shape")
    assert proc.returncode == 0, proc.stdout[-2000:]
    written = [str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if not p.is_dir()]
    assert written == []  # no results, and no Hypothesis scratch files (it caches constants as it collects)


def test_this_pytest_is_one_the_plugin_supports():
    assert int(pytest.__version__.split(".")[0]) in options.SUPPORTED_MAJOR


@pytest.mark.filterwarnings("ignore::pytest.PytestDeprecationWarning")  # Parser() is what the helper is handed at run time
def test_the_pytest_internals_the_plugin_uses_exist():
    parser = Parser()
    parser.getgroup("vendor").addoption("--device")
    assert "--device" in options.option_names_taken(parser)
    assert callable(getattr(pytest.Module, "_getobj", None)) and "_getobj" in vars(SuiteModule)


def not_applicable_here():
    raise LookupError("no digest for this layout")


def test_this_pytest_reports_a_phase_with_a_text_in_place_of_its_traceback(request):
    call = pytest.CallInfo.from_call(not_applicable_here, when="call")
    report = hooks.brief_report(request.node, call, "LookupError: no digest for this layout")
    assert report is not None and report.longrepr == "LookupError: no digest for this layout" and report.failed
    assert call.excinfo is not None and call.excinfo.type is LookupError  # pytest's own call is left as it was


def test_a_pytest_that_reads_the_exception_from_the_report_gets_its_own_report(request, monkeypatch):
    call = pytest.CallInfo.from_call(not_applicable_here, when="call")
    with monkeypatch.context() as patched:  # only around the call: pytest reports this test with its own
        patched.setattr(pytest.TestReport, "from_item_and_call", lambda item, call: call.excinfo.value)
        brief = hooks.brief_report(request.node, call, "LookupError: no digest for this layout")
    assert brief is None


def test_every_record_of_a_run_matches_the_schema_derived_from_the_record_type(tmp_path):
    from kvconform.reports.results import record_schema

    from .suite_runs import run_suite

    schema = record_schema()
    kinds = {"string": str, "integer": int, "number": (int, float), "array": list, "object": dict, "null": type(None)}
    records = run_suite(tmp_path, "--kvc-backend", "reference,reference_kv_first", "-m", "shape or split").records
    assert records
    for record in records:
        assert set(record) == set(schema["properties"]), record["nodeid"]
        for name, rule in schema["properties"].items():
            allowed = rule["type"] if isinstance(rule["type"], list) else [rule["type"]]
            assert isinstance(record[name], tuple(kinds[k] for k in allowed)), (record["nodeid"], name, record[name])
        assert record["outcome"] in schema["properties"]["outcome"]["enum"]


def test_every_validator_raises_input_error_and_one_hook_makes_it_a_usage_error():
    """One usage-error type (issue #22 item 5): validators raise ``InputError`` (or a subclass);
    only ``plugin/hooks.py`` constructs ``pytest.UsageError``."""
    from .suite_runs import ROOT

    raising = sorted(str(path.relative_to(ROOT)) for package in ("conformance", "reports", "reference", "backends_under_test", "kvconform")
                     for path in (ROOT / package).rglob("*.py") if "UsageError(" in path.read_text())
    assert raising == ["conformance/plugin/hooks.py"]
