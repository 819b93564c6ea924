"""Faster, not thinner (#25): the suite and kvconform's own tests were sped up — cheap probes past
2^31 elements, xdist scheduling, one mutant run instead of three, the vLLM runs forked from one
set-up — and none of it may lose a case. The numbers below are those on the day it was done;
they may grow, never shrink."""

import re
import sys

from kvconform.backends_under_test.mutants import MUTANTS
from kvconform.conformance.plugin.collection import suite_command

from . import fork_server
from . import test_mutants_are_caught as mutant_tests
from .suite_runs import ROOT
from .vllm_cpu.regressions import ENV, REGRESSIONS
from .vllm_cpu.runs import PLUGIN, PTH_SELECT, plan, regression

CHECKS = 1748  # tests a default CPU run of every built-in backend collects (quick profile)
COVERAGE_CASES = 5152  # the clause table of docs/COVERAGE.md: tests run, summed over its rows
MUTANTS_KILLED = 56  # docs/MUTATION.md: every seeded fault, each caught by the families it is aimed at
VLLM_REGRESSIONS = 14


def test_a_default_run_collects_every_check_it_did():
    proc = fork_server.run(suite_command("--collect-only", "-q", "--kvc-device", "cpu", python=sys.executable), cwd=ROOT, timeout=600)
    collected = re.search(r"(\d+) tests? collected", proc.stdout)
    assert collected, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert int(collected.group(1)) >= CHECKS


def test_docs_coverage_md_counts_every_case_it_did():
    """docs/COVERAGE.md is the table of the built-in runs (test_coverage.py holds it to them)."""
    table = (ROOT / "docs" / "COVERAGE.md").read_text()
    assert sum(int(n) for n in re.findall(r"` \((\d+)\)", table)) >= COVERAGE_CASES


def test_every_mutant_is_run_and_asserted_on():
    assert len(MUTANTS) >= MUTANTS_KILLED
    assert sorted(mutant_tests.PLAIN + mutant_tests.NEEDS_OPTIONS) == sorted(MUTANTS)
    killed, aimed = map(int, re.search(r"\*\*(\d+) of (\d+) killed\*\*", (ROOT / "docs" / "MUTATION.md").read_text()).groups())
    assert killed == aimed >= MUTANTS_KILLED


def test_every_vllm_regression_is_run_as_its_own_command_line():
    """Forked from one set-up, each regression is still the run it was: the plugin, its backend,
    its families (-k) and the environment that edits vLLM as it is imported."""
    runs = plan()
    assert len(REGRESSIONS) >= VLLM_REGRESSIONS
    for name, r in REGRESSIONS.items():
        args, env = runs[regression(name)]
        assert env == {ENV: name}
        assert args[:2] == PLUGIN and args[args.index("--backend") + 1] == r.backend and args[args.index("-k") + 1] == f"({r.select}) and not {PTH_SELECT}"
