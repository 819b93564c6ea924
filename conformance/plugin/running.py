"""How a suite check is called (``pytest_pyfunc_call``): Hypothesis checks get the per-example
wrapper, a fixed check of an op whose code paths differ by block size runs at each of them
(harness/examples.py)."""

from __future__ import annotations

import inspect

from ..harness.examples import run_at_path_block_sizes, skipping_unavailable_examples, spec_key
from ..harness.strategies import geometry_choices


def call_check(item) -> bool | None:
    """None: pytest calls the check as usual; True: called here."""
    function = item.obj
    case = item.funcargs["case"]
    handle = getattr(function, "hypothesis", None)
    if handle is not None:
        candidates = {spec_key(case.layout, *choice) for choice in geometry_choices(case)} if case.layout is not None else set()
        handle.inner_test = skipping_unavailable_examples(handle.inner_test, candidates)
        return None
    marker = item.get_closest_marker("kvc_op")
    size_class = item.funcargs.get("size_class")
    if marker is None or case.layout is None or "golden_case" in item.funcargs or (size_class and size_class.field == "block_size"):
        return None  # golden cases and block-size classes write at their own block size
    sizes = case.backend.path_block_sizes(marker.args[0], case.layout)
    if len(sizes) < 2:
        return None
    args = {name: item.funcargs[name] for name in inspect.signature(function).parameters}
    run_at_path_block_sizes(lambda sized: function(**{**args, "case": sized}), case, sizes)
    return True
