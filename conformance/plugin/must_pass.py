"""The must-pass list of this suite version: every check, ``conformance/<file>::<function>``.

A certified run needs, for every backend it certifies, a record of each (passed, or not
applicable by the backend's declaration); ``kvconform verify-submission`` holds a bundle to
the list of the kvconform version that checks it.
"""

from __future__ import annotations

import importlib

from .collection import SUITE, suite_dir


def must_pass() -> list[str]:
    checks = []
    for path in sorted(suite_dir().glob("test_*.py")):
        module = importlib.import_module(f"{SUITE}.{path.stem}")
        checks += [f"conformance/{path.name}::{name}" for name, obj in sorted(vars(module).items())
                   if name.startswith("test_") and callable(obj) and getattr(obj, "__module__", None) == module.__name__]
    return checks
