"""A suite run's start-up is planned from its options before anything is done
(conformance/plugin/run_plan.py ``plan_run``): which files it writes and reads, what an xdist
controller and a worker each register, the settings of the process, and every option it cannot
use, refused by name. Plain values in, a frozen plan out: no pytest config, no torch."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from kvconform.conformance.plugin.options import RunOptions
from kvconform.conformance.plugin.run_plan import plan_run
from kvconform.errors import InputError

from .suite_runs import run_suite

GIVEN = RunOptions(backends=("reference",), device="cpu", seed=0, profile="quick", standard=None, json_path="/runs/r/results.json",
                   html_path=None, huge=False, timeout=None, export_digests=None, compare_digests=None, expectations=None,
                   update_expectations=None)


def plan(given: RunOptions = GIVEN, environ=None, *, worker=False, xdist=False, cuda=False, shows_only=False, junit_path=None, **fields):
    return plan_run(dataclasses.replace(given, **fields), environ or {}, worker=worker, xdist=xdist, cuda=cuda,
                    shows_only=shows_only, junit_path=junit_path)


def test_planning_imports_neither_pytest_nor_torch():
    probe = ("import sys; import kvconform.conformance.plugin.run_plan; "
             "print(sorted({'pytest', 'torch'} & {name.split('.')[0] for name in sys.modules}))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_plain_run_writes_its_report_beside_its_results_and_takes_the_results_lock():
    run = plan(junit_path="/runs/r/junit.xml", expectations="/vendor/known.txt")
    assert run.outputs["--kvc-html"] == "/runs/r/results.html" and run.outputs["--junitxml"] == "/runs/r/junit.xml"
    assert run.inputs["--kvc-expectations"] == "/vendor/known.txt"
    assert run.controller and run.take_results_lock and run.count_deselected
    assert not (run.one_thread or run.choose_worker_gpu or run.scheduler or run.certifier or run.worker_canary)
    assert run.hypothesis_home == "/runs/r/.hypothesis"


def test_an_xdist_worker_runs_on_one_thread_and_its_own_gpu_and_leaves_the_results_to_the_controller():
    worker, controller = plan(worker=True, xdist=True), plan(xdist=True)
    assert worker.one_thread and worker.choose_worker_gpu and worker.count_deselected and worker.scheduler
    assert not (worker.controller or worker.take_results_lock)
    assert controller.take_results_lock and controller.scheduler and not controller.count_deselected  # the workers send theirs


def test_a_certified_run_compares_with_the_references_digests_unless_given_a_file():
    assert plan(certify="/bundle").compare_with_reference and plan(certify="/bundle").certifier
    assert not plan(certify="/bundle", compare_digests="/other/machine.json").compare_with_reference
    assert plan(certify="/bundle", worker=True, xdist=True).worker_canary and not plan(certify="/bundle", worker=True).certifier
    assert not plan().compare_with_reference


def test_triton_is_interpreted_without_cuda_unless_the_environment_says_otherwise():
    assert plan().environ_defaults == (("TRITON_INTERPRET", "1"),)
    assert plan(environ={"TRITON_INTERPRET": "0"}).environ_defaults == ()
    assert plan(cuda=True, device="cuda").environ_defaults == ()


def test_a_session_that_runs_no_test_keeps_hypothesis_files_out_of_the_results():
    assert plan(shows_only=True).hypothesis_home is None  # a scratch directory, removed as the process ends


@pytest.mark.parametrize("fields, complaint", [
    (dict(backends=("pkg.module:",)), "--kvc-backend: malformed backend spec(s) 'pkg.module:'"),
    (dict(seed=2**32), "--kvc-seed 4294967296: expected an integer from 0 to 4294967295"),
    (dict(timeout=-1.0), "--kvc-timeout -1.0: expected a positive number of seconds"),
    (dict(timeout=float("inf")), "--kvc-timeout inf: expected a positive number of seconds"),
])
def test_an_option_that_cannot_be_used_is_refused_by_name(fields, complaint):
    with pytest.raises(InputError) as refused:
        plan(**fields)
    assert str(refused.value).startswith(complaint)


def test_the_device_is_left_to_the_wiring_which_allocates_on_it():
    assert plan(device="cuda:7").options.device == "cuda:7"  # options.check_device refuses it, after the plan


def test_a_run_draws_no_constants_from_the_source_it_imports(tmp_path):
    """Hypothesis would parse every module outside site-packages (this checkout, a vendor's backend)
    for constants to mix into its draws, caching them beside the results: a seed's examples would
    depend on how kvconform was installed. A run parses none."""
    result = run_suite(tmp_path, "--kvc-backend", "reference", "-m", "write", "-k", "padding_slots_leave")
    assert result.returncode == 0, result.output
    assert not (tmp_path / ".hypothesis" / "constants").exists(), sorted(p.name for p in (tmp_path / ".hypothesis").iterdir())
