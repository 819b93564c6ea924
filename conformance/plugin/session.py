"""One suite run: the options, backends, expectations and digest file it was started with,
decided once at start-up (kept in ``config.stash``), and the plugins it registers.

Start-up is :func:`start`: read the invocation, plan (run_plan.py: what is decided from the
options, pure), then :func:`wire` (what is done: the oracle guard, the process's settings, the
device and output checks, Hypothesis, the expectations, the backends, the plugins). Every input
is validated before any test runs: a bad option or file is an ``InputError`` naming it.

Imported by ``hooks.pytest_configure`` only when a run collects the suite: it imports torch, the
harness and the backends' registry at its top.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import gc
import os
import platform
import shutil
import tempfile
from typing import Any

import torch
from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir

from kvconform.backends_under_test import registry
from kvconform.errors import InputError
from kvconform.reports import expectations
from kvconform.reports.lines import fold
from kvconform.reports.results import package_version

from ..harness import digests, oracle_guard
from ..harness.sweeps import declared
from . import certify, options
from .outputs import ResultsLock, check_outputs
from .recorder import DeselectionTally, ResultRecorder, environment
from .run_plan import RunPlan, declared_defaults, plan_run
from .scheduling import Scheduler, choose_worker_gpu


@dataclasses.dataclass
class SuiteRun:
    """Everything one suite run decided up front; kept in ``config.stash``."""

    options: options.RunOptions
    backends: dict  # name -> registry.Loaded
    expectations: list
    compare: dict | None
    left_out: dict = dataclasses.field(default_factory=dict)  # default built-ins that cannot run here -> why

    def header(self, config, aliases_left: list[str]) -> list[str]:
        """The lines of pytest's report header: versions, device, options, each backend; ``aliases_left``:
        the short option spellings another plugin or conftest owns here."""
        o = self.options
        name = torch.cuda.get_device_name() if o.device.startswith("cuda") else platform.processor() or "cpu"
        lines = [
            f"kvconform: torch {torch.__version__} (hip {torch.version.hip}), triton {package_version('triton') or 'absent'}",
            f"kvconform: device {o.device} ({name}), profile {o.profile}, seed {o.seed}, standard {o.standard}",
        ]
        if aliases_left:
            lines.append(f"kvconform: another plugin or conftest owns {', '.join(aliases_left)} here; kvconform's are spelled --kvc-NAME")
        for loaded in self.backends.values():
            if loaded.backend is None:
                state = f"NOT AVAILABLE HERE ({loaded.unavailable})" if loaded.unavailable else f"LOAD ERROR {loaded.error}"
                lines.append(f"  backend {loaded.name}: {state}")
                continue
            b = loaded.backend
            fp8 = b.cache_dtype("fp8", torch.bfloat16) if "fp8" in b.capabilities.kv_cache_dtypes else "-"
            lines.append(f"  backend {b.name}: platform {b.platform}, arch {b.arch() or '-'}, fp8 {fp8}, "
                         f"standards {', '.join(sorted(b.capabilities.standards)) or '-'}; "
                         f"{', '.join(f'{k} {v}' for k, v in b.versions().items())}")
        width = config.get_terminal_writer().fullwidth
        return [part for line in lines for part in fold(line, width)]

    def backend_facts(self) -> dict:
        facts = {}
        for name, loaded in self.backends.items():
            b = loaded.backend
            if b is None:
                facts[name] = {"unavailable": loaded.unavailable} if loaded.unavailable else {"error": loaded.error}
                continue
            fp8 = str(b.cache_dtype("fp8", torch.bfloat16)) if "fp8" in b.capabilities.kv_cache_dtypes else None
            facts[name] = {"platform": b.platform, "arch": b.arch(), "fp8": fp8, "standards": sorted(b.capabilities.standards), **b.versions(),
                           "declared": declared(b)}
            catches = getattr(b, "catches", None)
            if catches:  # a seeded-fault backend: which families must catch it (the kill-rate table)
                facts[name]["mutant"] = {"catches": list(catches), "doc": " ".join((type(b).__doc__ or "").split())}
        return facts


def start(config) -> SuiteRun:
    """Start-up: the options as given (a certified run's pinned), the plan, then the wiring."""
    cuda = torch.cuda.is_available()
    given = options.RunOptions.from_config(config, "cuda" if cuda else "cpu")
    if given.certify:
        given = certify.pinned(config, given)
    if not given.devices and given.device == "cuda" and torch.cuda.device_count() > 1:
        given = dataclasses.replace(given, devices=tuple(f"cuda:{i}" for i in range(torch.cuda.device_count())))
    worker = hasattr(config, "workerinput")  # xdist workers send their reports to the controller
    plan = plan_run(given, os.environ, worker=worker, xdist=bool(getattr(config.option, "numprocesses", None)), cuda=cuda,
                    shows_only=options.runs_no_tests(config), junit_path=getattr(config.option, "xmlpath", None))
    return wire(config, plan)


def wire(config, plan: RunPlan) -> SuiteRun:
    """Do what ``plan`` says, checks first: nothing below the results lock can refuse the run."""
    _prepare_process(config, plan)
    options.check_device(plan.options.device)
    for device in dict.fromkeys(plan.options.devices) if plan.controller else ():  # a worker would open a context on every GPU
        options.check_device(device, "--kvc-devices")
    if plan.controller:
        check_outputs(plan.outputs, plan.inputs)
    _configure_hypothesis(config, plan)
    known = expectations.parse(plan.options.expectations) if plan.options.expectations else []
    backends, left_out = _load_backends(plan.options.backends)
    opts = declared_defaults(plan.options, backends)
    compare = digests.load(opts.compare_digests) if opts.compare_digests else None
    if plan.compare_with_reference:  # nothing waived: without another machine's file, compare with the reference's
        compare = digests.reference_export([layout for loaded in backends.values() if loaded.backend for layout in loaded.backend.capabilities.layouts])
    run = SuiteRun(options=opts, backends=backends, expectations=known, compare=compare, left_out=left_out)
    _register_plugins(config, plan, run)
    # What is imported by now (torch, Triton, the backends) lives as long as the process: out of
    # the collector's sight, each full collection skips it (0.5 s less per process on the CPU).
    gc.freeze()
    return run


def _prepare_process(config, plan: RunPlan) -> None:
    oracle_guard.install()  # the oracle as it is before any backend is imported
    for name, value in plan.environ_defaults:
        os.environ.setdefault(name, value)
    if plan.one_thread:
        # xdist workers already fill the cores: a second intra-op thread each makes every small
        # indexing op wait on a descheduled OpenMP thread (12 ms instead of 10 µs, measured).
        torch.set_num_threads(1)
    if plan.choose_worker_gpu:
        choose_worker_gpu(config)  # several GPUs: this worker's caches on its own one, before anything touches a GPU


# quick: a cheap verdict — few examples, failing examples reported as found (no shrinking);
# full: thorough, and failures shrink to a minimal example.
HYPOTHESIS_PROFILES: dict[str, dict[str, Any]] = {
    "quick": dict(max_examples=6, phases=(Phase.explicit, Phase.generate)),
    "full": dict(max_examples=80),
}


def _configure_hypothesis(config, plan: RunPlan) -> None:
    set_hypothesis_home_dir(plan.hypothesis_home or _scratch_dir())
    settings.register_profile("kvconform", database=None, deadline=None, derandomize=False,
                              suppress_health_check=list(HealthCheck), **HYPOTHESIS_PROFILES[plan.options.profile])
    settings.load_profile("kvconform")
    config.option.hypothesis_seed = str(plan.options.seed)  # read by Hypothesis' own plugin
    _draw_no_local_constants()


def _draw_no_local_constants() -> None:
    """Hypothesis (6.131 on) mixes constants parsed from the source of every imported module outside
    site-packages into what it draws: an editable checkout, or a vendor's backend module, would
    change the examples of a seed, and the parse costs ~1 s of CPU a process (each xdist worker's
    too). The examples of a seed depend on the strategies and Hypothesis' version alone."""
    from hypothesis.internal.conjecture import providers  # no public switch; absent before 6.131

    if hasattr(providers, "_get_local_constants") and hasattr(providers, "_local_constants"):
        empty = providers._local_constants  # never filled: the scan below is the only writer
        providers._get_local_constants = lambda: empty


def _register_plugins(config, plan: RunPlan, run: SuiteRun) -> None:
    # what collection deselected or dropped: read by the recorder, or sent by an xdist worker to it
    tally = DeselectionTally(config) if plan.count_deselected else None
    if tally is not None:
        config.pluginmanager.register(tally, "kvconform-deselected")
    if plan.take_results_lock:
        lock = ResultsLock.acquire(plan.options.json_path)  # last: nothing below can refuse the run
        config.pluginmanager.register(ResultRecorder(run, environment(run, run.backend_facts()), lock, tally), "kvconform-results")
    if plan.certifier:
        config.pluginmanager.register(certify.Certifier(run), "kvconform-certify")
    if plan.scheduler:
        config.pluginmanager.register(Scheduler(run), "kvconform-scheduling")
    if plan.worker_canary:
        config.pluginmanager.register(certify.WorkerCanary(config), "kvconform-canary")


def _scratch_dir() -> str:
    """A directory removed when this process ends."""
    path = tempfile.mkdtemp(prefix="kvconform-hypothesis-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _load_backends(names: tuple[str, ...]) -> tuple[dict, dict]:
    """The backends to run, and the default built-ins left out because they cannot load here."""
    explicit = bool(names)
    names = names or tuple(registry.default_names())
    unknown = [n for n in names if not registry.is_known(n)]
    if unknown:
        known = sorted(registry.registered())
        hints = "; ".join(f"{n!r}: did you mean {', '.join(close)}?" for n in unknown if (close := difflib.get_close_matches(n, known, n=3)))
        listed = [k for k in known if not k.startswith((registry.MUTANT_PREFIX, registry.FAULT_PREFIX))]
        raise InputError(
            f"--kvc-backend: unknown backend(s) {', '.join(unknown)}{' (' + hints + ')' if hints else ''}; registered: {', '.join(listed)} "
            f"(or 'vllm:NAME[+shuffle]', 'pkg.module:attr', or one of {len(known) - len(listed)} seeded-fault backends 'mutant:NAME' / "
            "'fault:NAME': `kvconform backends --all` lists them)"
        )
    missing = [text for text in map(registry.missing_module, names) if text]
    if missing:
        raise InputError("; ".join(missing))
    loaded = {backend.name: backend for backend in map(_load_guarded, names)}  # by the name its test ids carry (registry.registered_name)
    if not explicit:  # the default is every built-in that can run here
        runnable = {n: l for n, l in loaded.items() if l.backend is not None}
        if runnable:
            return runnable, {n: l.unavailable or l.error for n, l in loaded.items() if n not in runnable}
    return loaded, {}


def _load_guarded(name: str):
    """One backend, loaded after the oracle was recorded and checked after its import: a backend
    whose import changed the oracle is a load error (its every test an error naming the change);
    the oracle is restored for the others. Its ops then run through the guards (harness/oracle_guard.py)."""
    oracle_guard.install()
    try:
        loaded = registry.load(name)
    except SystemExit as exc:  # the import ended the process: a load error, not a run that never started
        return registry.Loaded(name, error=f"SystemExit({exc.code!r}): importing the backend called sys.exit")
    try:
        oracle_guard.verify(f"the import of backend {name}")
    except oracle_guard.OracleChanged as exc:
        return registry.Loaded(loaded.name, error=f"OracleChanged: {exc}", spec=loaded.spec)
    if loaded.backend is not None:
        oracle_guard.guard_ops(loaded.backend)
    return loaded
