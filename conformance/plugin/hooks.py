"""kvconform's pytest plugin: ``pytest --pyargs kvconform.conformance --backend NAME``.

Registered as the ``pytest11`` entry point ``kvconform``, so an installed kvconform loads it in
every pytest run of the environment. It stays out of the way of runs that are not the suite's:
only ``--kvc-*`` options are registered before conftests load (short spellings follow where
free, options.py), and nothing below ``pytest_configure`` happens unless the run collects
``kvconform.conformance``.

The path of one verdict (docs/ARCHITECTURE.md):

1. start-up: the run planned from its options (run_plan.py), then wired (session.py): options,
   backends, expectations, validated once; bad input is one ``InputError``, turned into a usage
   error here;
2. collection: every check is parametrized with the backends' (layout, sweep value) cases
   (harness/applicability.py, harness/sweeps.py) and planned (collection.Planned: identity,
   a not-applicable reason, an expectations entry);
3. the test runs with the ``case`` fixture (below), which collects its facts;
4. each phase's report gets its verdict (verdict.py) and carries the test's record across
   xdist as one property; the recorder (recorder.py) writes JSON, HTML, JUnit and the terminal report.
"""

from __future__ import annotations

import atexit
import copy
import inspect
import sys
import traceback
from typing import TYPE_CHECKING

import pytest

from kvconform.errors import InputError

from . import collection, forked_workers, options, quiet_exit, watchdog

if TYPE_CHECKING:
    from .session import SuiteRun

# This module is loaded by every pytest of the environment, before the xdist zygote is started
# (pytest_load_initial_conftests): what it imports at its top, it imports in every such run and
# before the zygote could import it alongside. The session, the harness and torch (~3.4 s here,
# measured) are therefore imported inside the hooks of a suite run that use them; a second
# import of a module is a dictionary look-up.

ENTRY_POINT = "kvconform"
RUN: pytest.StashKey[SuiteRun] = pytest.StashKey()  # the suite run, once it has started
ALIASES_LEFT = pytest.StashKey[list]()  # short option spellings a conftest or plugin owns here
STATE = pytest.StashKey[dict]()  # per item: the verdict so far
ZYGOTE = pytest.StashKey[forked_workers.Zygote]()


def markers() -> tuple[str, ...]:
    from ..harness.applicability import FEATURES, LAYOUT_KINDS

    return (
        *(f"{family}: kvconform check family {family}" for family in collection.FAMILIES),
        "kvc_op(name): needs the backend to declare op NAME",
        f"kvc_layouts(kind): which declared layouts to run on: {' | '.join(LAYOUT_KINDS)}",
        f"kvc_needs(feature): needs {' | '.join(FEATURES)}",
        "kvc_latent(*selectors): the declared latent formats a latent_format check runs on: mla | mla_fp8 | fp8_ds_mla | indexer",
        "kvc_clause(*ids): the spec clauses (docs/SPEC.md ids) this check verifies",
    )


# ----------------------------------------------------------------------------- 1. start-up
def pytest_addoption(parser, pluginmanager):
    options.add_options(parser)
    if pluginmanager.get_name(sys.modules[__name__]) != ENTRY_POINT:
        options.add_aliases(parser)  # loaded by the checkout's conftest.py: conftests are loading now


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config, parser, args):
    # Before conftests load and this process imports torch: the zygote imports it meanwhile.
    if getattr(early_config.known_args_namespace, "numprocesses", None) and forked_workers.wanted(early_config) and _targets_suite(early_config):
        early_config.stash[ZYGOTE] = forked_workers.Zygote()
    result = yield
    # Conftests have registered their options: take the short spellings that are still free.
    early_config.stash[ALIASES_LEFT] = options.add_aliases(parser)
    return result


@pytest.hookimpl(tryfirst=True)  # before Hypothesis' own plugin reads the seed set here
def pytest_configure(config):
    for line in markers():
        config.addinivalue_line("markers", line)
    zygote = config.stash.get(ZYGOTE, None)
    if not collection.suite_requested(config):
        if zygote:
            zygote.stop()
        given = options.given(config)
        if given:
            raise pytest.UsageError(f"{', '.join(given)} given, but this run does not collect the kvconform suite; "
                                    "run it with: pytest --pyargs kvconform.conformance …")
        return
    atexit.register(quiet_exit.drop_triton_leak_report)  # before the run imports torch and Triton: it runs after their handlers
    from . import session

    try:
        config.stash[RUN] = session.start(config)
    except InputError as exc:  # the one place bad input becomes a usage error (exit 4)
        raise pytest.UsageError(str(exc)) from exc
    if zygote and not forked_workers.use(config, zygote):  # no worker to fork: the header must not say so
        zygote.stop()
        del config.stash[ZYGOTE]


def pytest_unconfigure(config):
    zygote = config.stash.get(ZYGOTE, None)
    if zygote:
        zygote.stop()


