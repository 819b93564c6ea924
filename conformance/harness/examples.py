"""Per-example applicability: one case a backend cannot run here does not hide the others.

A backend's real code path can be unavailable for *some* cases only — vLLM's ROCM_ATTN writes
block sizes 16 and 32 through a compiled op this build may lack, every other size through
Triton. So:

- a generated (Hypothesis) example whose op raises ``OpUnavailable`` is rejected alone and the
  reason counted in the record (``examples_not_applicable``); its spec is remembered, so a later
  example drawing it again is rejected as soon as it allocates (after all its draws: data
  generation never depends on what was found, which Hypothesis requires); the test is not
  applicable only when every spec it can draw turned out unavailable;
- a fixed check runs at each block size where the backend's code paths differ
  (``Backend.path_block_sizes``); a size whose path is unavailable is skipped and counted, the
  test is not applicable only when all are.
"""

from __future__ import annotations

import functools

from hypothesis import reject

from kvconform.backends_under_test.contract import OpUnavailable

RECORD_KEY = "examples_not_applicable"


def spec_key(layout, model_dtype, kv_cache_dtype, geometry) -> tuple:
    """What decides the backend's code path for one example (not the block count or data)."""
    g = geometry
    return (str(layout), str(model_dtype), kv_cache_dtype, g.block_size, g.num_kv_heads, g.head_size, str(g.dtype))


def key_of(spec) -> tuple:
    return spec_key(spec.layout, spec.model_dtype, spec.kv_cache_dtype, spec.geometry)


def common_who(reasons) -> str | None:
    """The one ``who`` these reasons name, or None when they name several."""
    who = {exc.who for exc in reasons}
    return who.pop() if len(who) == 1 else None


class Skipped:
    """The cases of one test that could not run here: their specs and why, counted."""

    def __init__(self, record):
        self._record = record
        self.reasons: dict[tuple, OpUnavailable] = {}  # spec key -> why it cannot run here
        self.candidates: set[tuple] = set()  # every spec key the test's strategy can draw
        self.counts: dict[str, int] = {}  # a plain dict: xdist ships records between processes

    def count(self, exc: OpUnavailable) -> None:
        if not self.counts:
            self._record(RECORD_KEY, self.counts)  # the same dict: later counts reach the record
        reason = f"{exc.who or 'this machine'}: {exc}"
        self.counts[reason] = self.counts.get(reason, 0) + 1

    def raise_if_known(self, spec) -> None:
        known = self.reasons.get(key_of(spec))
        if known is not None:
            raise OpUnavailable(str(known), who=known.who)

    def whole_test(self) -> OpUnavailable | None:
        """One ``OpUnavailable`` for the test once every spec it can draw is known unavailable."""
        if not self.candidates or not self.candidates <= set(self.reasons):
            return None
        reasons = sorted({str(self.reasons[k]) for k in self.candidates})
        return OpUnavailable(f"every case the test can draw ({len(self.candidates)}): " + "; ".join(reasons),
                             who=common_who(self.reasons[k] for k in self.candidates))


def skipping_unavailable_examples(inner_test):
    """Wrap a Hypothesis test's ``inner_test`` (Hypothesis' documented hook for plugins):
    an example whose spec cannot run here is rejected, neither failed nor passed."""
    if getattr(inner_test, "_kvc_per_example", False):
        return inner_test

    @functools.wraps(inner_test)
    def run(*args, **kwargs):
        case = kwargs["case"]
        case.drawn = None
        try:
            return inner_test(*args, **kwargs)
        except OpUnavailable as exc:
            if case.drawn is None:  # not tied to a drawn spec: the whole test cannot run here
                raise
            case.skipped.reasons.setdefault(case.drawn, exc)
            case.skipped.count(exc)
            whole = case.skipped.whole_test()
            if whole is not None:
                raise whole from exc
            reject()

    run._kvc_per_example = True
    return run


def run_at_path_block_sizes(call, case, sizes: tuple[int, ...]) -> None:
    """Run a fixed check once per block size (``case.block_size``); unavailable sizes are
    skipped and counted, a failure at any size fails the check."""
    ran, last = [], None
    for size in sizes:
        case.block_size = size
        try:
            call()
        except OpUnavailable as exc:
            case.skipped.count(exc)
            last = exc
            continue
        ran.append(size)
    case.block_size = None
    case.record("block_sizes", ran)
    if not ran:
        raise OpUnavailable(f"at every block size {list(sizes)}: {last}", who=last.who)


def call_check(item) -> bool | None:
    """``pytest_pyfunc_call`` for a suite check: Hypothesis checks get the per-example wrapper
    (pytest then calls them as usual: None); a fixed check of an op whose paths differ by block
    size runs at each of them (True: called here)."""
    function = item.obj
    handle = getattr(function, "hypothesis", None)
    if handle is not None:
        handle.inner_test = skipping_unavailable_examples(handle.inner_test)
        return None
    case = item.funcargs["case"]
    marker = item.get_closest_marker("kvc_op")
    size_class = item.funcargs.get("size_class")
    if marker is None or case.layout is None or "golden_case" in item.funcargs or (size_class and size_class.field == "block_size"):
        return None  # golden cases and block-size classes write at their own block size
    sizes = case.backend.path_block_sizes(marker.args[0], case.layout)
    if len(sizes) < 2:
        return None
    args = {name: item.funcargs[name] for name in item._fixtureinfo.argnames}
    run_at_path_block_sizes(lambda: function(**args), case, sizes)
    return True


def unsatisfiable_reason(case) -> OpUnavailable | None:
    """Hypothesis found no runnable example and gave up: the reasons its rejected ones had."""
    if not case.skipped.counts:
        return None
    return OpUnavailable("no generated example could run here: " + "; ".join(sorted(case.skipped.counts)),
                         who=common_who(case.skipped.reasons.values()))
