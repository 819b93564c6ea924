"""One suite run: the options, backends, expectations and digest file it was started with,
decided once at start-up (kept in ``config.stash[RUN]``), and the recorder and certifier it
registers on the controller. Everything here validates input first: a bad option or file is an
``InputError`` naming it, before any test runs.
"""

from __future__ import annotations

import atexit
import dataclasses
import difflib
import gc
import os
import shutil
import tempfile

import pytest

from kvconform.errors import InputError
from kvconform.reports.lines import fold

from . import options
from .options import STANDARDS

RUN = pytest.StashKey["SuiteRun"]()
ALIASES_LEFT = pytest.StashKey[list]()  # short option spellings a conftest or plugin owns here


@dataclasses.dataclass
class SuiteRun:
    """Everything one suite run decided up front; kept in ``config.stash``."""

    options: options.RunOptions
    backends: dict  # name -> registry.Loaded
    expectations: list
    compare: dict | None
    left_out: dict = dataclasses.field(default_factory=dict)  # default built-ins that cannot run here -> why

    @classmethod
    def start(cls, config) -> "SuiteRun":
        import torch

        from ..harness import oracle_guard

        oracle_guard.install()  # the oracle as it is before any backend is imported
        if not torch.cuda.is_available():  # Triton kernels run on CPU through the interpreter
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if hasattr(config, "workerinput"):
            # xdist workers already fill the cores: a second intra-op thread each makes every small
            # indexing op wait on a descheduled OpenMP thread (12 ms instead of 10 µs, measured).
            torch.set_num_threads(1)
            from .scheduling import choose_worker_gpu

            choose_worker_gpu(config)  # several GPUs: this worker's caches on its own one
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis.configuration import set_hypothesis_home_dir

        from kvconform.reports import expectations

        opts = options.RunOptions.from_config(config, "cuda" if torch.cuda.is_available() else "cpu")
        if opts.certify:
            from .certify import pinned

            opts = pinned(config, opts)
        options.validate(opts)
        controller = not hasattr(config, "workerinput")  # xdist workers send their reports to the controller
        if controller:
            _check_outputs(config, opts)
        # Hypothesis' scratch files go beside the results, never into the caller's tree or site-packages;
        # a session that runs nothing (it caches constants as it collects) leaves no trace.
        set_hypothesis_home_dir(_scratch_dir() if options.runs_no_tests(config) else
                                os.path.join(os.path.dirname(os.path.abspath(opts.json_path)), ".hypothesis"))
        profiles = {
            # quick: a cheap verdict — few examples, failing examples reported as found (no shrinking);
            # full: thorough, and failures shrink to a minimal example.
            "quick": dict(max_examples=6, phases=(Phase.explicit, Phase.generate)),
            "full": dict(max_examples=80),
        }
        settings.register_profile("kvconform", database=None, deadline=None, derandomize=False,
                                  suppress_health_check=list(HealthCheck), **profiles[opts.profile])
        settings.load_profile("kvconform")
        config.option.hypothesis_seed = str(opts.seed)  # read by Hypothesis' own plugin
        known = expectations.parse(opts.expectations) if opts.expectations else []
        backends, left_out = _load_backends(opts.backends)
        # options not given, from what the backends declare (below)
        opts = dataclasses.replace(opts, standard=default_standard(opts.standard, backends, explicit=bool(opts.backends)),
                                   timeout=default_timeout(opts.timeout, backends))
        compare = _load_compare(opts.compare_digests)
        if compare is None and opts.certify:  # nothing waived: without another machine's file, compare with the reference's
            from ..harness.digests import reference_export

            compare = reference_export([layout for loaded in backends.values() if loaded.backend for layout in loaded.backend.capabilities.layouts])
        run = cls(options=opts, backends=backends, expectations=known, compare=compare, left_out=left_out)
        from .recorder import DeselectionTally

        # what collection deselected or dropped: read by the recorder, or sent by an xdist worker to it
        tally = DeselectionTally(config) if not getattr(config.option, "numprocesses", None) or not controller else None
        if tally is not None:
            config.pluginmanager.register(tally, "kvconform-deselected")
        if controller:
            from .outputs import ResultsLock
            from .recorder import ResultRecorder, environment

            lock = ResultsLock.acquire(opts.json_path)  # last: nothing below can refuse the run
            config.pluginmanager.register(ResultRecorder(run, environment(run, run.backend_facts()), lock, tally), "kvconform-results")
            if opts.certify:
                from .certify import Certifier

                config.pluginmanager.register(Certifier(run), "kvconform-certify")
        # What is imported by now (torch, Triton, the backends) lives as long as the process: out of
        # the collector's sight, each full collection skips it (0.5 s less per process on the CPU).
        gc.freeze()
        return run

    def header(self, config) -> list[str]:
        """The lines of pytest's report header: versions, device, options, each backend."""
        import platform

        import torch

        from kvconform.reports.results import package_version

        o = self.options
        name = torch.cuda.get_device_name() if o.device.startswith("cuda") else platform.processor() or "cpu"
        lines = [
            f"kvconform: torch {torch.__version__} (hip {torch.version.hip}), triton {package_version('triton') or 'absent'}",
            f"kvconform: device {o.device} ({name}), profile {o.profile}, seed {o.seed}, standard {o.standard}",
        ]
        left = config.stash.get(ALIASES_LEFT, [])
        if left:
            lines.append(f"kvconform: another plugin or conftest owns {', '.join(left)} here; kvconform's are spelled --kvc-NAME")
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
        from ..harness.sweeps import declared

        facts = {}
        for name, loaded in self.backends.items():
            b = loaded.backend
            if b is None:
                facts[name] = {"unavailable": loaded.unavailable} if loaded.unavailable else {"error": loaded.error}
                continue
            fp8 = str(b.cache_dtype("fp8", _bf16())) if "fp8" in b.capabilities.kv_cache_dtypes else None
            facts[name] = {"platform": b.platform, "arch": b.arch(), "fp8": fp8, "standards": sorted(b.capabilities.standards), **b.versions(),
                           "declared": declared(b)}
            catches = getattr(b, "catches", None)
            if catches:  # a seeded-fault backend: which families must catch it (the kill-rate table)
                facts[name]["mutant"] = {"catches": list(catches), "doc": " ".join((type(b).__doc__ or "").split())}
        return facts


