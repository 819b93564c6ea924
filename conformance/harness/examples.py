"""Per-example applicability: one case a backend cannot run here does not hide the others.

A backend's real code path can be unavailable for *some* cases only — vLLM's ROCM_ATTN writes
block sizes 16 and 32 through a compiled op this build may lack, every other size through
Triton. So:

- a generated (Hypothesis) example whose op raises ``OpUnavailable`` is rejected alone and the
  reason counted in the test's facts (``examples_not_applicable``); its spec is remembered (unless
  only that example's arguments cannot run: ``OpUnavailable.this_input``), so a later example
  drawing it again is rejected as soon as it allocates (after all its draws:
  data generation never depends on what was found, which Hypothesis requires); the test is not
  applicable only when every spec it can draw turned out unavailable (or Hypothesis found no
  runnable example: applicability.reason_of);
- a fixed check runs at each block size where the backend's code paths differ
  (``Backend.path_block_sizes``); a size whose path is unavailable is skipped and counted, the
  test is not applicable only when all are.
"""

from __future__ import annotations

import dataclasses
import functools

from hypothesis import reject

from kvconform.backends_under_test.contract import OpUnavailable

from .applicability import unavailable_at_every_block_size
from .assertions import a_finding

__tracebackhide__ = a_finding  # a failure shows from the check's line (assertions.a_finding)


def unavailable_text(exc: OpUnavailable) -> str:
    return f"{exc.who or 'this machine'}: {exc}"


def skipping_unavailable_examples(inner_test, candidates: set[tuple]):
    """Wrap a Hypothesis test's ``inner_test`` (Hypothesis' documented hook for plugins): an
    example whose spec cannot run here is rejected, neither failed nor passed. ``candidates``:
    the spec keys the test can draw."""
    if getattr(inner_test, "_kvc_per_example", False):
        return inner_test

    @functools.wraps(inner_test)
    def run(*args, **kwargs):
        case = kwargs["case"]
        specs = case.unavailable
        specs.current = None
        try:
            return inner_test(*args, **kwargs)
        except OpUnavailable as exc:
            if specs.current is None:  # not tied to a drawn spec: the whole test cannot run here
                raise
            if not exc.this_input:  # the spec itself cannot run here: later examples drawing it stop at once
                specs.reasons.setdefault(specs.current, exc)
            case.facts.count_unavailable(unavailable_text(exc))
            whole = specs.every_candidate(candidates)
            if whole is not None:
                raise whole from exc
            reject()

    run._kvc_per_example = True
    return run


def run_at_path_block_sizes(check, case, sizes: tuple[int, ...]) -> None:
    """Run a fixed check once per block size (a copy of ``case`` with that ``block_size``);
    unavailable sizes are skipped and counted, a failure at any size fails the check."""
    ran, last = [], None
    for size in sizes:
        try:
            check(dataclasses.replace(case, block_size=size))
        except OpUnavailable as exc:
            case.facts.count_unavailable(unavailable_text(exc))
            last = exc
            continue
        ran.append(size)
    case.facts.block_sizes = ran
    if not ran:
        raise unavailable_at_every_block_size(sizes, last)
