"""pytest plugin for kvconform's CPU CI against the real vLLM: ``pytest -p tests.vllm_cpu.plugin``.

Loaded before conftest.py, so the stand-ins (stand_ins.py) are in place before any backend
imports vLLM — and, when ``KVCONFORM_VLLM_REGRESSION`` names one, a regression edited into
vLLM's source (regressions.py). Not needed, and not to be used, on a machine with a real GPU
build of vLLM.
"""

from tests.vllm_cpu import regressions, stand_ins

regressions.install_from_env()
stand_ins.install()
