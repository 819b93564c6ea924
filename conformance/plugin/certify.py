"""Certified runs: ``--kvc-certify DIR`` (or ``kvconform certify``).

A certified run is the whole suite, as its version defines it, with nothing waived: no
expectations file, no ``-k``/``-m``/``--deselect``/``-x``, the profile and seed pinned
(``full``, 0). At the end every collected test must have a record, every record must be
*passed* or *not applicable by the backend's declaration* (a run- or machine-kind reason —
no GPU, too little memory, another ``--standard`` — is not a certification), an incomplete
results document is refused, and no declared capability may have an empty coverage cell.
Then the submission bundle is written to DIR (reports/submission.py); otherwise nothing is
written, the reasons are printed and the run fails.

The canary (``harness/canary.py``) is computed at the end of the run in the controller and in
every xdist worker — processes that imported the backends and ran them — and in a fresh Python
that never imported a backend, started when the run starts: any difference refuses
certification, naming the op. Its digests go in the bundle (``canary.json``).
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys

import pytest
import torch

from kvconform.reports import submission

from ..harness import canary
from ..harness.digests import header
from . import collection, options


def pinned(config, opts: options.RunOptions) -> options.RunOptions:
    """The options of a certified run, or a usage error naming everything certification forbids."""
    refused = []
    if opts.expectations or opts.update_expectations:
        refused.append("--kvc-expectations / --kvc-update-expectations (a certified run waives no failure)")
    if _given(config, "profile") and opts.profile != submission.PROFILE:
        refused.append(f"--kvc-profile {opts.profile} (certified runs use {submission.PROFILE})")
    if _given(config, "seed") and opts.seed != submission.SEED:
        refused.append(f"--kvc-seed {opts.seed} (certified runs use {submission.SEED})")
    if config.option.keyword or config.option.markexpr or config.getoption("deselect", None) or config.option.maxfail:
        refused.append("-k / -m / --deselect / -x (a certified run runs every check)")
    outside = [arg for arg in config.args if not _whole_suite(arg, config)]
    if outside:
        refused.append(f"{' '.join(outside)} (a certified run collects the whole {collection.SUITE}, nothing more or less)")
    if refused:
        raise options.OptionError("--kvc-certify refuses " + "; ".join(refused))  # a usage error (exit 4), made in hooks.pytest_configure
    # CONN-RESHARD-DEVICES needs two device processes: "not applicable" for want of a second device
    # would refuse certification of every CPU backend and every one-GPU machine. Those run it on
    # their one device listed twice (two processes, the wire through host memory); a machine with
    # several GPUs takes them all (session.start), over NCCL.
    devices = opts.devices or _one_device_twice(opts.device)
    return dataclasses.replace(opts, profile=submission.PROFILE, seed=submission.SEED, devices=devices)


def _one_device_twice(device: str) -> tuple[str, ...]:
    if device == "cpu":
        return ("cpu", "cpu")
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.device_count() == 1:
        gpu = str(torch.device(device if ":" in device else "cuda:0"))
        return (gpu, gpu)
    return ()


def _given(config, name: str) -> bool:
    """Whether the command line sets option NAME (by either spelling), default value or not."""
    return any(arg.split("=", 1)[0] in (f"--kvc-{name}", f"--{name}") for arg in config.invocation_params.args)


def _whole_suite(arg: str, config) -> bool:
    if config.option.pyargs and arg == collection.SUITE:
        return True
    try:
        return (config.invocation_params.dir / arg).resolve() == collection.suite_dir()
    except (OSError, ValueError):
        return False


def backend_modules(backends: dict) -> list[str]:
    """The modules that hold the run's backends: their classes' and any ``pkg.module:attr`` named."""
    found = {spec.partition(":")[0] for spec in (loaded.spec for loaded in backends.values())
             if ":" in spec and not spec.startswith(("mutant:", "fault:", "vllm:"))}
    found |= {type(loaded.backend).__module__ for loaded in backends.values() if loaded.backend is not None}
    return sorted(found)


CANARY = "kvconform-canary"  # an xdist worker's canary digests, in its workeroutput


class WorkerCanary:
    """On an xdist worker of a certified run: the canary as this process computes it at its end."""

    def __init__(self, config):
        self.config = config

    def pytest_sessionfinish(self):
        self.config.workeroutput[CANARY] = canary.digests()


class Certifier:
    """A pytest plugin object on the controller: the verdict and the bundle, from the recorder's
    results and the tests it saw selected."""

    def __init__(self, run):
        self.run = run
        self.problems: list[str] = []
        self.checksum: str | None = None
        self.workers: dict[str, dict] = {}
        # the clean side runs while the suite does (a fresh Python: a few seconds of imports)
        self.clean = canary.start_clean(backend_modules(run.backends))

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        digests = getattr(node, "workeroutput", {}).get(CANARY)
        if digests is not None:
            self.workers[node.gateway.id] = digests

    def canary_problems(self) -> tuple[dict, list[str]]:
        """The canary of this process, and what differs from the clean process's in it or in any worker's."""
        here = canary.digests()
        try:
            clean = canary.finish_clean(self.clean)
        except canary.CanaryError as exc:
            return here, [f"canary: {exc}"]
        problems = [f"canary (this process): {d}" for d in canary.differences(here, clean)]
        for worker, digests in sorted(self.workers.items()):
            problems += [f"canary (xdist worker {worker}): {d}" for d in canary.differences(digests, clean)]
        return here, problems

    @pytest.hookimpl(trylast=True)  # after the recorder has its records
    def pytest_sessionfinish(self, session):
        recorder = session.config.pluginmanager.get_plugin("kvconform-results")
        document = recorder.document()
        collected = sorted({test_id for test_id in map(collection.suite_test_id, recorder.selected or ()) if test_id})
        self.problems = submission.certification_problems(document, collected)
        if not collected:
            self.problems.append("no test was collected")
        canary_digests, canary_problems = self.canary_problems()
        self.problems += canary_problems
        if self.problems:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
            return
        argv = [sys.executable, "-m", "pytest", *session.config.invocation_params.args]
        command = {"argv": argv, "line": shlex.join(argv), "cwd": str(session.config.invocation_params.dir)}
        self.checksum = submission.write_bundle(self.run.options.certify, document, collected=collected,
                                                must_pass=collection.must_pass(), command=command, digests_header=header(),
                                                canary=canary_digests)

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # registered after the recorder: outside it, so this prints last
    def pytest_terminal_summary(self, terminalreporter):
        try:
            return (yield)
        finally:
            self._print_summary(terminalreporter)

    def _print_summary(self, terminalreporter) -> None:
        terminalreporter.write_sep("=", "kvconform certification")
        if self.checksum:
            terminalreporter.write_line(f"kvconform: CERTIFIED; bundle {os.path.abspath(self.run.options.certify)} (sha256 of SHA256SUMS {self.checksum})", green=True)
            return
        terminalreporter.write_line(f"kvconform: NOT CERTIFIED ({len(self.problems)} problems); no bundle written", red=True)
        for problem in self.problems:
            terminalreporter.write_line(f"  {problem}")
