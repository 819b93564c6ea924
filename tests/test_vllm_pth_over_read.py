"""vLLM 0.33.0's per-token-head writer takes its token count from ``key``, not from ``slot_mapping``
(docs/expectations/vllm-0.33.0-pth.txt, PTH-SOURCE-STRIDE): with more key rows than slots it reads
the slot mapping past its end and writes the extra rows where those values point. Shown without a
crash on vLLM's own writer from its sdist (tests/test_reference_quant.py's extract, under the CPU
interpreter): the slot mapping is a view whose storage holds a valid slot right after it, so the
over-read lands in the cache. When vLLM fixes it this test fails: drop the expectations entry."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from kvconform.reference import quant_codecs as QC

from .test_reference_quant import (
    GUARD,
    geometry,
    random_buffer,
    rows,
    vllm,  # noqa: F401 - the fixture
    write_case,
)

PAST_THE_END = 9  # the slot the storage holds right after the mapping's last element


def test_rows_past_the_slot_mapping_are_written_by_vllms_per_token_head_writer(vllm, tmp_path):  # noqa: F811 - the fixture
    g = geometry("HND", head_size=64, num_kv_heads=2)
    key, value = rows(3, g, seed=5)
    slots = torch.tensor([0, 5, PAST_THE_END])[:2]  # two slots for three key rows
    buffer = random_buffer(g, 4)
    torch.save({"over-read": write_case(g, buffer.clone(), key, value, slots)}, tmp_path / "in.pt")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(vllm.__file__), os.environ.get("PYTHONPATH", "")]), "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, vllm.__file__, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    written = torch.load(tmp_path / "out.pt")["over-read"]["buffer"]
    spec_says, vllm_does = buffer.clone(), buffer.clone()
    for expected in (spec_says, vllm_does):
        QC.initialise_scales(expected[GUARD:], g)  # the driver builds the views first, as the layer's first use
    QC.write(key, value, spec_says[GUARD:], g, slots)
    QC.write(key, value, vllm_does[GUARD:], g, torch.tensor([0, 5, PAST_THE_END]))
    assert not torch.equal(written, spec_says), "vLLM's writer no longer reads past the slot mapping: remove the PTH-SOURCE-STRIDE entry"
    assert torch.equal(written, vllm_does), "vLLM's writer wrote the extra row somewhere other than the slot past the mapping"
