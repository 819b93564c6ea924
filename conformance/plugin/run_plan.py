"""What one suite run will do, decided before anything is done: :func:`plan_run` turns the
options a run was given (and the few facts of the process it runs in) into a :class:`RunPlan`;
``session.wire`` then does what the plan says. Nothing here imports pytest or torch, reads a
file or changes the process: a plan can be tested from plain values (tests/test_run_plan.py).

Two decisions wait for the backends (they are loaded by the wiring): the layout standard and
the timeout a user did not give (:func:`declared_defaults`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from kvconform.errors import InputError

from .options import STANDARDS, RunOptions, validate


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """What start-up does in this process (``session.wire``), in the order it does it."""

    options: RunOptions  # validated; standard and timeout still as given (declared_defaults fills them)
    controller: bool  # False on an xdist worker: it sends its reports to the controller
    environ_defaults: tuple[tuple[str, str], ...]  # variables set where the environment leaves them unset
    one_thread: bool  # torch's intra-op threads limited to one (an xdist worker)
    choose_worker_gpu: bool  # an xdist worker takes its own GPU (scheduling.choose_worker_gpu)
    outputs: dict[str, str | None]  # option -> path of every file the run writes (checked on the controller)
    inputs: dict[str, str | None]  # option -> path of every file the run reads
    hypothesis_home: str | None  # None: a scratch directory removed when the process ends
    compare_with_reference: bool  # a certified run without --kvc-compare-digests compares with the reference's digests
    count_deselected: bool  # this process keeps the tally of what collection deselected
    take_results_lock: bool  # and registers the recorder (the controller)
    certifier: bool
    scheduler: bool  # an xdist run: scheduling.Scheduler on the controller and the workers
    worker_canary: bool  # an xdist worker of a certified run computes its canary (certify.WorkerCanary)


def plan_run(options: RunOptions, environ: Mapping[str, str], *, worker: bool, xdist: bool, cuda: bool,
             shows_only: bool, junit_path: str | None) -> RunPlan:
    """The plan of a run given ``options`` (read from pytest's config, a certified run's pinned),
    in a process that is an xdist ``worker`` or the controller of an ``xdist`` run, on a machine
    with or without ``cuda``; ``shows_only``: a session that runs no test (``--collect-only`` …).
    An option that cannot be used is an ``InputError`` naming it (the device: checked by the wiring,
    which allocates on it)."""
    validate(options)
    outputs, inputs = outputs_and_inputs(options, junit_path)
    # Triton kernels run on CPU through its interpreter.
    interpret = () if cuda or "TRITON_INTERPRET" in environ else (("TRITON_INTERPRET", "1"),)
    # Hypothesis' scratch files go beside the results, never into the caller's tree or site-packages;
    # a session that runs nothing (it caches constants as it collects) leaves no trace.
    home = None if shows_only else os.path.join(os.path.dirname(os.path.abspath(options.json_path)), ".hypothesis")
    return RunPlan(
        options=options, controller=not worker, environ_defaults=interpret, one_thread=worker, choose_worker_gpu=worker,
        outputs=outputs, inputs=inputs, hypothesis_home=home,
        compare_with_reference=bool(options.certify) and not options.compare_digests,
        count_deselected=not xdist or worker, take_results_lock=not worker, certifier=not worker and bool(options.certify),
        scheduler=xdist or worker, worker_canary=worker and bool(options.certify),
    )


def outputs_and_inputs(opts: RunOptions, junit_path: str | None) -> tuple[dict, dict]:
    """(option -> path) of every file a run writes, and of every file it reads (outputs.check_outputs)."""
    html = opts.html_path or os.path.splitext(opts.json_path)[0] + ".html"
    return ({"--kvc-json": opts.json_path, "--kvc-html": html, "--junitxml": junit_path, "--kvc-update-expectations": opts.update_expectations,
             "--kvc-export-digests": opts.export_digests, "--kvc-certify": opts.certify},
            {"--kvc-expectations": opts.expectations, "--kvc-compare-digests": opts.compare_digests})


# ----------------------------------------------------------------------------- run options a user did not give
# --kvc-standard: the layout standard every named backend that declares one declares (E1 when
# they share both); E1 when none declares one; a usage error when named backends disagree — one
# run checks one standard, and checking an E3-only backend against E1 would only make its
# standard checks not applicable. The default backend set (no --backend) is the E1 models plus
# one E3 model and keeps E1. --kvc-timeout: the longest Backend.default_timeout among the
# backends (vLLM's adapters set one: a kernel that writes out of bounds can hang a worker).
FALLBACK_STANDARD = "e1"


def declared_defaults(options: RunOptions, backends: dict) -> RunOptions:
    """``options`` with the standard and timeout it does not give taken from the loaded backends."""
    return dataclasses.replace(options, standard=default_standard(options.standard, backends, explicit=bool(options.backends)),
                               timeout=default_timeout(options.timeout, backends))


def default_standard(given: str | None, backends: dict, explicit: bool) -> str:
    if given:
        return given
    declared = {name: loaded.backend.capabilities.standards for name, loaded in backends.items()
                if loaded.backend is not None and loaded.backend.capabilities.standards}
    if not declared or not explicit:
        return FALLBACK_STANDARD
    common = set(STANDARDS).intersection(*declared.values())
    if not common:
        listing = ", ".join(f"{name}: {'/'.join(sorted(s))}" for name, s in declared.items())
        raise InputError(f"--kvc-standard not given and the backends declare different standards ({listing}); "
                         f"give --kvc-standard {' or '.join(STANDARDS)}, or run them separately")
    return min(common, key=STANDARDS.index)


def default_timeout(given: float | None, backends: dict) -> float | None:
    if given is not None:
        return given
    limits = [loaded.backend.default_timeout for loaded in backends.values() if loaded.backend is not None and loaded.backend.default_timeout]
    return max(limits) if limits else None
