"""Scheduling a suite run under xdist for the wall, not the count (docs/PERFORMANCE.md).

xdist hands out tests in collection order, in contiguous chunks (a quarter of a worker's share
at first): one parametrized check's cases arrive together, so the 2^31-element swap probes of
every backend landed on one or two workers, which ran them one after another while the others
idled (an H200 run: 83 s of swap probes, 85 s of wall). Here, on a suite run with ``-n``:

- every worker sorts its collection **longest first** (the same order on each, as xdist
  requires): by the durations the previous run at the same ``--kvc-json`` path recorded for the
  same profile and device, which the controller hands every worker, else by :func:`estimate`;
- unless the command line chose ``--dist`` or ``--maxschedchunk``, workers **pull** their tests
  one at a time (``--maxschedchunk 1``), so the long ones spread over all of them and the short
  ones fill the gaps;
- on a machine with several GPUs, worker ``gwN`` keeps its caches on GPU ``N % count`` when the
  run's device is ``cuda`` (given or the default): ``torch.cuda.set_device`` before anything
  touches a GPU, so a 2 × H200 machine runs twice as many workers' caches side by side. The
  repro lines still say ``--kvc-device cuda``. ``--kvc-devices LIST`` overrides the list: worker
  ``gwN`` takes ``LIST[N % len]`` (``--kvc-devices cuda:0`` keeps every worker on one GPU); the
  header names each worker's device.
"""

from __future__ import annotations

import json
import os
import shlex

import pytest
import torch
from hypothesis import settings

from . import collection, options

DURATIONS = "kvconform_durations"  # workerinput key: {test id: seconds} of the previous run

# Seconds a check takes on an H200, roughly, when no earlier run says (measured 2026-11-30 after
# the probes were made cheap, docs/PERFORMANCE.md): what matters is that long ones come first.
# Hypothesis checks cost per example (6 quick, 80 full): in the full profile they are the longest.
PROBE_SECONDS = {"swap": 0.5, "copy": 0.3, "write": 0.1, "read": 0.1}  # past 2^31 elements; twice on kv-first layouts
SECONDS_PER_EXAMPLE = {"read": 0.05, "write": 0.05, "connector": 0.02, "copy": 0.015}
FAMILY_SECONDS = {"connector": 0.25}
# A transfer between devices starts its device processes per case: forked on CPU (~1.2 s a case
# measured on two cores), spawned for GPUs, each importing torch and opening CUDA and NCCL.
TRANSFER_SECONDS = 3.0
DEFAULT_SECONDS = 0.02


def estimate(item) -> float:
    """A check's cost from what it is: a probe past 2^31 elements, a Hypothesis check (by its
    example budget), its family."""
    planned = item.stash.get(collection.PLANNED, None)
    if planned is None:
        return DEFAULT_SECONDS
    if "two_devices" in planned.needs:
        return TRANSFER_SECONDS
    if "memory_2_31" in planned.needs:
        kv_first = planned.layout is not None and planned.layout.k_dims[0] == "2"
        return PROBE_SECONDS.get(planned.family, 0.3) * (2 if kv_first else 1)
    if getattr(getattr(item, "obj", None), "hypothesis", None) is not None:
        return SECONDS_PER_EXAMPLE.get(planned.family, 0.01) * settings().max_examples  # the loaded profile's
    return FAMILY_SECONDS.get(planned.family, DEFAULT_SECONDS)


class Scheduler:
    """The plugin object, registered on the controller and the workers of an xdist suite run."""

    def __init__(self, run):
        self.run = run  # session.SuiteRun
        self.previous: dict | None = None

    # ------------------------------------------------------------------ controller
    def pytest_configure(self, config):
        if getattr(config.option, "dist", "no") == "load" and not _chosen(config):
            config.option.maxschedchunk = 1
        if not hasattr(config, "workerinput"):
            self.previous_durations()  # now: the recorder sets that file aside as the session starts

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node):
        """Every worker gets the same durations, so all sort alike."""
        node.workerinput[DURATIONS] = self.previous_durations()

    def previous_durations(self) -> dict:
        """{test id: seconds} from the results the previous run left at this run's --kvc-json
        path, if it ran the same profile on the same device; else nothing."""
        if self.previous is None:
            self.previous, options = {}, self.run.options
            try:
                with open(options.json_path) as f:
                    document = json.load(f)
                environment = document.get("environment", {})
                if environment.get("profile") == options.profile and environment.get("device") == options.device:
                    self.previous = {t["nodeid"]: float(t["duration_s"]) for t in document.get("tests", []) if t.get("duration_s") is not None}
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                pass
        return self.previous

    def pytest_report_header(self, config):
        devices = worker_devices(config)
        if not devices:
            return None
        workers = config.getoption("numprocesses", None)
        named = "" if not isinstance(workers, int) else ": " + ", ".join(f"gw{n} {devices[n % len(devices)]}" for n in range(workers))
        return f"kvconform: xdist workers spread over {len(set(devices))} device(s) (worker gwN on device N % {len(devices)} of {','.join(devices)}){named}"

    # ------------------------------------------------------------------ workers
    @pytest.hookimpl(trylast=True)  # after kvconform has planned each test
    def pytest_collection_modifyitems(self, config, items):
        if not hasattr(config, "workerinput"):
            return
        known = config.workerinput.get(DURATIONS) or {}
        cost = {id(item): known.get(collection.test_id(item)) or estimate(item) for item in items}
        items.sort(key=lambda item: -cost[id(item)])  # stable: equal costs keep collection order


def _chosen(config) -> bool:
    """Did the user choose how xdist distributes (command line, PYTEST_ADDOPTS or ini addopts)?"""
    words = [*config.invocation_params.args, *shlex.split(os.environ.get("PYTEST_ADDOPTS", "")), *config.getini("addopts")]
    return any(str(w).split("=")[0] in ("--dist", "--maxschedchunk", "-d") for w in words)


def in_use(config) -> bool:
    """Is this an xdist run of the suite (its controller or one of its workers)?"""
    return bool(getattr(config.option, "numprocesses", None)) or hasattr(config, "workerinput")


def choose_worker_gpu(config) -> None:
    """On an xdist worker ``gwN``: make ``devices[N % len]`` of :func:`worker_devices` the current
    GPU, before anything touches a GPU (a CPU entry of ``--kvc-devices`` changes nothing)."""
    devices = worker_devices(config)
    worker = getattr(config, "workerinput", {}).get("workerid", "")
    if devices and worker.startswith("gw"):
        device = torch.device(devices[int(worker[2:]) % len(devices)])
        if device.type == "cuda" and device.index is not None:
            torch.cuda.set_device(device.index)


def worker_devices(config) -> list[str]:
    """The devices the xdist workers spread over: ``--kvc-devices`` as given; else every GPU when
    the run's device is plain ``cuda`` (given or the default) and there are several; else none."""
    given = config.getoption("kvc_devices", None)
    if given:
        return list(options.device_list(given))
    if config.getoption("kvc_device", None) not in (None, "cuda"):
        return []
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return [f"cuda:{i}" for i in range(count)] if count > 1 else []
