"""vLLM 0.33.0's own code, read from its sdist at test time (no vLLM install): single functions
taken out of a file with ``ast`` and loaded as a module of their own, so a test runs vLLM's
kernel or torch reference beside kvconform's reference.

``KVCONFORM_VLLM_SDIST`` names a local copy of the sdist; otherwise it is fetched once per
session from the registry by its pinned URL (sha256 checked). When neither works the tests skip
saying why; ``KVCONFORM_REQUIRE_VLLM=1`` makes that a failure.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import tarfile
import urllib.request
from pathlib import Path

import pytest

SDIST_URL = ("https://files.pythonhosted.org/packages/f7/25/aa5684e9c59d6fc75f78926b7f15e8d9adc7de2d9e6e7575b80776ad8169/"
             "vllm-0.33.0.tar.gz")
SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
ROOT = "vllm-0.33.0/"


def unavailable(why: str):
    if os.environ.get("KVCONFORM_REQUIRE_VLLM") == "1":
        pytest.fail(why)
    pytest.skip(why)


def sdist(tmp_path_factory) -> Path:
    """The sdist: ``KVCONFORM_VLLM_SDIST``, or downloaded once a session (per xdist worker) into the
    session's base temporary directory, whichever test asks first; sha256 checked."""
    local = os.environ.get("KVCONFORM_VLLM_SDIST")
    cache_dir = tmp_path_factory.getbasetemp() / "vllm_sdist"
    cache_dir.mkdir(exist_ok=True)
    path = Path(local) if local else cache_dir / "vllm-0.33.0.tar.gz"
    if not path.exists():
        if local:
            unavailable(f"KVCONFORM_VLLM_SDIST={local} does not exist")
        try:
            urllib.request.urlretrieve(SDIST_URL, path)
        except OSError as exc:
            unavailable(f"cannot fetch vLLM 0.33.0's sdist ({SDIST_URL}): {exc}")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        unavailable(f"{path} has sha256 {digest}, not vLLM 0.33.0's sdist")
    return path


def read_sources(path: Path, names: tuple[str, ...]) -> dict[str, str]:
    """The text of each named file (relative to the sdist root), read in one pass over the archive
    (a member looked up by name rewinds the gzip stream: 13.7 s for three files, one pass ~4 s)."""
    wanted = {ROOT + name: name for name in names}
    found = {}
    with tarfile.open(path, "r|gz") as tar:
        for member in tar:
            if member.name in wanted:
                found[wanted[member.name]] = tar.extractfile(member).read().decode()
                if len(found) == len(wanted):
                    break
    if len(found) != len(wanted):
        unavailable(f"{path} lacks {sorted(set(names) - set(found))}")
    return {name: found[name] for name in names}


def definitions(source: str, *names: str) -> str:
    """The source of the named top-level functions/classes and class methods (``Class.method``,
    dedented to top level), decorators included, in the order asked."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for name in [getattr(node, "name", None)] + [getattr(t, "id", None) for t in targets]:
            found[name] = node
        for sub in getattr(node, "body", []) if isinstance(node, ast.ClassDef) else []:
            found[f"{node.name}.{getattr(sub, 'name', None)}"] = sub
    out = []
    for name in names:
        node = found[name]
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
        block = lines[start:node.end_lineno]
        indent = len(block[0]) - len(block[0].lstrip())
        out.append("\n".join(line[indent:] for line in block))
    return "\n\n\n".join(out) + "\n"


def load_module(directory: Path, name: str, text: str):
    """``text`` written to ``directory/name.py`` and imported (Triton's ``jit`` reads the file)."""
    path = directory / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
