#!/usr/bin/env bash
# Build a venv with the REAL vLLM 0.33.0 on a CPU-only machine (CI, ~1.5 min): CPU torch,
# Triton for the interpreter, vLLM without its CUDA dependency tree, its light CPU deps,
# FlashInfer's Python package (for the FLASHINFER class), and kvconform itself.
#   tests/vllm_cpu/make_venv.sh VENV
set -euo pipefail
venv="${1:?usage: make_venv.sh VENV}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0 triton==3.9.0 numpy
"${pip[@]}" --no-deps vllm==0.33.0        # never with deps: they pull CUDA torch and ~6 GB
"${pip[@]}" -r "$here/requirements-cpu.txt"
"${pip[@]}" --no-deps flashinfer-python==0.7.2.post1
"${pip[@]}" -e "$root"
