"""Which ``AttentionBackendEnum`` members of the installed vLLM can be checked here:
``python -m tests.vllm_gpu.members`` prints one JSON object, per member whether its class
imports (else the error) and, when it does, the standards its adapter declares (else why the
adapter could not load it)."""

from __future__ import annotations

import json
import traceback

from tests.vllm_gpu import stand_ins


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()[-600:]


def members() -> dict:
    stand_ins.install()
    from kvconform.backends_under_test import registry
    from kvconform.backends_under_test.vllm_backend import _attention_backend_enum

    found = {}
    for name, member in _attention_backend_enum().__members__.items():
        try:
            member.get_class()
        except Exception as exc:  # noqa: BLE001 - reported per member
            found[name] = {"imports": False, "error": _error(exc)}
            continue
        loaded = registry.load(f"vllm:{name}")
        if loaded.backend is None:
            found[name] = {"imports": True, "standards": [], "out_of_scope": loaded.out_of_scope, "load_error": loaded.error or loaded.unavailable}
        else:
            found[name] = {"imports": True, "standards": sorted(loaded.backend.capabilities.standards)}
    return found


if __name__ == "__main__":
    print(json.dumps(members(), indent=1))
