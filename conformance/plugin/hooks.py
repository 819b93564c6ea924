"""kvconform's pytest plugin: ``pytest --pyargs kvconform.conformance --backend NAME``.

Registered as the ``pytest11`` entry point ``kvconform``, so an installed kvconform loads it in
every pytest run of the environment. It stays out of the way of runs that are not the suite's:
only ``--kvc-*`` options are registered before conftests load (short spellings follow where
free, see options.py), and nothing below ``pytest_configure`` happens unless the run collects
``kvconform.conformance``.

Reading order:

1. options (options.py) and whether this is a suite run (collection.py);
2. backends: ``--backend`` names loaded through the registry, each a parameter of every check;
3. applicability (applicability.py): the checks a backend does not declare, or this run or
   machine cannot do, are *not applicable* with a typed reason — never passes;
4. the ``case`` fixture every check takes;
5. recording (recorder.py): one record per test, JSON + HTML + the terminal matrix.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading

import pytest

from . import collection, options, run_defaults

ENTRY_POINT = "kvconform"
FAMILIES = ("shape", "split", "write", "shuffle", "swap", "copy", "read", "gating", "equivalence", "connector")
MARKERS = (
    "kvc_op(name): needs the backend to declare op NAME",
    "kvc_layouts(kind): which declared layouts to run on: all | tiled | standard | connector | none",
    "kvc_needs(feature): needs fp8 | single_kv_head | standard_e1 | standard_e3 | selector | gpu | memory_2_31 | compare_digests | multi_layer",
    "kvc_clause(*ids): the spec clauses (docs/SPEC.md ids) this check verifies",
)
RUN = pytest.StashKey["SuiteRun"]()


# ----------------------------------------------------------------------------- 1. options
def pytest_addoption(parser, pluginmanager):
    options.add_options(parser)
    if pluginmanager.get_name(sys.modules[__name__]) != ENTRY_POINT:
        options.add_aliases(parser)  # loaded by the checkout's conftest.py: conftests are loading now


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    result = yield
    # Conftests have registered their options: take the short spellings that are still free.
    early_config.stash[_ALIASES_LEFT] = options.add_aliases(parser)
    return result


_ALIASES_LEFT = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin reads the seed set here
def pytest_configure(config):
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family}: kvconform check family {family}")
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    if not collection.suite_requested(config):
        given = options.given(config)
        if given:
            raise pytest.UsageError(
                f"{', '.join(given)} given, but this run does not collect the kvconform suite; "
                "run it with: pytest --pyargs kvconform.conformance …"
            )
        return
    config.stash[RUN] = SuiteRun.start(config)


# ----------------------------------------------------------------------------- 2. backends
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

        if not torch.cuda.is_available():  # Triton kernels run on CPU through the interpreter
            os.environ.setdefault("TRITON_INTERPRET", "1")
        if hasattr(config, "workerinput"):
            # xdist workers already fill the cores: a second intra-op thread each makes every small
            # indexing op wait on a descheduled OpenMP thread (12 ms instead of 10 µs, measured).
            torch.set_num_threads(1)
        from hypothesis import HealthCheck, Phase, settings
        from hypothesis.configuration import set_hypothesis_home_dir

        from kvconform.reports import expectations

        opts = options.RunOptions.from_config(config, "cuda" if torch.cuda.is_available() else "cpu")
        if opts.certify:
            from .certify import pinned

            opts = pinned(config, opts)
        try:
            options.validate(opts)
        except options.OptionError as exc:
            raise pytest.UsageError(str(exc)) from exc
        controller = not hasattr(config, "workerinput")  # xdist workers send their reports to the controller
        if controller:
            _check_outputs(config, opts)
        else:
            from .completeness import DeselectionTally

            config.pluginmanager.register(DeselectionTally(config), "kvconform-deselected")
        # Hypothesis' scratch files go beside the results, never into the caller's tree or site-packages.
        set_hypothesis_home_dir(os.path.join(os.path.dirname(os.path.abspath(opts.json_path)), ".hypothesis"))
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
        try:
            known = expectations.parse(opts.expectations) if opts.expectations else []
        except expectations.ExpectationsError as exc:
            raise pytest.UsageError(f"--kvc-expectations: {exc}") from exc
        backends, left_out = _load_backends(opts.backends)
        try:  # options not given, from what the backends declare (run_defaults.py)
            opts = dataclasses.replace(opts, standard=run_defaults.standard(opts.standard, backends, explicit=bool(opts.backends)),
                                       timeout=run_defaults.timeout(opts.timeout, backends))
        except run_defaults.UsageError as exc:
            raise pytest.UsageError(str(exc)) from exc
        compare = _load_compare(opts.compare_digests)
        if compare is None and opts.certify:  # nothing waived: without another machine's file, compare with the reference's
            from ..harness.digests import reference_export

            compare = reference_export([layout for loaded in backends.values() if loaded.backend for layout in loaded.backend.capabilities.layouts])
        run = cls(options=opts, backends=backends, expectations=known, compare=compare, left_out=left_out)
        if controller:
            from .outputs import OutputError, ResultsLock
            from .recorder import ResultRecorder, environment

            try:
                lock = ResultsLock.acquire(opts.json_path)  # last: nothing below can refuse the run
            except OutputError as exc:
                raise pytest.UsageError(str(exc)) from exc
            config.pluginmanager.register(ResultRecorder(run, environment(run, run.backend_facts()), lock), "kvconform-results")
            if opts.certify:
                from .certify import Certifier

                config.pluginmanager.register(Certifier(run), "kvconform-certify")
        return run

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


def _check_outputs(config, opts: options.RunOptions) -> None:
    """Every output path writable (outputs.py) and the expectations update unambiguous, before any test runs."""
    from kvconform.reports import expectations

    from .outputs import OutputError, check_writable

    html = opts.html_path or os.path.splitext(opts.json_path)[0] + ".html"
    paths = [("--kvc-json", opts.json_path), ("--kvc-html", html), ("--kvc-update-expectations", opts.update_expectations),
             ("--kvc-export-digests", opts.export_digests), ("--junitxml", getattr(config.option, "xmlpath", None))]
    try:
        for option, path in paths:
            if path:
                check_writable(option, path)
        target = opts.update_expectations
        if target and os.path.exists(target):
            if opts.expectations and not (os.path.exists(opts.expectations) and os.path.samefile(target, opts.expectations)):
                raise OutputError(f"--kvc-update-expectations {target}: exists and is not the --kvc-expectations file "
                                  f"{opts.expectations}; which entries to keep would be ambiguous. Pass the same file to update "
                                  "it in place, or a path that does not exist yet")
            expectations.parse(target)  # a file kvconform cannot read is never rewritten
    except (OutputError, expectations.ExpectationsError) as exc:
        raise pytest.UsageError(str(exc)) from exc


def _load_backends(names: tuple[str, ...]) -> tuple[dict, dict]:
    """The backends to run, and the default built-ins left out because they cannot load here."""
    from kvconform.backends_under_test import registry

    explicit = bool(names)
    names = names or tuple(registry.default_names())
    unknown = [n for n in names if not registry.is_known(n)]
    if unknown:
        raise pytest.UsageError(
            f"--kvc-backend: unknown backend(s) {', '.join(unknown)}; registered: {', '.join(sorted(registry.registered()))} "
            "(or pass 'vllm:NAME[+shuffle]' or 'pkg.module:attr')"
        )
    loaded = {name: registry.load(name) for name in names}
    if not explicit:  # the default is every built-in that can run here
        runnable = {n: l for n, l in loaded.items() if l.backend is not None}
        if runnable:
            return runnable, {n: l.unavailable or l.error for n, l in loaded.items() if n not in runnable}
    return loaded, {}


def _load_compare(path):
    if not path:
        return None
    from ..harness.digests import DigestFileError, load

    try:
        return load(path)
    except DigestFileError as exc:
        raise pytest.UsageError(f"--kvc-compare-digests: {exc}") from exc


def pytest_report_header(config):
    run = config.stash.get(RUN, None)
    if run is None:
        return None
    import platform

    import torch

    from kvconform.reports.results import package_version

    o = run.options
    name = torch.cuda.get_device_name() if o.device.startswith("cuda") else platform.processor() or "cpu"
    lines = [
        f"kvconform: torch {torch.__version__} (hip {torch.version.hip}), triton {package_version('triton') or 'absent'}, "
        f"device {o.device} ({name}), profile {o.profile}, seed {o.seed}, standard {o.standard}",
    ]
    left = config.stash.get(_ALIASES_LEFT, [])
    if left:
        lines.append(f"kvconform: another plugin or conftest owns {', '.join(left)} here; kvconform's are spelled --kvc-NAME")
    for loaded in run.backends.values():
        if loaded.backend is None:
            state = f"NOT AVAILABLE HERE ({loaded.unavailable})" if loaded.unavailable else f"LOAD ERROR {loaded.error}"
            lines.append(f"  backend {loaded.name}: {state}")
            continue
        b = loaded.backend
        fp8 = b.cache_dtype("fp8", torch.bfloat16) if "fp8" in b.capabilities.kv_cache_dtypes else "-"
        lines.append(
            f"  backend {b.name}: platform {b.platform}, arch {b.arch() or '-'}, fp8 {fp8}, "
            f"standards {sorted(b.capabilities.standards) or '-'}, versions {b.versions()}"
        )
    return lines


# ----------------------------------------------------------------------------- collection
@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path, parent):
    if RUN in parent.config.stash and path.resolve() == collection.suite_dir():
        return collection.SuitePackage.from_parent(parent, path=path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path, parent):
    if RUN in parent.config.stash and collection.is_check_file(module_path):
        return collection.SuiteModule.from_parent(parent, path=module_path)
    return None


def pytest_collect_file(file_path, parent):
    # Check files a vendor's python_files ini would not collect are still the suite's.
    if RUN in parent.config.stash and collection.is_check_file(file_path) and not collection.collected_by_pytest(file_path, parent):
        return collection.SuiteModule.from_parent(parent, path=file_path)
    return None


def pytest_generate_tests(metafunc):
    run = metafunc.config.stash.get(RUN, None)
    if run is None or "case" not in metafunc.fixturenames:
        return
    from ..harness.applicability import layouts_for, unavailable_backend
    from ..harness.sweeps import expand

    marker = metafunc.definition.get_closest_marker("kvc_layouts")
    kind = marker.args[0] if marker else "all"
    params, ids = [], []
    for loaded in run.backends.values():
        if loaded.backend is None:
            layouts = [unavailable_backend(loaded.name, loaded.unavailable, loaded.out_of_scope) if loaded.unavailable else None]
        else:
            layouts = layouts_for(loaded.backend, kind, run.options.standard)
        for layout in layouts:
            params.append((loaded, layout))
            if loaded.backend is None or layout is None:
                ids.append(loaded.name)
            else:
                ids.append(f"{loaded.name}-{layout.era}:{layout.alias}" if getattr(layout, "era", None) else f"{loaded.name}-n/a")
    argnames, params, ids = expand(metafunc.fixturenames, params, ids)
    metafunc.parametrize(argnames, params, ids=ids, indirect=["case_param"])


# ----------------------------------------------------------------------------- 3. applicability
def _markers(item) -> dict:
    found = {}
    for name in ("kvc_op", "kvc_layouts"):
        marker = item.get_closest_marker(name)
        if marker:
            found[name] = marker.args[0]
    found["kvc_needs"] = tuple(m.args[0] for m in item.iter_markers("kvc_needs"))
    return found


def pytest_collection_modifyitems(config, items):
    run = config.stash.get(RUN, None)
    if run is None:
        return
    from kvconform.reports import expectations

    from ..harness.applicability import Context, NotApplicable, needs_of, not_applicable
    from .command import repro_line
    from ..harness.sweeps import not_applicable_param

    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "case_param" not in callspec.params:
            continue
        loaded, layout = callspec.params["case_param"]
        backend = loaded.backend
        family = next((m.name for m in item.iter_markers() if m.name in FAMILIES), "other")
        test_id = collection.test_id(item)
        item.user_properties += [
            ("test_id", test_id), ("backend", loaded.name), ("family", family), ("check", item.originalname),
            ("platform", backend.platform if backend else "unknown"), ("arch", backend.arch() if backend else ""),
            ("layout", str(layout) if getattr(layout, "era", None) else None),
            ("repro", repro_line(test_id, loaded.name, run.options.cli_args())),
            ("clauses", [c for m in item.iter_markers("kvc_clause") for c in m.args]),
        ]
        if isinstance(layout, NotApplicable):
            reason = layout
        elif backend is None:
            reason = None  # a load error: the case fixture fails the test with it
        else:
            ctx = Context(backend=backend, layout=layout, standard=run.options.standard, device=run.options.device,
                          huge=run.options.huge, compare_digests=run.compare is not None)
            reason = not_applicable(ctx, needs_of(_markers(item), callspec.params.get("golden_case"))) or not_applicable_param(callspec.params)
        if reason:
            item.user_properties.append(("not_applicable", reason.as_record()))
            item.add_marker(pytest.mark.skip(reason=f"not applicable: {reason}"))
            continue
        tags = {t for t in (backend.platform, backend.arch(), loaded.name) if t} if backend else {loaded.name}
        known = expectations.first_match(run.expectations, test_id, tags)
        if known and known.outcome == "Skip":
            item.add_marker(pytest.mark.skip(reason=f"expectation {known.file}:{known.line}: {known.reason}"))
        elif known:  # Fail / Crash: a known failure, reported but not failing the run
            item.add_marker(pytest.mark.xfail(reason=f"expected {known.outcome} ({known.file}:{known.line}: {known.reason})", strict=False))


# ----------------------------------------------------------------------------- 4. fixtures
@pytest.fixture
def case_param(request):
    return request.param


@pytest.fixture
def case(request, case_param):
    import torch

    from ..harness.case import Case

    run = request.config.stash[RUN]
    loaded, layout = case_param
    if loaded.backend is None:
        pytest.fail(f"backend {loaded.name} failed to load: {loaded.error}", pytrace=False)
    torch.manual_seed(run.options.seed)
    props = dict(request.node.user_properties)

    def record(key, value):
        request.node.user_properties.append((key, value))

    return Case(backend=loaded.backend, layout=layout, device=run.options.device, seed=run.options.seed,
                standard=run.options.standard, test_id=props["test_id"], repro=props["repro"], record=record, huge=run.options.huge)


@pytest.fixture
def exported_digests(request):
    """The digest file given with --kvc-compare-digests (loaded and checked at start-up); in a
    certified run without one, the reference's digests of the backends' layouts."""
    return request.config.stash[RUN].compare


# ----------------------------------------------------------------------------- 5. running and recording
@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Per-example applicability and per-path block sizes (examples.py)."""
    if RUN not in pyfuncitem.config.stash or "case" not in pyfuncitem.funcargs:
        return None
    from ..harness.examples import call_check

    return call_check(pyfuncitem)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """--kvc-timeout watchdog: a hung test (a kernel that never returns, a Hypothesis loop that
    swallows signals) ends its process; xdist restarts the worker and the report says timeout."""
    run = item.config.stash.get(RUN, None)
    limit = run.options.timeout if run else None
    if not limit or "test_id" not in dict(item.user_properties):
        return (yield)
    test_id = dict(item.user_properties)["test_id"]

    def expire():
        from .recorder import mark_timeout

        mark_timeout(run.options.json_path, test_id)
        sys.stderr.write(f"kvconform: {test_id} exceeded --kvc-timeout {limit}s; ending this process\n")
        os._exit(70)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        return (yield)
    finally:
        timer.cancel()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A failed 2^31 probe (big_caches.py) leaves nothing of its caches behind."""
    if RUN not in item.config.stash or "memory_2_31" not in (m.args[0] for m in item.iter_markers("kvc_needs")):
        return (yield)
    import traceback

    try:
        return (yield)
    except BaseException as exc:
        # pytest renders a failure's frames with their arguments (repr of a multi-GiB cache: the
        # whole tensor read into temporaries, 8-12 GiB measured for one mutant) and keeps the
        # traceback (sys.last_traceback); the check's message already names what differs.
        traceback.clear_frames(exc.__traceback__)
        raise


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Typed reasons for code paths that cannot run here; a failed check's structured details."""
    report = yield
    if RUN not in item.config.stash or call.excinfo is None:
        return report
    from hypothesis.errors import Unsatisfiable

    from kvconform.backends_under_test.contract import OpUnavailable

    from ..harness.applicability import NotApplicable, NotApplicableHere
    from ..harness.examples import unsatisfiable_reason

    exc = call.excinfo.value
    if isinstance(exc, Unsatisfiable) and "case" in getattr(item, "funcargs", {}):
        # Hypothesis gave up because no generated example could run here: not applicable, with why.
        # (The reason is never raised: pytest >= 9 refuses ExceptionInfo of an unraised exception.)
        exc = unsatisfiable_reason(item.funcargs["case"]) or exc
    if isinstance(exc, (OpUnavailable, NotApplicableHere)):
        # The backend's real code path cannot run here (e.g. a compiled op absent): N/A, not a pass.
        reason = exc.reason if isinstance(exc, NotApplicableHere) else NotApplicable.from_op_unavailable(dict(item.user_properties).get("backend", "?"), exc)
        report.outcome = "skipped"
        if hasattr(report, "wasxfail"):  # an expectations entry: a case that cannot run here is no expected failure
            del report.wasxfail
        report.longrepr = (str(item.path), item.location[1] or 0, f"not applicable: {reason}")
        report.user_properties.append(("not_applicable", reason.as_record()))
        return report
    if report.failed and not isinstance(call.excinfo.value, AssertionError):
        report.user_properties.append(("raised", call.excinfo.typename))  # the backend raised: an error, not a finding
    details = getattr(call.excinfo.value, "details", None)
    if details is not None:
        report.user_properties.append(("failure", details))
        item.user_properties.append(("failure", details))  # JUnit reads the teardown report's copy
    return report
