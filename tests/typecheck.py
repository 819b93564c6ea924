"""mypy over the files pyproject.toml's [tool.mypy] lists, each under its wheel name
(``reference/layouts.py`` is ``kvconform.reference.layouts``), so that every ``kvconform.*``
import between the checkout's packages resolves to its real module and is type-checked.

A plain ``mypy`` cannot do this: it names a file after its directories (``reference.layouts``)
and no mypy setting maps ``kvconform.reference`` to ``reference/`` (the build's force-include
does, read here through tests/import_graph.py). mypy's build API takes each source's module name
as given: every module of the wheel is given, so what the checked files import from the harness or
the backends is typed too, and only the checked files' messages are kept. CI runs this (.ci/run)::

    .venv/bin/python -m tests.typecheck
"""

from __future__ import annotations

import sys
from pathlib import Path

from mypy import build
from mypy.errors import CompileError
from mypy.main import process_options
from mypy.modulefinder import BuildSource

from .import_graph import modules, package_dirs

ROOT = Path(__file__).resolve().parents[1]


def sources(files: list[str], root: Path = ROOT) -> tuple[list[BuildSource], list[Path]]:
    """Every module of the wheel as a BuildSource named by the wheel, and the files of ``files``
    (files or directories) among them: those are checked, the others read for their types (given
    as followed imports, which a plain mypy could not find)."""
    wanted = [(root / f).resolve() for f in files]
    named = {name: path.resolve() for name, path in modules(package_dirs(root)).items()}
    checked = [path for path in named.values() if any(path == w or w in path.parents for w in wanted)]
    if not checked:
        raise SystemExit(f"tests.typecheck: [tool.mypy] files {files} hold no module of the wheel")
    return [BuildSource(str(path), name, followed=path not in checked) for name, path in sorted(named.items())], checked


def check(root: Path = ROOT, cache_dir: str | None = None) -> tuple[list[str], int]:
    """mypy's messages on ``root``'s [tool.mypy] files, every module under its wheel name, and how many files it checked."""
    _, options = process_options(["--config-file", str(root / "pyproject.toml")])
    if cache_dir:
        options.cache_dir = cache_dir
    every, checked = sources(options.files or [], root)
    try:
        messages = build.build(sources=every, options=options).errors
    except CompileError as error:  # a blocking error (a syntax error, a module found twice)
        return [*error.messages, "error: mypy stopped"], len(checked)
    shown = {str(path) for path in checked}
    return [m for m in messages if m.split(":", 1)[0] in shown], len(checked)


def main() -> int:
    messages, checked = check()
    print(*(m.replace(f"{ROOT}/", "") for m in messages), sep="\n")
    errors = sum(": error:" in line or line.startswith("error:") for line in messages)
    print(f"Found {errors} errors (checked {checked} source files under their wheel names)" if errors
          else f"Success: no issues found in {checked} source files under their wheel names")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
