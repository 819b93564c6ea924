#!/usr/bin/env bash
# Build a venv with a REAL vLLM release (default 0.33.0) on a CPU-only machine (CI, ~1.5 min): CPU
# torch, Triton for the interpreter, vLLM without its CUDA dependency tree, its light CPU deps,
# FlashInfer's Python package (for the FLASHINFER class), and kvconform itself.
#   tests/vllm_cpu/make_venv.sh VENV [VERSION]
# requirements-cpu.txt holds 0.33.0's light deps; releases/VERSION.txt, where a release's own
# requirements differ, replaces the lines of the packages it names (read from that release's
# METADATA) and pins its FlashInfer.
set -euo pipefail
venv="${1:?usage: make_venv.sh VENV [VERSION]}"
version="${2:-0.33.0}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
pins="$here/releases/$version.txt"
requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
flashinfer="flashinfer-python==0.7.2.post1"
if [[ -f "$pins" ]]; then
  # A package's name is what precedes its first version operator, extra or marker.
  names="$(grep -v '^#' "$pins" | sed -E 's/[ <>=!~;[].*//' | tr 'A-Z_' 'a-z-' | grep . || true)"
  while IFS= read -r line; do
    name="$(sed -E 's/[ <>=!~;[].*//' <<<"$line" | tr 'A-Z_' 'a-z-')"
    grep -qxF -- "$name" <<<"$names" || printf '%s\n' "$line"
  done < "$here/requirements-cpu.txt" > "$requirements"
  grep -v '^#' "$pins" | grep -v '^flashinfer-python' >> "$requirements" || true
  flashinfer="$(grep '^flashinfer-python' "$pins" || echo "$flashinfer")"
elif [[ "$version" != 0.33.0 ]]; then
  echo "make_venv.sh: no $pins: using 0.33.0's light deps for vLLM $version" >&2
  cp "$here/requirements-cpu.txt" "$requirements"
else
  cp "$here/requirements-cpu.txt" "$requirements"
fi
python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" torch==2.13.0 triton==3.9.0 numpy
"${pip[@]}" --no-deps "vllm==$version"        # never with deps: they pull CUDA torch and ~6 GB
"${pip[@]}" -r "$requirements"
"${pip[@]}" --no-deps "$flashinfer"
"${pip[@]}" -e "$root"
