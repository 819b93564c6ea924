"""The canary: a fixed set of the reference's ops on tiny exact inputs, computed in the run's
process and in one that never imported a backend; certification requires both to give the
same bytes (docs/RELIABILITY.md "Oracle isolation and one verdict").

The in-process guard (``oracle_guard``) compares the oracle with a record the backend's process
holds; the canary does not trust that process: its clean side is a fresh Python
(``python -m kvconform.conformance.harness.canary BACKEND_MODULE…``) that refuses to answer if
any of the run's backend modules is imported there. A backend that patched the oracle *and* the
guard's record still computes other bytes in the run's process than in the clean one.

Inputs are small integers (exact in bf16) and a decode whose softmax is one-hot or an even
split (``exp`` of 0 or of less than -100 in float32 is exact on every machine), so a receiver's
clean process on another machine gives the same digests as the vendor's run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys

import torch

from kvconform import reference as R
from kvconform.reference import latent as RL
from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import oracle_guard

MODULE = "kvconform.conformance.harness.canary"
G = R.Geometry(num_blocks=4, block_size=4, num_kv_heads=2, head_size=8, dtype=torch.bfloat16)
LAYOUT = R.blocks_first("HND")  # stored head-major: a logical read reorders it
TOKENS = 12


def _bytes(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()


def _kv() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """key, value ``[T, H, D]`` of distinct small integers, and their slots (in every block, one left out)."""
    grid = torch.arange(TOKENS * G.num_kv_heads * G.head_size, dtype=torch.float32).reshape(TOKENS, G.num_kv_heads, G.head_size)
    key, value = (grid % 97 - 48).to(G.dtype), (grid % 89 - 44).to(G.dtype)
    slots = torch.tensor([13, 2, 7, 0, 15, 9, 4, 11, 1, 14, 6, -1])  # -1: a padding token the write skips
    return key, value, slots


def _written() -> torch.Tensor:
    key, value, slots = _kv()
    storage = torch.zeros(LAYOUT.nbytes(G), dtype=torch.uint8)
    R.reshape_and_cache(key, value, storage, LAYOUT, G, slots, k_scale=torch.ones(1), v_scale=torch.ones(1))
    return storage


def _write() -> bytes:
    return _bytes(_written())


def _copy() -> bytes:
    storage = _written()
    R.copy_blocks(storage, LAYOUT, G, torch.tensor([[0, 3], [2, 1]]))
    return _bytes(storage)


def _swap() -> bytes:
    host = torch.full((LAYOUT.nbytes(G),), 0x5A, dtype=torch.uint8)
    R.swap_out_blocks_to_host(_written(), host, LAYOUT, G, torch.tensor([3, 0]), torch.tensor([1, 2]))
    return _bytes(host)


def _read() -> bytes:
    return _bytes(R.read_logical(_written(), LAYOUT, G, blocks=torch.tensor([3, 1])))


def _decode() -> bytes:
    """Keys made so the softmax is exact: sequence 0 attends to its first token alone, sequence 1
    splits evenly between its first two; the scale (100) is what makes the others vanish."""
    storage = torch.zeros(LAYOUT.nbytes(G), dtype=torch.uint8)
    table = torch.tensor([[2, 0], [1, 3]])
    seq_lens = torch.tensor([6, 5])
    slots = torch.cat([table[s].repeat_interleave(G.block_size) * G.block_size + torch.arange(2 * G.block_size) % G.block_size
                       for s in range(2)]).reshape(2, -1)
    rank = torch.tensor([[0, 1, 2, 3, 4, 5], [0, 0, 1, 2, 3, 4]], dtype=torch.float32)  # per sequence: 0 = attended
    key = (-rank[..., None, None]).expand(-1, -1, G.num_kv_heads, G.head_size).to(G.dtype)
    value = torch.arange(2 * 6 * G.num_kv_heads * G.head_size, dtype=torch.float32).reshape(2, 6, G.num_kv_heads, G.head_size) % 31
    for s in range(2):
        R.reshape_and_cache(key[s, :seq_lens[s]], value[s, :seq_lens[s]].to(G.dtype), storage, LAYOUT, G, slots[s, :seq_lens[s]],
                            k_scale=torch.ones(1), v_scale=torch.ones(1))
    query = torch.ones(2, 2 * G.num_kv_heads, G.head_size, dtype=G.dtype)
    return _bytes(R.paged_decode_attention(query, storage, LAYOUT, G, table, seq_lens, scale=100.0))


def _latent_write() -> bytes:
    geom = RL.LatentGeometry(num_blocks=2, block_size=4, fmt=RL.LatentFormat(kind="mla", kv_lora_rank=32, rope_dim=8))
    grid = torch.arange(5 * 40, dtype=torch.float32).reshape(5, 40) % 53 - 26
    region = torch.zeros(geom.nbytes(), dtype=torch.uint8)
    RL.concat_and_cache_mla(grid[:, :32].to(torch.bfloat16), grid[:, 32:].to(torch.bfloat16), region, geom, torch.tensor([6, 0, -1, 3, 5]),
                            scale=torch.tensor([1.0]))
    return _bytes(region)


def _per_token_head_write() -> bytes:
    g = QL.QuantGeometry(num_blocks=2, block_size=4, num_kv_heads=2, head_size=8, mode="int8_per_token_head", order="HND")
    grid = torch.arange(3 * 2 * 8, dtype=torch.float32).reshape(3, 2, 8) % 19 - 9
    region = torch.zeros(g.nbytes(), dtype=torch.uint8)
    QC.initialise_scales(region, g)
    QC.write(grid.to(torch.bfloat16), (-grid).to(torch.bfloat16), region, g, torch.tensor([5, 0, 2]))
    return _bytes(region)


# what each canary calls, as the checks name it
CANARIES = {
    "reference.reshape_and_cache": _write,
    "reference.copy_blocks": _copy,
    "reference.swap_out_blocks_to_host": _swap,
    "reference.read_logical": _read,
    "reference.paged_decode_attention": _decode,
    "reference.latent.concat_and_cache_mla": _latent_write,
    "reference.quant_codecs.write": _per_token_head_write,
}
CODE = "the oracle's code"  # oracle_guard.code_digest: every function of the reference and the harness
PYTHON = "python"  # the interpreter's version: bytecode, hence CODE, differs between Python versions


def digests() -> dict[str, str]:
    """sha256 of each canary's output bytes (an op that raises: its exception), and of the oracle's code."""
    found = {}
    for name, compute in CANARIES.items():
        try:
            found[name] = hashlib.sha256(compute()).hexdigest()
        except Exception as exc:  # a changed oracle may raise: that is a difference too
            found[name] = f"raised {type(exc).__name__}: {exc}"
    found[CODE] = oracle_guard.code_digest()
    found[PYTHON] = "{}.{}".format(*sys.version_info[:2])
    return found


class CanaryError(RuntimeError):
    """The clean process could not compute the canary (it imported a backend, or failed)."""


def start_clean(backend_modules: list[str]) -> subprocess.Popen:
    """Start the clean side: a fresh Python that computes :func:`digests` and imports none of ``backend_modules``."""
    return subprocess.Popen([sys.executable, "-m", MODULE, *backend_modules], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def finish_clean(proc: subprocess.Popen, timeout: float = 600) -> dict[str, str]:
    """The clean side's digests, once its process has ended; :class:`CanaryError` if it failed."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise CanaryError(f"the clean canary process did not end within {timeout:.0f} s") from None
    if proc.returncode != 0:
        raise CanaryError(f"the clean canary process failed (exit {proc.returncode}): {(err or out).strip()[-800:]}")
    try:
        answer = json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError) as exc:
        raise CanaryError(f"the clean canary process answered no digests ({exc}): {out[-300:]!r}") from None
    here = os.path.dirname(os.path.abspath(R.__file__))
    if answer["reference"] != here:
        raise CanaryError(f"the clean canary process imported kvconform.reference from {answer['reference']}, this run from {here}")
    return answer["digests"]


