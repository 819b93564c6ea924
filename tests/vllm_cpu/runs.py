"""The suite runs against the real vLLM on the CPU, forked from one set-up.

test_vllm_regressions.py needs one run per regression (each its own pytest session: vLLM is
edited as it is imported), test_vllm_adapter.py the gfx942 run of every K/V backend and a few
runs of one backend each, test_vllm_mla.py one run of some MLA members, test_vllm_quant.py one run of
TRITON_ATTN's per-token-head checks. Started one by one,
every run imported torch and vLLM's dependencies again (about half of its CPU time; the gfx942
run, under xdist, three times); here they are all forked from one process that imported those
once (tests/forked_runs.py). Each run is still the command line it was: its arguments, its
environment, a fresh vLLM, kvconform and tests package.

They start as collection ends (tests/background.py) and run one at a time, on one core, beside the
serial tests, which leave part of the two cores idle (waits on pip, the disk, Chromium); the
fixture that reads them waits for what is left.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .. import background
from ..suite_runs import ROOT, forked_runs_command, forked_runs_results
from .regressions import ENV, REGRESSIONS

PLUGIN = ("-p", "tests.vllm_cpu.plugin")
FRESH = ["vllm", "kvconform", "tests", "amdsmi", "aiter"]  # imported anew by every run
UNIFIED_SHUFFLE = "vllm:ROCM_AITER_UNIFIED_ATTN+shuffle"
GFX1250 = {"KVCONFORM_STANDIN_GFX": "gfx1250"}
SEGMENTED = "vllm:ROCM_SEGMENTED_ATTN"  # RDNA only (is_rdna(), rocm_segmented_attn.py)
SEGMENTED_SELECT = "padding or split_views or connector_configuration"
ROCM_GFX942 = ["ROCM_AITER_FA", "ROCM_AITER_FA+shuffle", "ROCM_AITER_UNIFIED_ATTN", "ROCM_ATTN", "TRITON_ATTN", "FLASH_ATTN", "FLASHINFER"]
GFX942 = "gfx942"
MLA = "mla"
# vLLM's MLA members that show each kind of verdict on a CPU: a torch writer that runs (CPU_MLA), Triton
# and compiled paths (TRITON_MLA), AMD's MLA members with their fp8_e5m2 finding, an NVIDIA sparse
# member with fp8_ds_mla and indexer formats (FLASHMLA_SPARSE), ROCm's sparse member and its Triton
# indexer writer (ROCM_AITER_MLA_SPARSE), a member that has no impl (FLASHMLA_SPARSE_DSV4) and one
# that does not import here (CUTLASS_MLA).
MLA_MEMBERS = ["CPU_MLA", "TRITON_MLA", "ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "FLASHMLA_SPARSE", "ROCM_AITER_MLA_SPARSE", "FLASHMLA_SPARSE_DSV4", "CUTLASS_MLA"]
MLA_EXPECTATIONS = os.path.join(ROOT, "docs", "expectations", "vllm-0.33.0-mla.txt")
# TRITON_ATTN's per-token-head checks (SPEC §16): their own run with their expectations file; the
# gfx942 and regression runs leave them out (one of them segfaults the interpreter: docs/expectations/vllm-0.33.0-pth.txt).
PTH = "pth"
PTH_SELECT = "test_quant_"
PTH_EXPECTATIONS = os.path.join(ROOT, "docs", "expectations", "vllm-0.33.0-pth.txt")


def regression(name: str) -> str:
    return f"regression:{name}"


# First, while the serial tests are in their first modules: the regression that copies whole K/V
# planes of a 2^31-element cache (its process peaks at ~13 GB on the 24 GiB CI machine), then the
# gfx942 run (the longest); every other run takes 2-15 s.
FIRST = (regression("rocm_swap_indexes_dim1"), GFX942)
JOB = "vllm-runs"
TIMEOUT = 3600  # s, for all the runs together
READERS = ("test_vllm_adapter.py", "test_vllm_regressions.py", "test_vllm_mla.py", "test_vllm_quant.py")
# One core (the serial tests have the other). TRITON_INTERPRET before the parent imports triton: a
# @triton.jit function made without it (tl.max's combine, in triton.language.standard) is not an
# interpreted one, and the runs forked from that parent failed "Cannot call @triton.jit'd outside of
# the scope of a kernel" in vLLM's per-token-head writer (the stand-ins set it too late for them).
JOB_ENV = {"OMP_NUM_THREADS": "1", "TRITON_INTERPRET": "1"}
_out: list[str] = []  # the runs' scratch directory, once registered


def plan() -> dict[str, tuple[tuple[str, ...], dict]]:
    """name -> (pytest arguments, environment) of every run, in the order they start."""
    runs = {GFX942: ((*PLUGIN, "-q", "-k", f"not {PTH_SELECT}", "--backend", ",".join(f"vllm:{b}" for b in ROCM_GFX942)), {})}  # no --standard: the E3 they declare
    runs |= {regression(name): ((*PLUGIN, "-q", "--tb=line", "--backend", r.backend, "-k", f"({r.select}) and not {PTH_SELECT}"), {ENV: name})
            for name, r in REGRESSIONS.items()}
    unified = (*PLUGIN, "-q", "--backend", UNIFIED_SHUFFLE, "--standard", "e3")
    runs.update({
        "unified-shuffle": (unified, GFX1250),
        "unified-shuffle-gated": ((*unified, "--expectations", os.path.join(ROOT, "docs", "expectations", "vllm-0.33.0.txt")), GFX1250),
        **{f"segmented-{gfx}": ((*PLUGIN, "-q", "--backend", SEGMENTED, "-k", SEGMENTED_SELECT), {"KVCONFORM_STANDIN_GFX": gfx})
           for gfx in ("gfx942", "gfx1201")},
        MLA: ((*PLUGIN, "-q", "--backend", ",".join(f"vllm:{m}" for m in MLA_MEMBERS), "--expectations", MLA_EXPECTATIONS), {}),
        PTH: ((*PLUGIN, "-q", "-k", PTH_SELECT, "--backend", "vllm:TRITON_ATTN", "--expectations", PTH_EXPECTATIONS), {}),
        **{f"e1-era:{name}": ((*PLUGIN, "-q", "--backend", f"tests.vllm_cpu.e1_era:{name}"), {})
           for name in ("blocks_first_hnd", "kv_first_rocm_attn", "neither_api")},
    })
    return {name: runs[name] for name in sorted(runs, key=lambda name: FIRST.index(name) if name in FIRST else len(FIRST))}


def probe(runs: dict) -> list[str]:
    """A collection of every backend the runs check: it imports what they share."""
    backends = sorted({args[args.index("--backend") + 1] for args, _ in runs.values()})
    return [*PLUGIN, "--standard", "e3", "--backend", ",".join(backends)]


def register(python: str) -> None:
    """The runs as a background job of one job slot (started as collection ends if a reader was collected)."""
    if not _out:
        _out.append(tempfile.mkdtemp(prefix="kvconform-vllm-runs-"))
        runs = plan()
        background.register(JOB, forked_runs_command(_out[0], runs, fresh=FRESH, probe=probe(runs), python=python, jobs=1, timeout=TIMEOUT),
                            cwd=ROOT, env=JOB_ENV, readers=READERS)


def results(python: str) -> dict[str, dict]:
    """Every run's results document with its ``exit_status`` (None: it wrote no results)."""
    register(python)
    log = background.result(JOB, timeout=TIMEOUT + 60)  # forked_runs stops its runs at TIMEOUT
    done = forked_runs_results(_out[0], plan(), log.stdout + log.stderr)
    return {name: {**run.document, "exit_status": run.returncode, "output": run.output} if run.document is not None else None
            for name, run in done.items()}


def remove() -> None:
    if _out:
        shutil.rmtree(_out.pop(), ignore_errors=True)
