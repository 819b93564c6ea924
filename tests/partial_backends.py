"""Reference backends whose write path is unavailable for some cases only, for the
per-example applicability tests (conformance/harness/examples.py) — the shape of vLLM's ROCM_ATTN,
which writes block sizes 16 and 32 through a compiled op a build may lack and other sizes
through Triton."""

from __future__ import annotations

import dataclasses

from kvconform.backends_under_test.contract import OpUnavailable
from kvconform.backends_under_test.reference_backend import ReferenceBackend

WHO = "this machine's build"


class UnavailableAtBlockSize32(ReferenceBackend):
    """Writes at block size 16; at 32 its (pretend) compiled writer is not in this build."""

    def path_block_sizes(self, op, layout):
        return self.capabilities.block_sizes if op == "write" else super().path_block_sizes(op, layout)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        if spec.geometry.block_size == 32:
            raise OpUnavailable("the compiled writer for block size 32 is not in this build", who=WHO)
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)


class UnavailableEverywhere(UnavailableAtBlockSize32):
    """No write path runs here at all: every write check is not applicable, none passes."""

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        raise OpUnavailable(f"the compiled writer for block size {spec.geometry.block_size} is not in this build", who=WHO)


class UnavailableInEveryShape(UnavailableEverywhere):
    """As UnavailableEverywhere with more shapes declared than Hypothesis draws before it gives
    up: the generated checks end in Hypothesis' Unsatisfiable, not in a known-everywhere reason."""

    def __init__(self):
        super().__init__()
        self._capabilities = dataclasses.replace(self._capabilities, head_sizes=(32, 48, 64, 80, 96, 128), num_kv_heads=(1, 2, 3, 4, 5, 6),
                                                 block_sizes=(16, 32, 48, 64))


class WriteOnly(ReferenceBackend):
    """Declares only a writer (AITER's and FlashInfer's adapters are such): no connector op."""

    @property
    def capabilities(self):
        return dataclasses.replace(super().capabilities, ops=frozenset({"write"}))
