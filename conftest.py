"""kvconform's pytest plugin: ``pytest conformance --backend NAME``.

- ``--backend`` (repeatable, comma-separated; default every built-in that loads here) picks
  backends from the registry; each becomes a parameter of every check.
- Checks are generated only for what a backend declares: ops it lacks, standards it does not
  implement and layouts a family does not apply to become *not applicable* skips, decided
  in one collection hook from markers — never passes.
- ``--seed`` seeds Hypothesis and every input; ``--profile quick|full`` sets the example budget.
- One JSON record per test goes to ``--kvc-json`` (reports/results.py).
"""

from __future__ import annotations

import os
import platform
import sys
import threading

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run on CPU through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")
from hypothesis import HealthCheck, Phase, settings

from backends_under_test import registry
from backends_under_test.contract import OpUnavailable
from reports import expectations, results

FAMILIES = ("shape", "split", "write", "shuffle", "swap", "copy", "read", "gating", "equivalence")
# quick: a cheap verdict — few examples, failing examples reported as found (no shrinking);
# full: thorough, and failures shrink to a minimal example.
PROFILES = {
    "quick": dict(max_examples=6, phases=(Phase.explicit, Phase.generate)),
    "full": dict(max_examples=80),
}


def pytest_addoption(parser):
    group = parser.getgroup("kvconform")
    group.addoption("--backend", action="append", default=[], help="backend name(s), comma-separated or repeated; 'pkg.module:attr' or 'mutant:NAME' also accepted")
    group.addoption("--device", default=None, help="device for caches (default: cuda if available, else cpu)")
    group.addoption("--seed", type=int, default=0, help="seed for Hypothesis and all generated data (default 0)")
    group.addoption("--profile", choices=sorted(PROFILES), default="quick", help="Hypothesis example budget")
    group.addoption("--standard", choices=("e1", "e3"), default="e1", help="layout standard checks 1-2 hold backends to")
    group.addoption("--kvc-json", default="kvconform-results/results.json", help="where to write per-test JSON results")
    group.addoption("--kvc-html", default=None, help="where to write the HTML report (default: next to --kvc-json)")
    group.addoption("--kvc-huge", action="store_true", help="also run the >2^31-element cache check on CPU (needs ~10 GiB RAM)")
    group.addoption("--kvc-timeout", type=float, default=None, help="seconds per test; a test past it ends its process (use with xdist -n, or `kvconform run`) and is reported timeout")
    group.addoption("--export-digests", default=None, help="write this run's equivalence digests (for --compare-digests on another machine)")
    group.addoption("--compare-digests", default=None, help="compare this run's digests with a file written by --export-digests")
    group.addoption("--expectations", default=None, help="vendor expectations file: known failures do not fail the run (docs/EXPECTATIONS.md)")
    group.addoption("--update-expectations", default=None, help="write the current failures as the next expectations baseline")


def pytest_configure(config):
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family}: kvconform check family {family}")
    config.addinivalue_line("markers", "kvc_op(name): needs the backend to declare op NAME")
    config.addinivalue_line("markers", "kvc_layouts(kind): which declared layouts to run on: all | tiled | standard | connector | none")
    config.addinivalue_line("markers", "kvc_needs(feature): needs fp8 | single_kv_head | standard_e1 | standard_e3 | selector | gpu | memory_2_31 | compare_digests")
    seed = config.getoption("seed")
    settings.register_profile(
        "kvconform", database=None, deadline=None, derandomize=False,
        suppress_health_check=list(HealthCheck), **PROFILES[config.getoption("profile")],
    )
    settings.load_profile("kvconform")
    config.option.hypothesis_seed = str(seed)  # read by Hypothesis' own plugin
    config._kvc_backends = _selected_backends(config)
    config._kvc_device = _device(config)
    config._kvc_compare = _load_compare(config.getoption("compare_digests"))
    try:
        config._kvc_expectations = expectations.parse(config.getoption("expectations")) if config.getoption("expectations") else []
    except expectations.ExpectationsError as exc:
        raise pytest.UsageError(f"--expectations: {exc}") from exc
    if not hasattr(config, "workerinput"):  # xdist workers send reports to the controller
        config.pluginmanager.register(results.ResultRecorder(config, results.environment(config, _backend_facts(config))), "kvconform-results")


def _load_compare(path):
    if not path:
        return None
    from reports import digests

    try:
        return digests.load(path)
    except digests.DigestFileError as exc:
        raise pytest.UsageError(f"--compare-digests: {exc}") from exc


def _selected_backends(config) -> dict[str, registry.Loaded]:
    names = [n.strip() for value in config.getoption("backend") for n in value.split(",") if n.strip()]
    explicit = bool(names)
    names = names or registry.default_names()
    unknown = [n for n in names if not registry.is_known(n)]
    if unknown:
        raise pytest.UsageError(
            f"--backend: unknown backend(s) {', '.join(unknown)}; registered: {', '.join(sorted(registry.registered()))} "
            "(or pass 'vllm:NAME[+shuffle]' or 'pkg.module:attr')"
        )
    loaded = {name: registry.load(name) for name in dict.fromkeys(names)}
    if not explicit:  # the default is every built-in that can run here
        loaded = {n: l for n, l in loaded.items() if l.backend is not None} or loaded
    return loaded


