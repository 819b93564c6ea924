"""The installed modules a suite run imports, for the own tests' fork server and forked runs.

A process that imports these once and forks each suite run from itself saves every run the CPU
of importing torch and the rest (tests/fork_server.py, tests/forked_runs.py). What to import is
found by a probe: a child forked from a process that has imported nothing of the checkout runs a
collection of the suite and lists what it imported: installed modules only (nothing of the
checkout), none under a ``fresh`` prefix, no pytest plugin. ``python tests/suite_imports.py
PROBE_ARGS_JSON FRESH_JSON`` prints that list (a script, not ``-m tests.…``, so that nothing of the
checkout is imported before the probe).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import warnings
from importlib import metadata
from pathlib import Path

MAIN = {"__main__", "__mp_main__"}


def installed(module) -> bool:
    """Not a file outside the interpreter's installation (the checkout, a cwd): built-in modules
    and the module objects packages make up (``torch.ops``, whose ``__file__`` is a bare name)
    count as installed."""
    file = getattr(module, "__file__", None)
    if not isinstance(file, str) or not os.path.isabs(file):
        return True
    roots = {os.path.realpath(p) + os.sep for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    return os.path.realpath(file).startswith(tuple(roots))


def imported_by_a_suite_run(probe: list[str], fresh: list[str], scratch: Path) -> list[str]:
    """The installed modules (none under a ``fresh`` prefix, no pytest plugin) that a suite run with
    the ``probe`` pytest arguments imports, found by running it in a forked child."""
    # pytest plugins are left for pytest to import (and assertion-rewrite), unless a module
    # imported before the run imports one itself (openai imports anyio): then the run has it already.
    skipped = (*fresh, *pytest_plugin_modules())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.dup2(devnull, 2)
            import pytest

            pytest.main(["--pyargs", "kvconform.conformance", "-p", "no:cacheprovider", *probe,
                         "--kvc-json", str(scratch / "probe" / "results.json")])
            names = [name for name, module in list(sys.modules.items())
                     if module is not None and installed(module) and not name.startswith(skipped) and name not in MAIN]
            os.write(write, json.dumps(names).encode())
        except BaseException:  # noqa: BLE001 - the caller then imports nothing
            code = 1
        finally:
            os.close(write)
            os._exit(code)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 20):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(data or b"[]")


def warm_up(probe: list[str], fresh: list[str], scratch: Path) -> int:
    """Import here what :func:`imported_by_a_suite_run` lists; returns how many."""
    names = imported_by_a_suite_run(probe, fresh, scratch)
    before = set(sys.modules)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            if name not in sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:  # noqa: BLE001 - a module that only imports in context: its run imports it
                    pass
    leaked = [name for name in set(sys.modules) - before - MAIN
              if name.startswith(tuple(fresh)) or (sys.modules[name] is not None and not installed(sys.modules[name]))]
    if leaked:
        raise RuntimeError(f"suite_imports: warming up imported {sorted(leaked)[:5]}, which each run must import anew")
    return len(names)


def pytest_plugin_modules() -> list[str]:
    """The top-level modules of every distribution that plugs into pytest: pytest rewrites their
    assertions as it loads them, so a run must import them itself."""
    names = set()
    for entry in metadata.entry_points(group="pytest11"):
        names.add(entry.value.split(".")[0].split(":")[0])
        for file in (entry.dist.files or []) if entry.dist else []:
            top = file.parts[0]
            if not top.endswith((".dist-info", ".egg-info", ".pth")) and top not in ("..", "__pycache__"):
                names.add(top.removesuffix(".py"))
    return sorted(names)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory(prefix="kvc-suite-imports-") as scratch:
        print(json.dumps(imported_by_a_suite_run(json.loads(sys.argv[1]), json.loads(sys.argv[2]), Path(scratch))))