def _targets_suite(early_config) -> bool:
    """collection.suite_requested, before pytest has settled the run's arguments."""
    ns = early_config.known_args_namespace
    args = ns.file_or_dir or early_config.getini("testpaths") or ["."]
    return any(collection.targets_suite(arg, ns.pyargs, early_config.invocation_params.dir) for arg in args)


def pytest_report_header(config):
    run = config.stash.get(RUN, None)
    if not run:
        return None
    lines = run.header(config, config.stash.get(ALIASES_LEFT, []))
    if ZYGOTE in config.stash:
        lines.append("kvconform: workers forked from a Python that loaded torch (--kvc-fresh-workers)")
    return lines


# ----------------------------------------------------------------------------- 2. collection
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
    from ..harness.applicability import case_params
    from ..harness.sweeps import expand

    marker = metafunc.definition.get_closest_marker("kvc_layouts")
    kind = marker.args[0] if marker else "all"
    params = [param for loaded in run.backends.values() for param in case_params(loaded, kind, run.options.standard)]
    latent = metafunc.definition.get_closest_marker("kvc_latent")
    argnames, values, ids = expand(metafunc.fixturenames, params, latent.args if latent else ())
    metafunc.parametrize(",".join(argnames), values, ids=ids, indirect=argnames)


def pytest_collection_modifyitems(config, items):
    run = config.stash.get(RUN, None)
    if run is None:
        return
    for item in items:
        planned = collection.plan(item, run)
        if planned is not None:
            item.stash[collection.PLANNED] = planned
            item.user_properties.append(("test_id", planned.test_id))  # JUnit's testcases are matched by it


# ----------------------------------------------------------------------------- 3. fixtures
# The sweep fixtures are parametrized at collection (pytest_generate_tests, harness/sweeps.py):
# ``pytest --fixtures`` lists each with what it holds.
@pytest.fixture
def case_param(request):
    """The (backend, layout) case of this test (harness/applicability.py ``CaseParam``)."""
    return request.param


@pytest.fixture
def case(request, case_param):
    """The check's backend, layout, device and seed, with the test's facts (harness/case.py)."""
    import torch

    from ..harness.case import Case

    run, planned = request.config.stash[RUN], request.node.stash[collection.PLANNED]
    if case_param.loaded.backend is None:
        pytest.fail(f"backend {case_param.loaded.name} failed to load: {case_param.loaded.error}", pytrace=False)
    # torch.manual_seed also queues a seed, with a formatted stack, for every accelerator API not
    # yet initialised (CUDA, XPU, MTIA): ~1.5 ms a test on a CPU run, and the queues only grow.
    torch.default_generator.manual_seed(run.options.seed)
    if run.options.device.startswith("cuda"):
        torch.cuda.manual_seed_all(run.options.seed)
    return Case(backend=case_param.loaded.backend, layout=case_param.layout, device=run.options.device, seed=run.options.seed,
                standard=run.options.standard, test_id=planned.test_id, repro=planned.repro, huge=run.options.huge,
                devices=run.options.devices, backend_spec=case_param.loaded.spec)


@pytest.fixture
def cache_dtype(request):
    """One cache dtype the backend declares: ``auto`` with each model dtype, each fp8
    ``kv_cache_dtype`` with the first model dtype (harness/sweeps.py ``CacheDtype``)."""
    return request.param


@pytest.fixture
def fp8_cache_dtype(request):
    """One fp8 ``kv_cache_dtype`` the backend declares, with the storage dtype it means on the
    backend's platform (harness/sweeps.py ``CacheDtype``)."""
    return request.param


@pytest.fixture
def size_class(request):
    """One size class the backend's declared sizes reach on the layout: H = 1, H = 2, a head
    count, head size or block size that is not a power of two, three layers (harness/sweeps.py ``SizeClass``)."""
    return request.param


@pytest.fixture
def latent_format(request):
    """One latent record format the backend declares (MLA, fp8_ds_mla, indexer), narrowed by the
    check's ``kvc_latent`` marker (harness/sweeps.py ``DeclaredLatentFormat``; ``.fmt`` the format)."""
    return request.param


@pytest.fixture
def exported_digests(request):
    """The digest file given with --kvc-compare-digests (loaded and checked at start-up); in a
    certified run without one, the reference's digests of the backends' layouts."""
    return request.config.stash[RUN].compare


@pytest.fixture
def peers(request):
    """Every backend of this run as a consumer endpoint of the interop table (harness/interop.py)."""
    from ..harness import interop

    return interop.peer_endpoints(request.config.stash[RUN].backends)


