"""Check 10b — connector between devices (issue #41, docs/CONNECTOR.md "Between devices", clause
CONN-RESHARD-DEVICES): hetero-TP resharding whose producer ranks live on some devices and consumer
ranks on others — one process per device, bytes over NCCL between GPUs (gloo for the CPU stand-in
``--kvc-devices cpu,cpu``), plans from the backend's own handshake — leaves every consumer rank's
cache equal to the reference's for its heads, bit for bit. Needs two devices (``--kvc-devices``);
with fewer it is not applicable, never a pass."""

import dataclasses

import pytest

from .harness.applicability import undeclared
from .harness.case import block_ids
from .harness.connector import LAYERS
from .harness.device_transfer import DeviceJob, assert_consumers_hold_their_heads, declared_model_heads, run_on_devices

pytestmark = [pytest.mark.connector]

TP_CHANGES = [(1, 2), (2, 1), (2, 4), (4, 2)]  # on two devices: TP 2→4 is 6 logical ranks in 2 processes


def layout_name(layout) -> str:
    return f"{layout.era}:{layout.alias}"


def another_layout(case):
    """A second declared layout of the same layer grouping (the wire then converts), or None."""
    same = [lay for lay in case.backend.capabilities.layouts if ("L" in lay.k_dims) == ("L" in case.layout.k_dims) and lay != case.layout]
    return same[0] if same else None


@pytest.mark.kvc_needs("connector_ops")
@pytest.mark.kvc_needs("two_devices")
@pytest.mark.kvc_clause("CONN-RESHARD", "CONN-RESHARD-SLICES", "CONN-RESHARD-DEVICES")
@pytest.mark.parametrize("tp", TP_CHANGES, ids=[f"tp{p}to{c}" for p, c in TP_CHANGES])
def test_resharding_between_devices_lands_every_consumers_heads(case, tp):
    # Region to region on this layout, and through the wire into another declared one, in the same device processes.
    producer_tp, consumer_tp = tp
    total = declared_model_heads(case.backend, producer_tp, consumer_tp)
    if total is None:
        raise undeclared(case.backend, f"declares no num_kv_heads that splits over TP {producer_tp}→{consumer_tp}")
    g = case.geometry(num_layers=LAYERS, num_blocks=5)
    try:
        case.layout.validate(dataclasses.replace(g, num_layers=1))
    except ValueError as exc:
        raise undeclared(case.backend, f"declares no geometry layout {case.layout.alias} holds here: {exc}") from exc
    job = DeviceJob(case.backend_spec or case.backend.name, layout_name(case.layout), layout_name(case.layout), g, total, producer_tp, consumer_tp,
                    tuple(sorted(block_ids(g, 2, case.seed).tolist())), tuple(sorted(block_ids(g, 2, case.seed + 1).tolist())), case.seed, case.repro)
    other = another_layout(case)
    jobs = [job] + ([dataclasses.replace(job, consumer_layout=layout_name(other))] if other else [])
    for report in run_on_devices(jobs, case.devices):
        assert_consumers_hold_their_heads("connector", case, report)
