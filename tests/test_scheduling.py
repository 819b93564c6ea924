"""xdist suite runs are scheduled for the wall (conformance/plugin/scheduling.py): longest checks
first, the same order on every worker, tests pulled one at a time unless the user chose how,
and each worker's caches on its own GPU."""

import json
import types
from pathlib import Path

import pytest
import torch

from kvconform.conformance.plugin import scheduling
from kvconform.conformance.plugin.collection import PLANNED, Planned
from kvconform.reference import blocks_first, kv_first


class Item:
    """What the scheduler reads of a collected test."""

    def __init__(self, name: str, family: str = "write", needs=(), layout=None, hypothesis=False):
        self.name, self.path = name, Path(f"test_{family}.py")
        self.stash = {PLANNED: Planned(test_id=f"conformance/test_{family}.py::{name}", loaded=None, layout=layout, family=family,
                                       clauses=(), repro="", needs=tuple(needs))}
        self.obj = types.SimpleNamespace(hypothesis=object() if hypothesis else None)


def worker(durations=None):
    return types.SimpleNamespace(workerinput={"workerid": "gw0", scheduling.DURATIONS: durations or {}})


def ordered(items, config):
    scheduling.Scheduler(run=None).pytest_collection_modifyitems(config, items)
    return [item.name for item in items]


def test_checks_run_longest_first_in_the_same_order_on_every_worker():
    items = lambda: [Item("shape_a", "shape"), Item("swap_probe", "swap", ["memory_2_31"], blocks_first("NHD")),  # noqa: E731
                     Item("write_property", "write", hypothesis=True), Item("swap_probe_kv_first", "swap", ["memory_2_31"], kv_first("NHD")),
                     Item("shape_b", "shape")]
    first, second = ordered(items(), worker()), ordered(items(), worker())
    assert first == second
    assert first[0] == "swap_probe_kv_first" and first[-2:] == ["shape_a", "shape_b"]  # kv-first: twice the blocks; ties keep their order
    assert set(first[1:3]) == {"swap_probe", "write_property"}  # which first depends on the Hypothesis example budget


def test_a_transfer_between_devices_is_scheduled_before_the_probes():
    """Its device processes start per case (spawned on GPUs): left to the connector family's
    0.25 s it came last and held the run's end (issue #41)."""
    items = [Item("probe", "swap", ["memory_2_31"]), Item("between_devices", "connector", ["connector_ops", "two_devices"])]
    assert ordered(items, worker()) == ["between_devices", "probe"]


def test_durations_of_the_previous_run_come_before_estimates():
    items = [Item("probe", "swap", ["memory_2_31"]), Item("slow_shape", "shape")]
    assert ordered(items, worker({"conformance/test_shape.py::slow_shape": 9.0})) == ["slow_shape", "probe"]


def test_the_controller_keeps_the_collection_order():
    items = [Item("shape", "shape"), Item("probe", "swap", ["memory_2_31"])]
    assert ordered(items, types.SimpleNamespace()) == ["shape", "probe"]


def xdist_config(*args, addopts=()):
    return types.SimpleNamespace(option=types.SimpleNamespace(dist="load", maxschedchunk=None),
                                 invocation_params=types.SimpleNamespace(args=args), getini=lambda name: list(addopts))


def test_workers_pull_one_test_at_a_time_unless_the_user_chose_how(monkeypatch, tmp_path):
    monkeypatch.delenv("PYTEST_ADDOPTS", raising=False)
    first_run = types.SimpleNamespace(options=types.SimpleNamespace(json_path=str(tmp_path / "results.json"), profile="quick", device="cpu"))
    plain = xdist_config("-n", "8")
    scheduling.Scheduler(first_run).pytest_configure(plain)
    assert plain.option.maxschedchunk == 1
    for chosen in (xdist_config("-n", "8", "--maxschedchunk", "4"), xdist_config("--dist=load", "-n", "8"), xdist_config(addopts=["--dist", "load"])):
        scheduling.Scheduler(first_run).pytest_configure(chosen)
        assert chosen.option.maxschedchunk is None


def test_the_previous_durations_are_those_of_the_same_profile_and_device(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"environment": {"profile": "quick", "device": "cuda"},
                                   "tests": [{"nodeid": "conformance/test_swap.py::a", "duration_s": 2.5}, {"nodeid": "b", "duration_s": None}]}))

    def run(profile, device):
        return types.SimpleNamespace(options=types.SimpleNamespace(json_path=str(results), profile=profile, device=device))

    assert scheduling.Scheduler(run("quick", "cuda")).previous_durations() == {"conformance/test_swap.py::a": 2.5}
    assert scheduling.Scheduler(run("full", "cuda")).previous_durations() == {}
    assert scheduling.Scheduler(run("quick", "cpu")).previous_durations() == {}


@pytest.fixture
def two_gpus(monkeypatch):
    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    return chosen


def gpu_config(workerid=None, device=None, devices=None, workers=None):
    given = {"kvc_device": device, "kvc_devices": devices, "numprocesses": workers}
    config = types.SimpleNamespace(getoption=lambda name, default=None: given.get(name) or default)
    if workerid:
        config.workerinput = {"workerid": workerid}
    return config


def test_each_worker_keeps_its_caches_on_its_own_gpu(two_gpus):
    for workerid in ("gw0", "gw1", "gw2", "gw7"):
        scheduling.choose_worker_gpu(gpu_config(workerid))
    scheduling.choose_worker_gpu(gpu_config("gw3", "cuda"))
    assert two_gpus == [0, 1, 0, 1, 1]


def test_a_named_gpu_or_the_controller_chooses_none(two_gpus):
    scheduling.choose_worker_gpu(gpu_config("gw1", "cuda:0"))
    scheduling.choose_worker_gpu(gpu_config("gw1", "cpu"))
    scheduling.choose_worker_gpu(gpu_config(None))
    assert two_gpus == []


def test_kvc_devices_overrides_which_gpu_each_worker_takes(two_gpus):
    for workerid in ("gw0", "gw1", "gw2"):
        scheduling.choose_worker_gpu(gpu_config(workerid, devices="cuda:1,cuda:0,cpu"))
    scheduling.choose_worker_gpu(gpu_config("gw5", devices="cuda:0"))
    assert two_gpus == [1, 0, 0], "worker gwN takes devices[N % len]; a cpu entry sets no GPU"


def test_the_header_names_each_workers_device(two_gpus):
    header = scheduling.Scheduler(None).pytest_report_header(gpu_config(devices="cuda:0,cuda:1", workers=3))
    assert header.endswith(": gw0 cuda:0, gw1 cuda:1, gw2 cuda:0"), header
    assert "spread over 2 device(s)" in header
    assert scheduling.Scheduler(None).pytest_report_header(gpu_config(device="cpu")) is None