def _device(config) -> str:
    return config.getoption("device") or ("cuda" if torch.cuda.is_available() else "cpu")


def _backend_facts(config) -> dict:
    facts = {}
    for name, loaded in config._kvc_backends.items():
        b = loaded.backend
        if b is None:
            facts[name] = {"unavailable": loaded.unavailable} if loaded.unavailable else {"error": loaded.error}
            continue
        fp8 = str(b.cache_dtype("fp8", torch.bfloat16)) if "fp8" in b.capabilities.kv_cache_dtypes else None
        facts[name] = {"platform": b.platform, "arch": b.arch(), "fp8": fp8, "standards": sorted(b.capabilities.standards), **b.versions()}
    return facts


def pytest_report_header(config):
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = "absent"
    device = _device(config)
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    lines = [
        f"kvconform: torch {torch.__version__} (hip {torch.version.hip}), triton {triton_version}, "
        f"device {device} ({name}), profile {config.getoption('profile')}, seed {config.getoption('seed')}, "
        f"standard {config.getoption('standard')}",
    ]
    for loaded in config._kvc_backends.values():
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


def _layouts_for(backend, kind: str, standard: str):
    layouts = backend.capabilities.layouts
    if kind == "connector":  # E1: every layout is the standard; E3: those a connector runs with
        return list(layouts) if standard == "e1" else [lay for lay in backend.connector_layouts() if backend.supports_kv_connector()]
    if kind == "tiled":
        return [lay for lay in layouts if lay.is_tiled]
    if kind == "none":
        return [None]
    return list(layouts)


def pytest_generate_tests(metafunc):
    if "case" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("kvc_layouts")
    kind = marker.args[0] if marker else "all"
    params, ids = [], []
    for loaded in metafunc.config._kvc_backends.values():
        layouts = _layouts_for(loaded.backend, kind, metafunc.config.getoption("standard")) if loaded.backend else [None]
        if not layouts:  # family does not apply to any declared layout: one N/A cell
            layouts = [f"no {kind} layout declared"]
        for layout in layouts:
            params.append((loaded, layout))
            label = getattr(layout, "era", None) and f"{layout.era}:{layout.alias}"
            ids.append(loaded.name if layout is None else f"{loaded.name}-{label or 'n/a'}")
    metafunc.parametrize("case_param", params, ids=ids, indirect=True)


def _not_applicable(item, loaded, layout, standard) -> str | None:
    """Why this check does not apply to this backend/layout, or None."""
    backend = loaded.backend
    if backend is None:
        return loaded.unavailable
    caps = backend.capabilities
    if isinstance(layout, str):
        return layout
    op = item.get_closest_marker("kvc_op")
    if op and op.args[0] not in caps.ops:
        return f"{backend.name} does not declare op '{op.args[0]}'"
    golden = getattr(item, "callspec", None) and item.callspec.params.get("golden_case")
    if golden is not None:
        reason = _golden_case_unsupported(golden, caps, layout, backend)
        if reason:
            return f"{backend.name} {reason}"
    for need in item.iter_markers("kvc_needs"):
        reason = _missing(need.args[0], caps, item.config, backend)
        if reason:
            return f"{backend.name} {reason}"
    if item.get_closest_marker("kvc_layouts") and item.get_closest_marker("kvc_layouts").args[0] in ("standard", "connector"):
        if standard not in caps.standards:
            return f"{backend.name} declares standards {sorted(caps.standards) or 'none'}, not --standard {standard}"
    return None


def _golden_case_unsupported(golden, caps, layout, backend) -> str | None:
    """Why a golden equivalence case lies outside a backend's declared capabilities."""
    from conformance.equivalence import geometry

    for what, value, allowed in (("kv_cache_dtype", golden.kv_cache_dtype, caps.kv_cache_dtypes), ("dtype", golden.model_dtype, caps.dtypes),
                                 ("block_size", golden.block_size, caps.block_sizes), ("head_size", golden.head_size, caps.head_sizes),
                                 ("num_kv_heads", golden.num_kv_heads, caps.num_kv_heads)):
        if value not in allowed:
            return f"does not declare {what}={value} (golden case {golden.name})"
    try:
        layout.validate(geometry(golden, backend.cache_dtype(golden.kv_cache_dtype, golden.model_dtype)))
    except ValueError as exc:
        return f"layout cannot hold golden case {golden.name}: {exc}"
    return None


