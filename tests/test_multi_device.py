"""Several devices (issue #41): where the logical TP ranks go (one process per device, producers on
the first half, consumers on the second), and the transfer between device processes over gloo —
the CPU stand-in for two GPUs: the reference lands every consumer rank's heads bit for bit, a
handshake that routes each slice to the next consumer rank fails naming the rank, device and head."""

import dataclasses
import json
import sys

import pytest
import torch

from kvconform import reference as R
from kvconform.conformance.harness import oracle_guard
from kvconform.conformance.harness.device_transfer import DeviceJob, engine_for, run_on_devices
from kvconform.conformance.harness.placement import CannotPlace, place
from kvconform.conformance.plugin import certify
from kvconform.conformance.plugin.options import OptionError, check_device, device_list

WRONG_DEVICE = "mutant:connector_reshard_routes_heads_to_the_wrong_device"


def test_tp1_to_2_on_two_devices_puts_the_producer_on_one_and_both_consumers_on_the_other():
    p = place(1, 2, ["cuda:0", "cuda:1"])
    assert (p.producers, p.consumers) == ((0,), (1, 1)), p
    assert p.describe() == "cuda:0#0: P0 | cuda:1#1: C0 C1"


def test_tp4_to_2_on_two_devices_needs_only_two_processes():
    p = place(4, 2, ["cpu", "cpu"])
    assert (p.producers, p.consumers) == ((0, 0, 0, 0), (1, 1)), p
    assert [p.producer_ranks_on(0), p.consumer_ranks_on(1)] == [[0, 1, 2, 3], [0, 1]]


def test_four_devices_split_in_halves_round_robin():
    p = place(2, 4, ["cuda:0", "cuda:1", "cuda:2", "cuda:3"])
    assert (p.producers, p.consumers) == ((0, 1), (2, 3, 2, 3)), p
    assert not set(p.producers) & set(p.consumers), "no device process hosts a producer and a consumer"


@pytest.mark.parametrize("devices", [[], ["cuda:0"]])
def test_one_device_cannot_hold_producers_and_consumers_apart(devices):
    with pytest.raises(CannotPlace, match="needs two devices"):
        place(1, 2, devices)


def test_nccl_carries_bytes_between_distinct_gpus_and_gloo_through_host_memory_otherwise():
    assert engine_for(["cuda:0", "cuda:1"]) == "nccl"
    assert engine_for(["cuda:0", "cuda:0"]) == "gloo"  # NCCL refuses two ranks on one GPU
    assert engine_for(["cpu", "cpu"]) == engine_for(["cuda:0", "cpu"]) == "gloo"


@pytest.mark.parametrize("device, gpus, pinned", [("cpu", 0, ("cpu", "cpu")), ("cuda", 1, ("cuda:0", "cuda:0")),
                                                   ("cuda:0", 1, ("cuda:0", "cuda:0")), ("cuda", 2, ())])
def test_a_certified_run_on_one_device_shows_the_transfer_between_two_processes_on_it(device, gpus, pinned, monkeypatch):
    """A certified run must not find the check "not applicable" for want of a second GPU (it would
    refuse every one-GPU machine); with several GPUs the run takes them all (session.start)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    assert certify._one_device_twice(device) == pinned


def test_kvc_devices_is_a_comma_list_and_a_bad_entry_is_an_error_naming_the_option():
    assert device_list("cuda:0, cuda:1") == ("cuda:0", "cuda:1") and device_list("cpu,cpu") == ("cpu", "cpu") and device_list(None) == ()
    with pytest.raises(OptionError, match="--kvc-devices 'cuda:0,,cuda:1': an empty entry"):
        device_list("cuda:0,,cuda:1")
    with pytest.raises(OptionError, match="--kvc-devices 'gpu7': not a device name"):
        check_device("gpu7", "--kvc-devices")


def job(producer_tp, consumer_tp, backend="reference", consumer_layout="E1:NHD") -> DeviceJob:
    g = R.Geometry(num_blocks=5, block_size=16, num_kv_heads=4, head_size=64, dtype=torch.bfloat16, num_layers=3)
    return DeviceJob(backend, "E1:NHD", consumer_layout, g, 4, producer_tp, consumer_tp, (2, 3), (2, 4), seed=3, repro="(test)")


@pytest.fixture(scope="module")
def reports():
    """One pair of device processes for every job of this module (processes are the cost)."""
    jobs = [job(1, 2), job(4, 2, consumer_layout="E1:HND"), job(1, 2, backend=WRONG_DEVICE)]
    return dict(zip(("reference 1→2", "reference 4→2 wire", "wrong device"), run_on_devices(jobs, ["cpu", "cpu"], timeout=120)))


@pytest.mark.parametrize("name", ["reference 1→2", "reference 4→2 wire"])
def test_the_reference_lands_every_consumers_heads_bit_for_bit_over_gloo(reports, name):
    report = reports[name]
    assert report.failures == [], f"{name}: consumer ranks {[f.rank for f in report.failures]} differ: {report.failures[:1]}"
    assert [c.heads for c in report.consumers] == [(0, 2), (2, 4)]
    assert all(c.bytes_received == 3 * 2 * 2 * 16 * 2 * 64 * 2 for c in report.consumers), "3 layers × 2 blocks × K,V × N × 2 heads × D × bf16"
    assert report.placement == "cpu#0: " + " ".join(f"P{r}" for r in range(report.job.producer_tp)) + " | cpu#1: C0 C1"


def test_a_handshake_routing_heads_to_the_next_rank_fails_naming_rank_device_and_head(reports):
    failures = reports["wrong device"].failures
    assert [f.rank for f in failures] == [0, 1], "both consumer ranks got the other's heads"
    first = failures[0].failure
    assert "consumer rank 0 on cpu (device process 1), model heads 0..1 of 4" in first and "head=0" in first, first


def test_a_backend_that_changes_the_oracle_in_a_device_process_voids_the_transfer():
    hostile = job(1, 2, backend="tests.hostile_backends:PatchesTheReferenceWhileItShips")
    with pytest.raises(oracle_guard.OracleChanged, match=r"in device process \d \(cpu\): the oracle changed during backend "
                                                         r".*layout_descriptor\(\).*kvconform\.reference\.copy_blocks was replaced"):
        run_on_devices([hostile], ["cpu", "cpu"], timeout=120)


def test_a_job_whose_blocks_do_not_ascend_is_refused():
    with pytest.raises(ValueError, match="ascend"):
        dataclasses.replace(job(1, 2), consumer_blocks=(4, 2))


def test_the_benchmark_runs_as_a_cpu_smoke(tmp_path, monkeypatch, capsys):
    from benchmarks import bench_multi_gpu

    out = tmp_path / "smoke.json"
    monkeypatch.setattr(sys, "argv", ["bench_multi_gpu.py", "--cpu", "--out", str(out), "--size-mib", "1", "--num-blocks", "3", "--no-suite"])
    bench_multi_gpu.main()
    result = json.loads(out.read_text())
    assert [c["change"] for c in result["tp_changes"]] == ["1->2", "2->1", "2->4", "4->2"]
    assert all(c["bit_for_bit"] and c["ratio_to_send_recv"] > 0 for c in result["tp_changes"]), result["tp_changes"]
    assert "send/recv" in capsys.readouterr().out