# ----------------------------------------------------------------------------- 4. running
@pytest.hookimpl(tryfirst=True)  # before pytest sets up the fixtures: a case planned not applicable builds nothing
def pytest_runtest_setup(item):
    planned = item.stash.get(collection.PLANNED, None)
    if planned is not None and (planned.reason or planned.skip):  # verdict.decide reads why from the plan
        pytest.skip(f"not applicable: {planned.reason}" if planned.reason else planned.skip)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Per-example applicability and per-path block sizes (harness/examples.py): a Hypothesis
    check gets the per-example wrapper, a fixed check of an op whose code paths differ by block
    size runs at each of them. None: pytest calls the check as usual; True: called here."""
    if collection.PLANNED not in pyfuncitem.stash or "case" not in pyfuncitem.funcargs:
        return None
    from ..harness.examples import run_at_path_block_sizes, skipping_unavailable_examples
    from ..harness.facts import spec_key
    from ..harness.strategies import geometry_choices

    function, case = pyfuncitem.obj, pyfuncitem.funcargs["case"]
    handle = getattr(function, "hypothesis", None)
    if handle is not None:
        candidates = {spec_key(case.layout, *choice) for choice in geometry_choices(case)} if case.layout is not None else set()
        handle.inner_test = skipping_unavailable_examples(handle.inner_test, candidates)
        return None
    marker = pyfuncitem.get_closest_marker("kvc_op")
    size_class = pyfuncitem.funcargs.get("size_class")
    if marker is None or case.layout is None or "golden_case" in pyfuncitem.funcargs or (size_class and size_class.field == "block_size"):
        return None  # golden cases and block-size classes write at their own block size
    sizes = case.backend.path_block_sizes(marker.args[0], case.layout)
    if len(sizes) < 2:
        return None
    args = {name: pyfuncitem.funcargs[name] for name in inspect.signature(function).parameters}
    run_at_path_block_sizes(lambda sized: function(**{**args, "case": sized}), case, sizes)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """--kvc-timeout: a hung test ends its process (watchdog.py)."""
    run, planned = item.config.stash.get(RUN, None), item.stash.get(collection.PLANNED, None)
    if not (run and run.options.timeout and planned):
        return (yield)
    recorder = item.config.pluginmanager.get_plugin("kvconform-results")  # None on an xdist worker
    last_words = (lambda: recorder.finish_timed_out(item.config, planned)) if recorder else None
    timer = watchdog.start(run.options.timeout, run.options.json_path, planned.test_id, last_words)
    try:
        return (yield)
    finally:
        timer.cancel()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A failed check leaves nothing of its caches behind: pytest renders a failure's frames with
    their arguments (the repr of a multi-GiB cache of a 2^31 probe: 8-12 GiB measured for one
    mutant) and keeps the traceback. The check's own message names what differs."""
    if collection.PLANNED not in item.stash:
        return (yield)
    try:
        return (yield)
    except BaseException as exc:
        traceback.clear_frames(exc.__traceback__)
        raise


@pytest.hookimpl(tryfirst=True, specname="pytest_runtest_makereport")
def report_not_applicable_briefly(item, call):
    """A phase that raised what applicability.reason_of calls not applicable gets pytest's report
    with a one-line text instead of a formatted traceback: the verdict below replaces it, and
    formatting one through a real backend's frames (vLLM, Hypothesis) took ~15 ms a test — 11 s of
    a 146 s run of seven vLLM backends. None: pytest makes the report."""
    planned = item.stash.get(collection.PLANNED, None)
    if planned is None or call.excinfo is None:
        return None
    from ..harness.applicability import reason_of

    exc = call.excinfo.value
    if reason_of(exc, planned.backend, getattr(item, "funcargs", {}).get("case")) is None:
        return None
    return brief_report(item, call, f"{type(exc).__name__}: {exc}")


def brief_report(item, call, text: str) -> pytest.TestReport | None:
    """pytest's report of a phase that raised, with ``text`` in place of its traceback; None where
    this pytest cannot make one (then it makes its own, traceback and all). pytest 8 and 9 keep a
    ``CallInfo.excinfo`` that is not an ``ExceptionInfo`` as the report's text, outcome failed
    (``TestReport.from_item_and_call``; tests/test_plugin_surface.py)."""
    brief = copy.copy(call)
    try:
        brief.excinfo = text
        report = pytest.TestReport.from_item_and_call(item, brief)
    except (AttributeError, TypeError):  # a frozen CallInfo, or a report that reads the exception
        return None
    return report if report.longrepr == text else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """Each phase's verdict (verdict.py), told to pytest and carried to the controller with the record."""
    report = yield
    planned = item.stash.get(collection.PLANNED, None)
    if planned is None:
        return report
    from . import verdict
    from .recorder import payload

    case = getattr(item, "funcargs", {}).get("case")
    phase = verdict.decide(call.when, call.excinfo.value if call.excinfo else None, report.skipped, planned, case)
    state = item.stash.setdefault(STATE, {"verdict": None, "duration_s": 0.0})
    state["verdict"] = verdict.combine(state["verdict"], phase)
    state["duration_s"] += report.duration
    if phase is state["verdict"]:
        verdict.tell_pytest(report, phase)
    report.user_properties.append(("kvconform", payload(planned, state, case)))
    return report
