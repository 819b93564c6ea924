"""kvconform's source tree as a static reader sees it: module names from the build's one mapping,
and every ``kvconform.*`` import (absolute or relative, at module top or inside a function) with
its file and line, resolved to the module file it names.

The mapping is pyproject.toml's wheel build (``[tool.hatch.build.targets.wheel]``: ``packages``
and ``force-include``), the one that nests the checkout's top-level folders under ``kvconform``
in the wheel; ``kvconform/__init__.py`` gives a checkout the same names at run time. Nothing here
keeps a second copy of it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import tomllib
from collections.abc import Iterator
from pathlib import Path


def package_dirs(root: Path) -> dict[str, Path]:
    """Package name -> the directory that holds it, as the wheel maps them."""
    wheel = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    dirs = {package.replace("/", "."): root / package for package in wheel["packages"]}
    dirs.update({target.replace("/", "."): root / source for source, target in wheel.get("force-include", {}).items()})
    return dirs


def module_file(name: str, dirs: dict[str, Path]) -> Path | None:
    """The file a module name is, or None. The longest mapped prefix decides (kvconform.reference
    is reference/, not kvconform/reference/)."""
    prefix = max((p for p in dirs if name == p or name.startswith(p + ".")), key=len, default=None)
    if prefix is None:
        return None
    path = dirs[prefix].joinpath(*name[len(prefix) + 1:].split(".")) if name != prefix else dirs[prefix]
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def modules(dirs: dict[str, Path]) -> dict[str, Path]:
    """Every module of the mapped packages: name -> file."""
    found = {}
    for package, directory in dirs.items():
        for path in directory.rglob("*.py"):
            relative = path.relative_to(directory).with_suffix("").parts
            parts = relative[:-1] if relative[-1] == "__init__" else relative
            name = ".".join((package, *parts))
            if module_file(name, dirs) == path:  # a file of a nested mapped package is named by that package
                found[name] = path
    return found


@dataclasses.dataclass(frozen=True)
class Import:
    """One imported ``kvconform.*`` name: ``module`` (what the statement imports from) and, for
    ``from module import name``, the ``name``."""

    importer: str
    file: Path
    line: int
    module: str
    name: str | None = None

    def where(self, root: Path) -> str:
        return f"{self.file.relative_to(root)}:{self.line}"


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def statements(tree: ast.Module) -> Iterator[ast.AST]:
    """Every statement in source order, in blocks and function bodies too (an import is a
    statement: the expressions, most of a tree's nodes, are not walked)."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        yield node
        pending += reversed([child for field in ("body", "handlers", "orelse", "finalbody", "cases") for child in getattr(node, field, [])])


@functools.cache
def imports(module: str, path: Path) -> tuple[Import, ...]:
    """The ``kvconform.*`` imports of one module, relative ones made absolute."""
    return tuple(_imports(module, path))


def _imports(module: str, path: Path) -> Iterator[Import]:
    for node in statements(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvconform":
                    yield Import(module, path, node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                target = ".".join([*base[: len(base) - node.level + 1], *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] == "kvconform":
                for alias in node.names:
                    yield Import(module, path, node.lineno, target, alias.name)


@functools.cache
def top_level_names(path: Path) -> set[str] | None:
    """The names a module binds at its top level, or None when any name may exist (a module
    ``__getattr__`` or a star import)."""
    names: set[str] = set()
    pending: list[ast.AST] = list(parsed(path).body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            if node.name == "__getattr__":
                return None
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            if any(alias.name == "*" for alias in node.names):
                return None
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if not isinstance(node, ast.With) \
                else [item.optional_vars for item in node.items if item.optional_vars]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        for field in ("body", "orelse", "finalbody", "handlers"):  # if / try / for / with blocks bind at top level too
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                pending += getattr(node, field, [])
    return names


def unresolved(imported: Import, dirs: dict[str, Path]) -> str | None:
    """Why an import names nothing of the tree, or None when it resolves: its module must be a
    file, and ``from module import name`` must name a submodule or a name the module binds."""
    file = module_file(imported.module, dirs)
    if file is None:
        return f"{imported.module} is no module of the tree"
    if imported.name is None or module_file(f"{imported.module}.{imported.name}", dirs):
        return None
    names = top_level_names(file)
    if names is None or imported.name in names:
        return None
    return f"{imported.module} ({file.name}) has no {imported.name}"
