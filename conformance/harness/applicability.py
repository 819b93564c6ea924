"""When a check does not apply — the one module that decides it, always with a typed reason.

Before a test runs:

- :func:`case_params`: the (backend, layout) cases a check is parametrized with; a backend whose
  library is absent, or that declares no layout of the kind the check asks for, gives one case
  that carries its reason (sweeps.py gives :func:`by_declaration`'s for a sweep with no declared value);
- :func:`not_applicable`: a check states what it needs with markers — ``kvc_op(NAME)``,
  ``kvc_layouts(KIND)``, ``kvc_needs(FEATURE)`` — and a golden-case parameter where it has
  one; the needs (:data:`NEEDS`, one :class:`Need` row each) are evaluated against the
  backend's declaration, this run's options and this machine, and the first unmet one is returned.

While it runs, :func:`reason_of` turns what a check or backend raised into a reason: a check
that finds out only then (:class:`NotApplicableHere`, built by :func:`undeclared` or
:func:`no_digest_for`), a backend code path that cannot run on this machine (``OpUnavailable``;
the harness aggregates those of several cases with the ``unavailable_…`` functions), or
Hypothesis giving up because no example could run here. No module but this one and the backends
constructs a reason (tests/test_applicability_single_place.py).

A :class:`NotApplicable` says *who* lacks *what*, and of which *kind*. Only ``declaration``
reasons mean "the backend says it does not do this"; ``run`` and ``machine`` reasons are
properties of this invocation or this machine, so a run that needs to show full coverage can
tell them apart. An unmet need is never a pass.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable
from typing import Any

import torch
from hypothesis.errors import Unsatisfiable

from kvconform import reference as R
from kvconform.backends_under_test.contract import CONNECTOR_OPS, Backend, OpUnavailable

from . import placement
from .lazy_memory import lazy_mapping

DECLARATION, RUN, MACHINE = "declaration", "run", "machine"
LAYOUT_KINDS = ("all", "tiled", "standard", "connector", "none", "latent", "quant")


@dataclasses.dataclass(frozen=True)
class NotApplicable:
    """Why a check does not run: ``who`` lacks ``what``; ``kind`` is declaration | run | machine."""

    kind: str
    who: str
    what: str

    def __str__(self) -> str:
        return f"{self.who} {self.what}"

    def as_record(self) -> dict:
        return dataclasses.asdict(self)


class NotApplicableHere(Exception):
    """Raised by a check that finds out only while running that it does not apply."""

    def __init__(self, reason: NotApplicable):
        super().__init__(str(reason))
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Context:
    """What the needs are judged against."""

    backend: Backend
    layout: R.Layout | None
    standard: str
    device: str
    huge: bool
    compare_digests: bool
    devices: tuple[str, ...] = ()  # --kvc-devices (or every GPU of a cuda run with several)


def _backend(ctx: Context) -> str:
    return f"backend {ctx.backend.name}"


def _fp8(ctx, _):
    return None if set(ctx.backend.capabilities.kv_cache_dtypes) & set(R.fp8.KV_CACHE_DTYPES) else "declares no fp8 kv_cache_dtype"


def _single_kv_head(ctx, _):
    return None if 1 in ctx.backend.capabilities.num_kv_heads else "does not declare num_kv_heads=1"


def _selector(ctx, _):
    backend = ctx.backend
    without = backend.selection_order(use_kv_connector=False)
    if without is None:
        return "has no platform selector to check"
    name = backend.selection_name()
    if name not in without and name not in backend.selection_order(use_kv_connector=True):
        # Offered neither way: a with/without comparison would pass whatever the selector does.
        return f"platform selector of backend {backend.name}", f"lists {name} neither with nor without a connector ({without})"
    return None


def _op(ctx, name):
    caps = ctx.backend.capabilities
    declared = caps.ops | (caps.latent.ops if caps.latent else frozenset())
    return None if name in declared else ctx.backend.undeclared_op(name)


def _declared_standard(ctx, kind):
    if kind not in ("standard", "connector") or ctx.backend.capabilities.standards:
        return None
    return "declares no layout standard (E1 blocks-first or E3)"


def _run_standard(ctx, kind):
    standards = ctx.backend.capabilities.standards
    if kind not in ("standard", "connector") or not standards or ctx.standard in standards:
        return None
    return f"checks --standard {ctx.standard}; backend {ctx.backend.name} declares {sorted(standards)}"


def _standard_specific(ctx, wanted):
    return None if ctx.standard == wanted else f"checks --standard {ctx.standard}; the check is {wanted.upper()}-specific"


def _golden_case(ctx, golden):
    """A golden equivalence case must lie inside the declared capabilities and fit the layout."""
    caps = ctx.backend.capabilities
    for what, value, allowed in (("kv_cache_dtype", golden.kv_cache_dtype, caps.kv_cache_dtypes), ("dtype", golden.model_dtype, caps.dtypes),
                                 ("block_size", golden.block_size, caps.block_sizes), ("head_size", golden.head_size, caps.head_sizes),
                                 ("num_kv_heads", golden.num_kv_heads, caps.num_kv_heads)):
        if value not in allowed:
            return f"does not declare {what}={value} (golden case {golden.name})"
    try:
        ctx.layout.validate(golden.geometry(ctx.backend.cache_dtype(golden.kv_cache_dtype, golden.model_dtype)))
    except ValueError as exc:
        return f"declares layout {ctx.layout.alias}, which cannot hold golden case {golden.name}: {exc}"
    return None


def _declares_standard(ctx, wanted):
    return None if wanted in ctx.backend.capabilities.standards else f"declares no {wanted.upper()} standard (the check is {wanted.upper()}-specific)"


def _cpu_platform(ctx, _):
    if ctx.device.startswith("cuda") or ctx.backend.platform != "cpu":
        return None
    return "declares platform cpu: its caches are host memory, a swap has no device side"


def _gpu(ctx, _):
    return None if ctx.device.startswith("cuda") else f"has no CUDA or ROCm GPU (caches on {ctx.device})"


def _compare_digests(ctx, _):
    return None if ctx.compare_digests else "has no --compare-digests FILE"


def available_ram() -> int:
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


def _memory_2_31(ctx, _):  # the probes of big_caches.py: a cache past 2^31 elements and its expected twin
    if ctx.device.startswith("cuda"):
        free = torch.cuda.mem_get_info()[0]
        return None if free >= 12 << 30 else f"has {free >> 30} GiB free on the GPU; a cache past 2^31 elements needs >= 12 GiB"
    free = available_ram()
    if ctx.huge:
        return None if free >= 10 << 30 else f"has {free >> 30} GiB of RAM available; --kvc-huge needs >= 10 GiB"
    # Lazily mapped arenas cost only the pages touched; the mapping itself needs address space.
    try:
        lazy_mapping(3 << 31).close()
    except OSError as exc:
        return f"cannot map 6 GiB of address space for a lazily mapped cache past 2^31 elements ({exc})"
    return None if free >= 1 << 30 else f"has {free >> 20} MiB of RAM available; a lazily mapped cache past 2^31 elements needs >= 1 GiB"


def _multi_layer(ctx, _):
    if "L" not in ctx.layout.k_dims:
        return f"declares layout {ctx.layout.alias}, which has no layer dimension"
    if max(ctx.backend.capabilities.num_layers) < 3:
        return f"declares num_layers={ctx.backend.capabilities.num_layers} (a multi-layer case needs 3)"
    return None


def _padding_slots(ctx, _):
    if ctx.backend.capabilities.padding_slots:
        return None
    return "declares no padding slot (-1): its writer appends every row it is given"


def _latent_padding_slots(ctx, _):
    return None if ctx.backend.capabilities.latent.padding_slots else "declares no padding slot (-1) for its latent writers"


def _latent_multi_layer(ctx, _):
    layers = ctx.backend.capabilities.latent.num_layers
    return None if max(layers) >= 2 else f"declares latent num_layers={layers} (a multi-layer case needs 2 or more)"


def _connector_ops(ctx, _):
    # The descriptor and the interop row fall back on kvconform's defaults for what a backend
    # does not drive; with no connector op of its own they would judge those defaults.
    if set(ctx.backend.capabilities.ops) & CONNECTOR_OPS:
        return None
    return f"declares no connector op ({', '.join(sorted(CONNECTOR_OPS))}): it ships no blocks of its own"


def _two_devices(ctx, _):
    why = placement.refusal(ctx.devices)
    return (f"{why}; give --kvc-devices cpu,cpu for the CPU stand-in, cuda:0,cuda:0 for two processes on one GPU (through host memory), "
            "or two GPUs (--kvc-devices cuda:0,cuda:1)") if why else None


def _this_run(_ctx) -> str:
    return "this run"


def _this_machine(_ctx) -> str:
    return "this machine"


@dataclasses.dataclass(frozen=True)
class Need:
    """One row of :data:`NEEDS`: ``check(ctx, argument)`` says what is missing, or None; it may
    answer (who, what) when someone other than ``who(ctx)`` lacks it. ``feature``: a check names
    it with ``kvc_needs(NAME)`` (False: another marker states it, or it is only asked ``first`` by
    a feature). ``first``: needs asked before this one, in table order like every need."""

    kind: str
    who: Callable[[Context], str]
    check: Callable[[Context, Any], str | tuple[str, str] | None]
    feature: bool = True
    first: tuple[str, ...] = ()


# Every need, evaluated in this order: the first unmet one is the reason. A new need is one row here.
NEEDS = {
    "op": Need(DECLARATION, _backend, _op, feature=False),  # kvc_op(NAME)
    "declared_standard": Need(DECLARATION, _backend, _declared_standard, feature=False),  # kvc_layouts(KIND)
    "golden_case": Need(DECLARATION, _backend, _golden_case, feature=False),  # a golden_case parameter
    "fp8": Need(DECLARATION, _backend, _fp8),
    "single_kv_head": Need(DECLARATION, _backend, _single_kv_head),
    "selector": Need(DECLARATION, _backend, _selector),
    "multi_layer": Need(DECLARATION, _backend, _multi_layer),
    "connector_ops": Need(DECLARATION, _backend, _connector_ops),
    "padding_slots": Need(DECLARATION, _backend, _padding_slots),
    "latent_padding_slots": Need(DECLARATION, _backend, _latent_padding_slots),
    "latent_multi_layer": Need(DECLARATION, _backend, _latent_multi_layer),
    "declares_e1": Need(DECLARATION, _backend, lambda ctx, _: _declares_standard(ctx, "e1"), feature=False),
    "declares_e3": Need(DECLARATION, _backend, lambda ctx, _: _declares_standard(ctx, "e3"), feature=False),
    "cpu_platform": Need(DECLARATION, _backend, _cpu_platform, feature=False),
    "run_standard": Need(RUN, _this_run, _run_standard, feature=False),  # kvc_layouts(KIND)
    # A feature that is several needs asks the backend's declaration first, so a check that cannot
    # apply to what it declares is not applicable by declaration whatever the run or machine.
    "standard_e1": Need(RUN, _this_run, lambda ctx, _: _standard_specific(ctx, "e1"), first=("declares_e1",)),
    "standard_e3": Need(RUN, _this_run, lambda ctx, _: _standard_specific(ctx, "e3"), first=("declares_e3",)),
    "compare_digests": Need(RUN, _this_run, _compare_digests),
    "two_devices": Need(RUN, _this_run, _two_devices),
    "gpu": Need(MACHINE, _this_machine, _gpu, first=("cpu_platform",)),
    "memory_2_31": Need(MACHINE, _this_machine, _memory_2_31),
}
FEATURES = tuple(name for name, need in NEEDS.items() if need.feature)  # what kvc_needs(...) may name


def needs_of(item, golden_case=None) -> list[tuple[str, object]]:
    """The (need, argument) pairs a check states through its markers, in table order."""
    op, layouts = item.get_closest_marker("kvc_op"), item.get_closest_marker("kvc_layouts")
    wanted = [("op", op.args[0])] if op else []
    kind = layouts.args[0] if layouts else "all"
    wanted += [("declared_standard", kind), ("run_standard", kind)]
    if golden_case is not None:
        wanted.append(("golden_case", golden_case))
    for feature in (m.args[0] for m in item.iter_markers("kvc_needs")):
        row = NEEDS.get(feature)
        if row is None or not row.feature:
            raise ValueError(f"kvc_needs: unknown feature {feature!r}; expected one of {FEATURES}")
        wanted += [(need, None) for need in (*row.first, feature)]
    order = list(NEEDS)
    return sorted(wanted, key=lambda pair: order.index(pair[0]))


def not_applicable(ctx: Context, needs: list[tuple[str, object]]) -> NotApplicable | None:
    """The first unmet need, or None when the check applies."""
    for need, argument in needs:
        row = NEEDS[need]
        what = row.check(ctx, argument)
        if isinstance(what, tuple):
            return NotApplicable(row.kind, *what)
        if what:
            return NotApplicable(row.kind, row.who(ctx), what)
    return None


@dataclasses.dataclass(frozen=True)
class CaseParam:
    """One (backend, layout) case of a check; ``reason`` when it cannot run, ``layout`` None
    for a backend that did not load (or a check that takes no layout)."""

    loaded: object  # registry.Loaded
    layout: R.Layout | None
    reason: NotApplicable | None = None

    @property
    def id(self) -> str:
        if self.layout is None:
            return self.loaded.name if self.reason is None or self.loaded.backend is None else f"{self.loaded.name}-n/a"
        return f"{self.loaded.name}-{self.layout.era}:{self.layout.alias}"


def case_params(loaded, kind: str, standard: str) -> list[CaseParam]:
    """The cases of a check asking for layouts of ``kind`` (``kvc_layouts``) on one backend."""
    backend = loaded.backend
    if backend is None:
        return [CaseParam(loaded, None, unavailable_backend(loaded.name, loaded.unavailable, loaded.out_of_scope) if loaded.unavailable else None)]
    layouts = backend.capabilities.layouts
    if kind == "latent":  # the latent checks sweep the declared record formats instead (sweeps.py)
        if backend.capabilities.latent is None:
            return [CaseParam(loaded, None, by_declaration(backend, "declares no latent cache (MLA, fp8_ds_mla, indexer)"))]
        return [CaseParam(loaded, None)]
    if kind == "quant":  # the per-token-head checks parametrize their modes and orders themselves (harness/quant.py)
        if backend.capabilities.quant is None:
            return [CaseParam(loaded, None, by_declaration(backend, "declares no per-token-head quantised cache"))]
        return [CaseParam(loaded, None)]
    if not layouts:  # a latent-only backend: no K/V check applies to it
        return [CaseParam(loaded, None, by_declaration(backend, "declares no K/V layout (latent caches only)"))]
    if kind == "none":
        return [CaseParam(loaded, None)]
    if kind == "connector":  # E1: every layout is the standard; E3: those a connector runs with
        chosen = list(layouts) if standard == "e1" else [lay for lay in backend.connector_layouts() if backend.supports_kv_connector()]
    elif kind == "tiled":
        chosen = [lay for lay in layouts if lay.is_tiled]
    elif kind in ("all", "standard"):
        chosen = list(layouts)
    else:
        raise ValueError(f"kvc_layouts: unknown kind {kind!r}; expected one of {LAYOUT_KINDS}")
    return [CaseParam(loaded, layout) for layout in chosen] or [CaseParam(loaded, None, by_declaration(backend, f"declares no {kind} layout"))]


def reason_of(exc: BaseException, backend_name: str, case=None) -> NotApplicable | None:
    """Why a test that raised ``exc`` does not apply here, or None when ``exc`` is a finding."""
    if isinstance(exc, Unsatisfiable) and case is not None and case.facts.examples_not_applicable:
        # Hypothesis gave up: every example it drew was rejected as unavailable here (examples.py).
        exc = OpUnavailable("no generated example could run here: " + "; ".join(sorted(case.facts.examples_not_applicable)),
                            who=common_who(case.unavailable.reasons.values()))
    if isinstance(exc, NotApplicableHere):
        return exc.reason
    if isinstance(exc, OpUnavailable):  # the backend's real code path cannot run here (a compiled op absent …)
        return NotApplicable(MACHINE, exc.who or "this machine", f"cannot run this code path of backend {backend_name}: {exc}")
    return None


def unavailable_backend(name: str, why: str, out_of_scope: bool = False) -> NotApplicable:
    """The backend's library is absent here (vLLM not installed): nothing of it can run. Or the
    backend keeps no cache kvconform specifies (``out_of_scope``): a fact of the backend."""
    if out_of_scope:
        return NotApplicable(DECLARATION, f"backend {name}", why)
    return NotApplicable(MACHINE, "this machine", f"cannot load backend {name}: {why}")


# ----------------------------------------------------------------------------- found out while running
def by_declaration(backend: Backend, what: str) -> NotApplicable:
    """``backend`` declares nothing a check could run with: it lacks ``what``."""
    return NotApplicable(DECLARATION, f"backend {backend.name}", what)


def undeclared(backend: Backend, what: str) -> NotApplicableHere:
    """For a check to raise when it finds out only while running (from its own parameters, a
    sweep value) that what ``backend`` declares cannot hold the case it needs."""
    return NotApplicableHere(by_declaration(backend, what))


def no_digest_for(digests_path: str, layout: str, golden_case: str) -> NotApplicableHere:
    """For the cross-machine check to raise when the ``--kvc-compare-digests`` file holds no
    digest of this layout and golden case: a fact of this run's input, not of the backend."""
    return NotApplicableHere(NotApplicable(RUN, f"--kvc-compare-digests {digests_path}", f"has no {layout} digest for {golden_case}"))


def common_who(reasons: Iterable[OpUnavailable]) -> str | None:
    """The one ``who`` these reasons name, or None when they name several."""
    who = {exc.who for exc in reasons}
    return who.pop() if len(who) == 1 else None


def unavailable_again(known: OpUnavailable) -> OpUnavailable:
    """A spec found unavailable before, raised afresh for a later example that draws it again."""
    return OpUnavailable(str(known), who=known.who)


def unavailable_for_every_candidate(reasons: list[OpUnavailable]) -> OpUnavailable:
    """The whole test cannot run here: each spec it can draw raised one of ``reasons``."""
    return OpUnavailable(f"every case the test can draw ({len(reasons)}): " + "; ".join(sorted({str(r) for r in reasons})),
                         who=common_who(reasons))


def unavailable_at_every_block_size(sizes: Iterable[int], last: OpUnavailable) -> OpUnavailable:
    """A fixed check run at each of ``sizes`` (examples.run_at_path_block_sizes) ran at none."""
    return OpUnavailable(f"at every block size {list(sizes)}: {last}", who=last.who)
