"""How far kvconform's ``vllm:`` adapter reaches into the installed vLLM release, in one process:

    VENV/bin/python -m tests.vllm_cpu.release_reach [MEMBER ...]

Run in a vLLM CPU venv (make_venv.sh VENV VERSION). With the stand-ins (simulated gfx942), it
imports vLLM, builds the adapter for each member (default: the gfx942 run's, runs.py) and reads its
declared layouts, ops and standards; then asks which fp8 codes the Triton flash writer stores in an
``fp8_e5m2`` cache (fp8_e5m2_probe.py). Prints one JSON object: per member the adapter's class and
what it declares, or the exception that stopped it (type and message: where an API moved or went).
"""

from __future__ import annotations

import json
import sys

from tests.vllm_cpu import fp8_e5m2_probe, stand_ins

GFX942_MEMBERS = ["ROCM_AITER_FA", "ROCM_AITER_FA+shuffle", "ROCM_AITER_UNIFIED_ATTN", "ROCM_ATTN", "TRITON_ATTN", "FLASH_ATTN", "FLASHINFER"]


def reach(name: str) -> dict:
    from kvconform.backends_under_test.vllm_backend import adapter_for_name

    try:
        backend = adapter_for_name(name)
        caps = backend.capabilities
    except Exception as exc:  # noqa: BLE001 - what stopped the adapter is the answer
        return {"stopped": f"{type(exc).__name__}: {exc}"}
    return {"adapter": type(backend).__name__, "layouts": sorted(str(layout) for layout in caps.layouts),
            "ops": sorted(caps.ops), "standards": sorted(caps.standards), "block_sizes": list(caps.block_sizes),
            "kv_cache_dtypes": list(caps.kv_cache_dtypes)}


def main(members: list[str]) -> dict:
    stand_ins.install("gfx942")
    import vllm

    return {"vllm": vllm.__version__, "members": {name: reach(name) for name in members},
            "fp8_e5m2_triton_writer": fp8_e5m2_probe.probe("gfx942", installed=True)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:] or GFX942_MEMBERS), indent=1))
