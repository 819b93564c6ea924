"""Which fp8 codes does the installed vLLM's Triton flash writer store in an ``fp8_e5m2`` cache?

    VENV/bin/python -m tests.vllm_cpu.fp8_e5m2_probe [GFX]

Run in a vLLM CPU venv (make_venv.sh): the stand-ins make vLLM's own detection pick RocmPlatform
for the simulated GFX (gfx942: fp8_dtype() is e4m3fnuz; gfx950: e4m3fn) and the writer runs under
the Triton interpreter. It writes 64 tokens of random bf16 K/V (scale 1) through
``triton_reshape_and_cache_flash`` with ``kv_cache_dtype="fp8_e5m2"`` and prints, as JSON, how many
stored bytes equal torch's e5m2 code of the value and how many the platform fp8 dtype's code. The
interpreter's cast drops the rounding carry now and then (docs/VLLM.md), so a few bytes match
neither; the two encodings differ on most values, so the counts say which one the writer stores.
"""

from __future__ import annotations

import json
import sys

from tests.vllm_cpu import stand_ins

B, N, H, D, T = 4, 16, 2, 64, 64


def probe(arch: str, installed: bool = False) -> dict:
    """``installed``: the stand-ins are already in place (for ``arch``) and vLLM imported."""
    if not installed:
        stand_ins.install(arch)
    import torch
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.attention.ops.triton_reshape_and_cache_flash import (
        triton_reshape_and_cache_flash,
    )

    gen = torch.Generator().manual_seed(0)
    key, value = (torch.randn(T, H, D, generator=gen).to(torch.bfloat16) for _ in range(2))
    caches = [torch.zeros(B, N, H, D, dtype=torch.uint8) for _ in range(2)]
    slots = torch.randperm(B * N, generator=gen)[:T]
    one = torch.ones((), dtype=torch.float32)
    triton_reshape_and_cache_flash(key, value, *caches, slots, "fp8_e5m2", one, one)
    stored = torch.stack([c.view(B * N, H, D)[slots] for c in caches])
    values = torch.stack([key, value]).float()
    platform = current_platform.fp8_dtype()
    e5m2, native = (values.to(dtype).view(torch.uint8) for dtype in (torch.float8_e5m2, platform))
    return {
        "vllm": vllm.__version__, "gfx": arch, "platform": type(current_platform).__name__, "platform_fp8_dtype": str(platform),
        "elements": stored.numel(),
        "encodings_differ": int((e5m2 != native).sum()),
        "stored_equals_e5m2_code": int((stored == e5m2).sum()),
        "stored_equals_platform_fp8_code": int((stored == native).sum()),
    }


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1] if len(sys.argv) > 1 else "gfx942")))
