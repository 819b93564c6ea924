"""Backends for kvconform's own coverage tests (loaded with ``--kvc-backend tests.coverage_backends:NAME``)."""

import dataclasses

import torch

from kvconform.backends_under_test.reference_backend import ReferenceBackend


class Float32Only(ReferenceBackend):
    """The reference declaring float32 caches only: no bf16/fp16 model dtype, no fp8."""

    def __init__(self):
        super().__init__()
        self._capabilities = dataclasses.replace(self._capabilities, dtypes=(torch.float32,), kv_cache_dtypes=("auto",))
