"""pytest plugin for the GPU runs from the carry bundle: ``pytest -p tests.vllm_gpu.plugin``.

Installs the stand-ins for vLLM's absent compiled extensions (stand_ins.py) before any backend
imports vLLM. Not for a machine with a real vLLM install.
"""

from tests.vllm_gpu import stand_ins

stand_ins.install()
