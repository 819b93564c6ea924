"""Extract vLLM 0.33.0's paged KV-cache kernels from its sdist: ``csrc/cache_kernels.cu``, ``csrc/ops.h``
and every header they include (quoted ``#include``s, followed recursively, conditional ones too), nothing else.

    python tests/real_kernels_gpu/vllm_sources.py vllm-0.33.0.tar.gz OUT_DIR     # writes OUT_DIR/csrc

The sdist is the registry's (files.pythonhosted.org/.../vllm-0.33.0.tar.gz, sha256 below). ``pip
download --no-deps --no-binary :all: vllm==0.33.0`` prepares its metadata, which needs vLLM's
build requirements; what worked here: ``PYTHONPATH=DIR VLLM_TARGET_DEVICE=empty pip download
--no-deps --no-build-isolation URL`` with ``pip install --target DIR setuptools-rust
setuptools-scm`` (the version check of ``vllm==0.33.0`` rejects the ``0.33.0+empty`` metadata,
so the URL is given). build_cache_ops.py compiles the result.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import sys
import tarfile
from pathlib import Path

SDIST_SHA256 = "f4c33c2503d52bb411146afa9618a4f48bed68912f617e6803ac8d76e4c74112"
ROOT = "vllm-0.33.0/csrc/"
ENTRIES = ("cache_kernels.cu", "ops.h")  # the kernels, and the declarations cache_ops_bindings.cpp registers
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def closure(members: dict[str, bytes]) -> list[str]:
    """``ENTRIES`` and the csrc files its quoted includes reach (relative to the including file's
    directory, else to csrc/, as vLLM's CMake puts csrc/ on the include path)."""
    found, todo = set(), list(ENTRIES)
    while todo:
        path = todo.pop()
        if path in found:
            continue
        found.add(path)
        here = posixpath.dirname(path)
        for name in INCLUDE.findall(members[path].decode(errors="replace")):
            for candidate in (posixpath.normpath(posixpath.join(here, name)), posixpath.normpath(name)):
                if candidate in members:
                    todo.append(candidate)
                    break
    return sorted(found)


def main(sdist: Path, out: Path) -> None:
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        raise SystemExit(f"vllm_sources: {sdist} has sha256 {digest}, not vLLM 0.33.0's sdist ({SDIST_SHA256})")
    with tarfile.open(sdist) as tar:
        members = {m.name[len(ROOT):]: tar.extractfile(m).read() for m in tar.getmembers() if m.name.startswith(ROOT) and m.isfile()}
    for path in closure(members):
        target = out / "csrc" / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(members[path])
        print(path)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