@functools.cache  # the same in every call of a process (verify-submission checks several bundles)
def clean_digests(backend_modules: tuple[str, ...] = ()) -> dict[str, str]:
    """:func:`digests` as a process that never imported a backend computes them."""
    return finish_clean(start_clean(list(backend_modules)))


def differences(run: dict, clean: dict) -> list[str]:
    """What differs between the run's canary and the clean one, one sentence each."""
    found = []
    for name in sorted(set(run) | set(clean)):
        if run.get(name) != clean.get(name):
            what = f"{name} gives other bytes" if name != CODE else f"{name} (a digest of every function) is other"
            found.append(f"{what} in the run's process than in a clean one (run {str(run.get(name))[:80]}, clean {str(clean.get(name))[:80]}): "
                         "the oracle was changed after the backend loaded")
    return found


def bundle_problems(bundled: dict) -> list[str]:
    """A bundle's canary.json (a certified run's digests) against a clean process's here; the code
    digest is compared only when both ran the same Python version."""
    clean = clean_digests()
    left_out = {PYTHON} | ({CODE} if bundled.get(PYTHON) != clean.get(PYTHON) else set())
    return [f"{name} gave other bytes in the certified run's process ({str(bundled.get(name))[:80]}) than in a clean process here "
            f"({str(clean.get(name))[:80]}): the oracle of that run was not this kvconform's"
            for name in sorted((set(bundled) | set(clean)) - left_out) if bundled.get(name) != clean.get(name)]


def _backend_modules_imported(names: list[str]) -> list[str]:
    return sorted(n for n in names if n in sys.modules)


def main(backend_modules: list[str]) -> int:
    """The clean side: refuses to answer if a backend module is imported (before or after computing)."""
    imported = _backend_modules_imported(backend_modules)
    if not imported:
        found = digests()
        imported = _backend_modules_imported(backend_modules)
    if imported:
        print(f"kvconform canary: backend module(s) {', '.join(imported)} are imported in the clean process", file=sys.stderr)
        return 1
    print(json.dumps({"reference": os.path.dirname(os.path.abspath(R.__file__)), "digests": found}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
