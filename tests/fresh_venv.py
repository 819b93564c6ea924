"""Fresh virtual environments for the tests that install kvconform's wheel as a vendor would
(tests/test_installed_plugin.py, tests/test_vendor_repository.py), in seconds: the heavy
dependencies (torch, triton, pytest …) are borrowed from the test's own environment instead of
installed again, and only kvconform and the vendor package really go into the new venv.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path


def sh(*cmd, cwd=None, env=None, timeout=900):
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def checked(proc):
    args = proc.args if isinstance(proc.args, str) else shlex.join(proc.args)
    assert proc.returncode == 0, f"{args} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def build_wheels(out: Path, *projects: Path) -> list[Path]:
    checked(sh(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, *projects))
    return sorted(out.glob("*.whl"))


# What the borrowed view of the test's environment leaves out: this checkout's own kvconform (an
# editable install pip would take as "already installed"), vendor packages, the packaging tools
# the venv has of its own, and .pth files.
NOT_BORROWED = ("kvconform", "_editable_impl_kvconform", "__editable__", "acme", "pip-", "setuptools", "_distutils_hack")


def fresh_venv(path: Path) -> Path:
    """A venv with its own pip whose other dependencies come from a view of this environment's
    site-packages (symlinks, without kvconform itself); returns its python."""
    venv.create(path, with_pip=True)
    python = path / "bin" / "python"
    borrowed = path / "borrowed-site-packages"
    borrowed.mkdir()
    ours = Path(sysconfig.get_paths()["purelib"])
    for entry in ours.iterdir():
        if not entry.name.startswith(NOT_BORROWED) and entry.name != "pip" and entry.suffix != ".pth":
            (borrowed / entry.name).symlink_to(entry)
    site = Path(checked(sh(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")).stdout.strip())
    (site / "zz_borrowed_dependencies.pth").write_text(f"{borrowed}\n")
    return python