def _available_ram() -> int:
    """RAM the kernel can hand out now: MemAvailable counts reclaimable page cache, which a
    machine that just cloned and installed things is full of (free pages alone undercount)."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _missing(feature: str, caps, config, backend) -> str | None:
    """Why a backend lacks a feature a check needs (``kvc_needs`` marker), or None."""
    from conformance.harness import FP8_KV_CACHE_DTYPES

    if feature == "fp8":
        return None if set(caps.kv_cache_dtypes) & set(FP8_KV_CACHE_DTYPES) else "declares no fp8 kv_cache_dtype"
    if feature == "single_kv_head":
        return None if 1 in caps.num_kv_heads else "does not declare num_kv_heads=1"
    if feature in ("standard_e1", "standard_e3"):
        wanted = feature[-2:]
        return None if config.getoption("standard") == wanted else f"is checked against --standard {config.getoption('standard')} (check is {wanted.upper()}-specific)"
    if feature == "selector":
        return None if backend.selection_order(use_kv_connector=False) is not None else "has no platform selector to check"
    if feature == "compare_digests":
        return None if config._kvc_compare else "needs --compare-digests FILE"
    if feature == "gpu":
        return None if _device(config).startswith("cuda") else "runs without a GPU here"
    if feature == "memory_2_31":  # cache past 2^31 elements + its reference copy
        if _device(config).startswith("cuda"):
            return None if torch.cuda.mem_get_info()[0] >= 12 << 30 else "skipped by memory: a cache past 2^31 elements needs >= 12 GiB free on the GPU"
        if not config.getoption("kvc_huge"):
            return "skipped by memory: a cache past 2^31 elements (>= 2 GiB, twice) runs on CPU only with --kvc-huge"
        free = _available_ram()
        return None if free >= 10 << 30 else f"skipped by memory: --kvc-huge needs >= 10 GiB free RAM, {free >> 30} GiB here"
    raise ValueError(f"kvc_needs: unknown feature {feature!r}")


def pytest_collection_modifyitems(config, items):
    standard = config.getoption("standard")
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None or "case_param" not in callspec.params:
            continue
        loaded, layout = callspec.params["case_param"]
        family = next((m.name for m in item.iter_markers() if m.name in FAMILIES), "other")
        backend = loaded.backend
        item.user_properties += [
            ("backend", loaded.name), ("family", family), ("check", item.originalname),
            ("platform", backend.platform if backend else "unknown"), ("arch", backend.arch() if backend else ""),
        ]
        item.add_marker(pytest.mark.xdist_group(loaded.name))  # --dist loadgroup: one worker per backend
        reason = _not_applicable(item, loaded, layout, standard)
        if reason:
            item.add_marker(pytest.mark.skip(reason=results.NOT_APPLICABLE + reason))
            continue
        tags = {t for t in (backend.platform, backend.arch(), loaded.name) if t} if backend else {loaded.name}
        known = expectations.first_match(config._kvc_expectations, item.nodeid, tags)
        if known and known.outcome == "Skip":
            item.add_marker(pytest.mark.skip(reason=f"expectation {known.file}:{known.line}: {known.reason}"))
        elif known:  # Fail / Crash: a known failure, reported but not failing the run
            item.add_marker(pytest.mark.xfail(reason=f"expected {known.outcome} ({known.file}:{known.line}: {known.reason})", strict=False))


@pytest.fixture
def case_param(request):
    return request.param


@pytest.fixture
def case(request, case_param):
    from conformance.harness import Case

    loaded, layout = case_param
    if loaded.backend is None:
        pytest.fail(f"backend {loaded.name} failed to load: {loaded.error}", pytrace=False)
    seed = request.config.getoption("seed")
    torch.manual_seed(seed)

    def record(key, value):
        request.node.user_properties.append((key, value))

    case = Case(
        backend=loaded.backend, layout=layout, device=_device(request.config), seed=seed,
        standard=request.config.getoption("standard"), nodeid=request.node.nodeid, record=record,
    )
    record("repro", case.repro)
    return case


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """--kvc-timeout watchdog: a hung test (a kernel that never returns, a Hypothesis loop that
    swallows signals) ends its process; xdist restarts the worker and the report says timeout."""
    limit = item.config.getoption("kvc_timeout")
    if not limit:
        yield
        return

    def expire():
        results.mark_timeout(item.config, item.nodeid)
        sys.stderr.write(f"kvconform: {item.nodeid} exceeded --kvc-timeout {limit}s; ending this process\n")
        os._exit(70)

    timer = threading.Timer(limit, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Attach a failed check's structured details (mismatches, byte map) to its report."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(OpUnavailable):
        # The backend's real code path cannot run here (e.g. a compiled op absent): N/A, not a pass.
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, results.NOT_APPLICABLE + str(call.excinfo.value))
        return
    if call.excinfo is not None and report.failed and not isinstance(call.excinfo.value, AssertionError):
        report.user_properties.append(("raised", call.excinfo.typename))  # the backend raised: an error, not a finding
    details = getattr(call.excinfo.value, "details", None) if call.excinfo else None
    if details is not None:
        report.user_properties.append(("failure", details))
        item.user_properties.append(("failure", details))  # JUnit reads the teardown report's copy
