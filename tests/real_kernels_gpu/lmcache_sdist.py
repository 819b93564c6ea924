"""LMCache 0.5.6's sdist, the one the LMCache runs were measured on: fetched by URL, sha256 checked.

One place for the pin, used by tests/test_lmcache_adapter.py (the CPU runs) and by prepare.sh (the
GPU recipe), so the recipe cannot drift from what CI fetches (#38 item 11):

    python -m tests.real_kernels_gpu.lmcache_sdist DIR     # prints DIR/lmcache-0.5.6.tar.gz

By URL: the sdist's metadata says version 0.0.0 (derived from git, absent in an sdist), so
``pip download lmcache==0.5.6 --no-binary :all:`` discards the very file it found.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

SHA256 = "d6951e60ce8818a76aa42d0866a4ba85f1c95cd919355fff30ff24dcc3243f1e"
URL = ("https://files.pythonhosted.org/packages/84/25/3ccd46844c94e08897aa8d72716a538c07e4583410d84dbc6cd12cb60dc1/"
       "lmcache-0.5.6.tar.gz")
NAME = "lmcache-0.5.6.tar.gz"


class FetchError(RuntimeError):
    """The registry did not give the file (no network, no registry)."""


class WrongFile(RuntimeError):
    """The file is not the pinned one."""


def fetch(into: Path) -> Path:
    """``into/lmcache-0.5.6.tar.gz``, downloaded with pip unless already there; its sha256 checked."""
    into.mkdir(parents=True, exist_ok=True)
    sdist = into / NAME
    if not sdist.exists():
        # NO_CUDA_EXT=1: pip prepares the sdist's metadata, which needs no CUDA torch then.
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                               "--no-build-isolation", "-d", str(into), URL],
                              capture_output=True, text=True, timeout=600, env={**os.environ, "NO_CUDA_EXT": "1"})
        if proc.returncode != 0 or not sdist.exists():
            raise FetchError(f"`pip download {URL}` failed: {proc.stderr.strip()[-400:]}")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        raise WrongFile(f"{sdist}: sha256 {digest}, not {SHA256}: not the sdist docs/REAL_KERNELS.md was measured on")
    return sdist


if __name__ == "__main__":
    try:
        print(fetch(Path(sys.argv[1])))
    except (FetchError, WrongFile) as exc:
        sys.exit(f"lmcache_sdist: {exc}")
