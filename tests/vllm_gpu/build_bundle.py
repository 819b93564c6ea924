"""Build the carry bundle that runs vLLM 0.33.0's Python and Triton code on a GPU machine with
no package registry (the device tool's H200): ``python tests/vllm_gpu/build_bundle.py OUT.tar.xz``.

The bundle is one ``site`` directory, packed with xz (≤ 40 MiB, what a device call can carry
beside the repository):

- vLLM 0.33.0's wheel without its compiled extensions (``*.so``: FA2/FA3, ``_C``, MoE … built
  against torch 2.14, 664 MB), the Rust router, the vendored fmha_sm100/deep_gemm trees and
  C/C++ sources — none of them on a KV-cache path (shared/vllm-gpu/README.md);
- cp312 manylinux wheels of the light dependencies (tests/vllm_cpu/requirements-cpu.txt and
  what they require) that the image lacks (image-packages.txt); torch, Triton and the
  ``nvidia-*`` CUDA wheels always come from the image.

Dependencies are resolved one package at a time (``pip download --no-deps`` + its
``Requires-Dist``), so the resolver never pulls a CUDA torch. Run from any machine with pip and
the registry; Python 3.11 is fine (wheels are fetched for 3.12).
"""

from __future__ import annotations

import argparse
import email.parser
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement

HERE = Path(__file__).resolve().parent
VLLM = "vllm==0.33.0"
LIMIT = 40 << 20
TARGET = dict(python_version="3.12", platforms=("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64", "manylinux_2_24_x86_64"))
# Environment markers are evaluated for the GPU machine, not this one.
MARKERS = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
           "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}
NEVER_CARRIED = re.compile(r"^(torch|triton|nvidia-.*)$")  # the image's own CUDA stack
# Unused by the KV-cache paths and large: removed from vLLM's tree (vllm-rs is the router binary).
STRIPPED = ("vllm/vllm-rs", "vllm/third_party/fmha_sm100", "vllm/third_party/deep_gemm")
STRIPPED_SUFFIXES = (".so", ".h", ".hpp", ".cuh", ".cu", ".cpp", ".cc", ".c")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages() -> set[str]:
    lines = (HERE / "image-packages.txt").read_text().splitlines()
    return {normalize(line) for line in lines if line.strip() and not line.startswith("#")}


def download(requirement: str, into: Path) -> Path:
    """One wheel for cp312 manylinux x86-64, without dependencies; returns its path."""
    before = set(into.iterdir())
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps", "--only-binary=:all:",
           "--python-version", TARGET["python_version"], "--implementation", "cp", "-d", str(into), requirement]
    for platform in TARGET["platforms"]:
        cmd[cmd.index("-d"):cmd.index("-d")] = ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"build_bundle: pip download {requirement} failed:\n{proc.stderr[-2000:]}")
    new = set(into.iterdir()) - before
    if not new:  # already downloaded earlier in this build
        name = normalize(Requirement(requirement).name)
        new = {p for p in into.iterdir() if normalize(p.name.split("-")[0]) == name}
    return next(iter(new))


def requires(wheel: Path) -> list[Requirement]:
    """The wheel's ``Requires-Dist`` that apply on the GPU machine (no extras)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        message = email.parser.Parser().parsestr(zf.read(meta).decode())
    wanted = []
    for line in message.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**MARKERS, "extra": ""}):
            wanted.append(req)
    return wanted


def dependency_wheels(into: Path) -> list[Path]:
    """The requirement file's packages and their dependencies that the image lacks."""
    have = image_packages()
    lines = (HERE.parent / "vllm_cpu" / "requirements-cpu.txt").read_text().splitlines()
    queue = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    seen, wheels = set(), []
    while queue:
        req = queue.pop(0)
        name = normalize(req.name)
        if name in seen or name in have or NEVER_CARRIED.match(name):
            continue
        seen.add(name)
        wheel = download(str(req), into)
        wheels.append(wheel)
        queue += requires(wheel)
    return wheels


def strip_vllm(site: Path) -> None:
    for rel in STRIPPED:
        path = site / rel
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    for path in (site / "vllm").rglob("*"):
        if path.is_file() and path.suffix in STRIPPED_SUFFIXES:
            path.unlink()


def build(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheels, site = tmp / "wheels", tmp / "site"
        wheels.mkdir()
        vllm = download(VLLM, wheels)
        deps = dependency_wheels(wheels)
        for wheel in (vllm, *deps):
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
        strip_vllm(site)
        for cache in site.rglob("__pycache__"):
            shutil.rmtree(cache, ignore_errors=True)
        partial = out.with_name(out.name + ".partial")
        with tarfile.open(partial, "w:xz", preset=9) as tar:
            tar.add(site, arcname="site")
        size = partial.stat().st_size
        if size > LIMIT:
            partial.unlink()
            raise SystemExit(f"build_bundle: {out.name} would be {size >> 20} MiB, over the {LIMIT >> 20} MiB a device call can carry")
        os.replace(partial, out)
        print(f"{out}: {size / 2**20:.1f} MiB; vLLM {vllm.name} stripped + {len(deps)} dependency wheels: "
              f"{', '.join(sorted(w.name.split('-')[0] for w in deps))}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the bundle to write (.tar.xz)")
    build(parser.parse_args(argv).out.resolve())


if __name__ == "__main__":
    main()
