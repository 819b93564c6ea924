"""pytest plugin for kvconform's CPU CI against the real vLLM: ``pytest -p tests.vllm_cpu.plugin``.

Loaded before conftest.py, so the stand-ins (stand_ins.py) are in place before any backend
imports vLLM. Not needed, and not to be used, on a machine with a real GPU build of vLLM.
"""

from tests.vllm_cpu import stand_ins

stand_ins.install()
