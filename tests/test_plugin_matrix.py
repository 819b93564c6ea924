"""The one verdict under the pytest plugins people combine with the suite (issue #37): a failing
mutant and the passing reference, each run under pytest-rerunfailures, pytest-randomly,
pytest-timeout, pytest-repeat and xdist alone, state the same verdict in all five outputs — exit
status, JUnit, results JSON, the terminal's verdict line and the HTML banner.

The real plugins, pinned, are installed with ``pip install --target`` into a scratch directory
put on the runs' ``PYTHONPATH`` (pytest loads them from there by their entry points). Without the
package registry the tests skip saying so; ``KVCONFORM_REQUIRE_PLUGINS=1`` (CI) makes that a failure.
Before reports/junit.py kept one test case per record, ``--reruns 2`` gave JUnit 9 failures for
3 failed checks."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor

import pytest

from kvconform.reports import coverage, results

from .suite_runs import SuiteResult, run_suite

PINNED = ("pytest-rerunfailures==16.7", "pytest-randomly==5.1.0", "pytest-timeout==2.4.0", "pytest-repeat==0.9.4")
INSTALLED = ("rerunfailures", "randomly", "timeout", "repeat")  # their pytest11 entry-point names
PLUGINS = {  # each run's arguments, and what its output shows when the plugin took part
    "rerunfailures": (["--reruns", "2"], "rerun"),
    "randomly": ([], "Using --randomly-seed="),
    "timeout": (["--timeout", "60"], "timeout: 60.0s"),
    "repeat": (["--count", "2"], "-2-2]"),
    "xdist": (["-n", "2"], "created: 2/2 workers"),
}
BACKENDS = {"failing": "mutant:write_padding_slots", "passing": "reference"}
CHECK = "test_padding_slots_leave_cache_untouched"  # 3 tests per backend: one per declared K/V layout


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> str:
    """A directory holding the pinned plugins, fetched from the package registry."""
    target = tmp_path_factory.mktemp("plugins")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--target", str(target),
                           *PINNED], capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        why = f"`pip install {' '.join(PINNED)}` failed: {proc.stderr.strip()[-400:]}"
        if os.environ.get("KVCONFORM_REQUIRE_PLUGINS") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return str(target)


def run_under(plugin: str, backend: str, out, plugin_path: str) -> SuiteResult:
    args, _ = PLUGINS[plugin]
    alone = [arg for name in INSTALLED if name != plugin for arg in ("-p", f"no:{name}")]
    return run_suite(out, *alone, *args, "--kvc-backend", backend, "-k", CHECK, "--junitxml", str(out / "junit.xml"),
                     "--kvc-html", str(out / "results.html"), target="kvconform.conformance.test_write",
                     env={"PYTHONPATH": os.pathsep.join(filter(None, [plugin_path, os.environ.get("PYTHONPATH")])), "COLUMNS": "1000"})


@pytest.fixture(scope="module")
def runs(plugin_path, tmp_path_factory) -> dict:
    """(plugin, failing|passing) -> (the run, its output directory), two runs at a time."""
    jobs = {(plugin, kind): tmp_path_factory.mktemp(f"{plugin}-{kind}") for plugin in PLUGINS for kind in BACKENDS}
    first, *rest = jobs
    done = {first: run_under(first[0], BACKENDS[first[1]], jobs[first], plugin_path)}  # starts the fork server alone
    with ThreadPoolExecutor(2) as pool:
        futures = {job: pool.submit(run_under, job[0], BACKENDS[job[1]], jobs[job], plugin_path) for job in rest}
        done.update({job: future.result() for job, future in futures.items()})
    return {job: (done[job], jobs[job]) for job in jobs}


def outputs(result: SuiteResult, out) -> dict:
    """The verdict as each output states it, and the failures JUnit counts."""
    document = result.document
    word, why = results.verdict([document], holes=len(coverage.build([document]).holes))
    suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
    banner = re.search(r'<p id="verdict"[^>]*>(.*?)</p>', (out / "results.html").read_text(), re.S).group(1)
    lines = [line for line in result.proc.stdout.splitlines() if line.startswith("kvconform verdict: ")]
    return {
        "results JSON": f"{word} — {why}",
        "JUnit": next(p.get("value") for p in suite.find("properties") if p.get("name") == "kvc_verdict"),
        "terminal": lines[-1].removeprefix("kvconform verdict: ") if lines else None,
        "HTML": html.unescape(re.sub(r"<[^>]+>", "", banner)),
    }


@pytest.mark.parametrize("plugin", PLUGINS)
def test_every_output_states_the_one_verdict_under(plugin, runs):
    for kind in BACKENDS:
        result, out = runs[plugin, kind]
        said = outputs(result, out)
        assert len(set(said.values())) == 1, (kind, said)
        records = result.records
        failing = sum(r["outcome"] in results.FAILING for r in records)
        assert result.returncode == (1 if failing else 0) and f"; exit status {result.returncode}" in said["JUnit"], (kind, result.output)
        suite = ET.parse(out / "junit.xml").getroot().find("testsuite")
        assert int(suite.get("failures")) + int(suite.get("errors")) == failing, (kind, suite.attrib)


@pytest.mark.parametrize("plugin", PLUGINS)
def test_no_plugin_changes_what_the_checks_found(plugin, runs):
    args, shown = PLUGINS[plugin]
    per_test = 2 if plugin == "repeat" else 1
    failing, passing = runs[plugin, "failing"][0], runs[plugin, "passing"][0]
    assert shown in failing.proc.stdout + failing.proc.stderr, f"{plugin} took no part:\n{failing.output}"
    assert [r["outcome"] for r in failing.records] == ["failed"] * 3 * per_test
    assert [r["outcome"] for r in passing.records] == ["passed"] * 3 * per_test