def _bf16():
    import torch

    return torch.bfloat16


def outputs_and_inputs(opts: options.RunOptions, junit_path: str | None) -> tuple[dict, dict]:
    """(option -> path) of every file a run writes, and of every file it reads (outputs.check_outputs)."""
    html = opts.html_path or os.path.splitext(opts.json_path)[0] + ".html"
    return ({"--kvc-json": opts.json_path, "--kvc-html": html, "--junitxml": junit_path, "--kvc-update-expectations": opts.update_expectations,
             "--kvc-export-digests": opts.export_digests, "--kvc-certify": opts.certify},
            {"--kvc-expectations": opts.expectations, "--kvc-compare-digests": opts.compare_digests})


def _scratch_dir() -> str:
    """A directory removed when this process ends."""
    path = tempfile.mkdtemp(prefix="kvconform-hypothesis-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _check_outputs(config, opts: options.RunOptions) -> None:
    """Every output writable, none destroying an input or another output, before any test runs."""
    from .outputs import check_outputs

    check_outputs(*outputs_and_inputs(opts, getattr(config.option, "xmlpath", None)))


def _load_backends(names: tuple[str, ...]) -> tuple[dict, dict]:
    """The backends to run, and the default built-ins left out because they cannot load here."""
    from kvconform.backends_under_test import registry

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
    from kvconform.backends_under_test import registry

    from ..harness import oracle_guard

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


def _load_compare(path):
    if not path:
        return None
    from ..harness.digests import load

    return load(path)


# ----------------------------------------------------------------------------- run options a user did not give
# --kvc-standard: the layout standard every named backend that declares one declares (E1 when
# they share both); E1 when none declares one; a usage error when named backends disagree — one
# run checks one standard, and checking an E3-only backend against E1 would only make its
# standard checks not applicable. The default backend set (no --backend) is the E1 models plus
# one E3 model and keeps E1. --kvc-timeout: the longest Backend.default_timeout among the
# backends (vLLM's adapters set one: a kernel that writes out of bounds can hang a worker).
FALLBACK_STANDARD = "e1"


def default_standard(given: str | None, backends: dict, explicit: bool) -> str:
    if given:
        return given
    declared = {name: loaded.backend.capabilities.standards for name, loaded in backends.items()
                if loaded.backend is not None and loaded.backend.capabilities.standards}
    if not declared or not explicit:
        return FALLBACK_STANDARD
    common = set(STANDARDS).intersection(*declared.values())
    if not common:
        listing = ", ".join(f"{name}: {'/'.join(sorted(s))}" for name, s in declared.items())
        raise InputError(f"--kvc-standard not given and the backends declare different standards ({listing}); "
                         f"give --kvc-standard {' or '.join(STANDARDS)}, or run them separately")
    return min(common, key=STANDARDS.index)


def default_timeout(given: float | None, backends: dict) -> float | None:
    if given is not None:
        return given
    limits = [loaded.backend.default_timeout for loaded in backends.values() if loaded.backend is not None and loaded.backend.default_timeout]
    return max(limits) if limits else None
