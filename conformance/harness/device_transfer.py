"""TP resharding between devices (issue #41): one process per device, bytes over torch.distributed.

A :class:`DeviceJob` is one resharding of a model's KV from P producer ranks to C consumer ranks of
one backend. :func:`run_on_devices` starts one process per device of a :mod:`placement` (NCCL between
distinct GPUs; gloo otherwise, its wire staged through host memory: ``cpu,cpu`` is the stand-in for
two GPUs, ``cuda:0,cuda:0`` two processes on a machine's one GPU), which hosts every logical rank
placed there, and runs the jobs in order in the same processes:

1. every logical rank allocates its shard (guarded arenas, harness.connector) on its process's
   device; producers write their heads of the model's KV into their blocks;
2. the handshake: every device process gathers every rank's layout descriptor (``all_gather_object``)
   and derives every (consumer rank, producer rank) plan with the consumer backend's own
   ``handshake`` where it declares the op, else ``kvconform.compat`` — the same plans on every side;
3. the transfer: consumer ranks outermost, then producer ranks, slices, layer arenas — one order all
   processes walk — each slice's bytes (regions or the wire, as the plan's mode says) go
   ``dist.send`` → ``dist.recv`` between the two device processes, length first;
4. every consumer rank's arenas are compared bit for bit (guards included) with the reference: a
   copy of its cache before the transfer with its model heads placed in its blocks.

Each consumer rank reports its device, heads, bytes received, seconds and, when its bytes are wrong,
the failure in logical coordinates (what harness.assertions wrote in that process).
"""

from __future__ import annotations

import dataclasses
import queue
import socket
import time
import traceback
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kvconform import reference as R
from kvconform.reference import compat

from . import oracle_guard
from .assertions import ConformanceFailure
from .case import Case
from .connector import Shard, allocate_shard, assert_shards_equal, cache_origin, model_kv
from .placement import Placement, place


@dataclasses.dataclass(frozen=True)
class DeviceJob:
    """One resharding: the backend by registry name, the producer's and the consumer's layout
    (``era:alias``), the model geometry (its ``num_kv_heads`` is replaced per rank), the model's
    KV heads, the producer's and consumer's block ids, the seed, and the repro line of the check."""

    backend: str
    producer_layout: str
    consumer_layout: str
    geometry: R.Geometry
    total_heads: int
    producer_tp: int
    consumer_tp: int
    producer_blocks: tuple[int, ...]
    consumer_blocks: tuple[int, ...]
    seed: int = 0
    repro: str = ""

    def __post_init__(self):
        # Regions come in address order: producer and consumer blocks pair up only when both ascend.
        if list(self.producer_blocks) != sorted(self.producer_blocks) or list(self.consumer_blocks) != sorted(self.consumer_blocks):
            raise ValueError(f"block ids must ascend on both sides: {self.producer_blocks} → {self.consumer_blocks}")

    @property
    def name(self) -> str:
        wire = "" if self.producer_layout == self.consumer_layout else f" into {self.consumer_layout}"
        return f"TP {self.producer_tp}→{self.consumer_tp} over {self.total_heads} heads, {self.producer_layout}{wire}"


@dataclasses.dataclass(frozen=True)
class ConsumerReport:
    rank: int
    device: str
    heads: tuple[int, int]  # model heads [start, stop)
    bytes_received: int
    seconds: float
    modes: tuple[str, ...]  # the plans' modes: regions, wire
    failure: str | None = None  # None: its arenas equal the reference's bit for bit

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclasses.dataclass(frozen=True)
class JobReport:
    job: DeviceJob
    placement: str
    engine: str  # nccl, or gloo (the wire through host memory)
    consumers: tuple[ConsumerReport, ...]
    seconds: float  # the transfer, first send to last receive, the slowest device process

    @property
    def bytes_moved(self) -> int:
        return sum(c.bytes_received for c in self.consumers)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_moved / self.seconds if self.seconds > 0 else 0.0

    @property
    def failures(self) -> list[ConsumerReport]:
        return [c for c in self.consumers if not c.ok]


ORACLE_CHANGED = -1  # a device process's answer in place of a job number


class DevicesFailed(RuntimeError):
    """A device process raised or gave no result: the transfer did not happen (not a finding on bytes)."""


# ----------------------------------------------------------------------------- one device process
def _layout(backend, name: str) -> R.Layout:
    return next(lay for lay in backend.capabilities.layouts if f"{lay.era}:{lay.alias}" == name)


def _send_tensor(t: torch.Tensor, dst: int, wire: str) -> None:
    """``wire``: where the communicator takes its tensors (the GPU for NCCL, host memory for gloo)."""
    dist.send(torch.tensor([t.numel()], dtype=torch.int64, device=wire), dst=dst)
    if t.numel():
        dist.send(t.to(wire).contiguous(), dst=dst)


def _recv_tensor(src: int, wire: str) -> torch.Tensor:
    size = torch.zeros(1, dtype=torch.int64, device=wire)
    dist.recv(size, src=src)
    out = torch.zeros(int(size), dtype=torch.uint8, device=wire)
    if out.numel():
        dist.recv(out, src=src)
    return out


class _Ranks:
    """The logical ranks one device process hosts for one job: their shards, descriptors and plans."""

    def __init__(self, job: DeviceJob, placement: Placement, index: int):
        from kvconform.backends_under_test import registry

        self.job, self.placement, self.index = job, placement, index
        self.device = placement.devices[index]
        loaded = registry.load(job.backend)
        if loaded.backend is None:
            raise RuntimeError(f"backend {job.backend} did not load in device process {index}: {loaded.error or loaded.unavailable}")
        # The backend's code runs here as in the suite's process: after its import and after each op
        # the oracle is checked, and its ops get copies of their inputs.
        oracle_guard.verify(f"the import of backend {job.backend} in device process {index}")
        self.backend = loaded.backend
        oracle_guard.guard_ops(self.backend)
        layouts = {side: _layout(self.backend, name) for side, name in (("p", job.producer_layout), ("c", job.consumer_layout))}
        self.case = Case(backend=self.backend, layout=layouts["p"], device=self.device, seed=job.seed, standard="e1",
                         test_id="", repro=job.repro)
        kv = model_kv(job.geometry, len(job.producer_blocks), job.total_heads, job.seed + job.total_heads)
        self.shards: dict[tuple[str, int], Shard] = {}
        self.expected: dict[int, Shard] = {}
        self.before: dict[int, Shard] = {}
        for side, tp, ranks in (("p", job.producer_tp, placement.producer_ranks_on(index)), ("c", job.consumer_tp, placement.consumer_ranks_on(index))):
            for rank in ranks:
                heads = R.connector.rank_heads(job.total_heads, tp, rank)
                g = dataclasses.replace(job.geometry, num_kv_heads=len(heads))
                shard = allocate_shard(self.case, layouts[side], g, seed_offset=(10 if side == "p" else 1000) + 10 * rank)
                if side == "p":
                    shard.place(list(job.producer_blocks), kv[:, :, :, :, heads.start:heads.stop])
                else:
                    self.before[rank], self.expected[rank] = shard.snapshot(), shard.snapshot()
                    self.expected[rank].place(list(job.consumer_blocks), kv[:, :, :, :, heads.start:heads.stop])
                self.shards[(side, rank)] = shard
        self.layer_groups = next(iter(self.shards.values())).layers  # the same layer grouping on both sides (connector_layouts)

    def descriptors(self) -> dict[tuple[str, int], dict]:
        job, out = self.job, {}
        for (side, rank), shard in self.shards.items():
            tp = job.producer_tp if side == "p" else job.consumer_tp
            arena = shard.arenas[0]
            out[(side, rank)] = self.backend.layout_descriptor(arena.cache, arena.spec, tp_rank=rank, tp_size=tp, total_kv_heads=job.total_heads,
                                                               k_scale=1.0, v_scale=1.0)
        return out

    def plan(self, consumer: dict, producer: dict) -> compat.Verdict:
        """The consumer's verdict on the producer: its backend's own handshake where declared."""
        if "handshake" in self.backend.capabilities.ops:
            return self.backend.handshake(consumer, producer)
        return compat.check(producer, consumer)


def _regions(ranks: _Ranks, arena, blocks, heads) -> list[tuple[int, int]]:
    """Byte regions from the arena's region start: the backend's own op where it declares one."""
    if "regions" in ranks.backend.capabilities.ops:
        return sorted((offset + cache_origin(arena), length) for offset, length in ranks.backend.block_regions(arena.cache, arena.spec, blocks, heads))
    return R.connector.byte_regions(arena.spec.layout, arena.spec.geometry, blocks, heads)


@dataclasses.dataclass
class _Step:
    """One slice of one layer arena, producer rank → consumer rank; ``index``: this process's
    side's byte indices in regions mode (computed at handshake, as a connector registers regions)."""

    consumer: int
    plan: compat.Plan
    piece: R.connector.HeadSlice
    arena: int
    index: torch.Tensor | None = None


def _steps(ranks: _Ranks, descriptors: dict, failures: dict) -> list[_Step]:
    """Every step of the job in the one order every device process derives from the plans; a
    refused handshake fails the consumer rank on its own process."""
    job, placement, steps = ranks.job, ranks.placement, []
    for c in range(job.consumer_tp):
        mine = placement.consumers[c] == ranks.index
        for p in range(job.producer_tp):
            verdict = ranks.plan(descriptors[("c", c)], descriptors[("p", p)])
            if not verdict.compatible:
                if mine:
                    failures.setdefault(c, f"handshake with producer rank {p} refused: {verdict.reason}")
                continue
            for piece in verdict.plan.slices:
                for arena in range(len(ranks.layer_groups)):
                    step = _Step(c, verdict.plan, piece, arena)
                    if verdict.plan.mode == "regions" and placement.producers[piece.producer_rank] == ranks.index:
                        step.index = _region_index(ranks, ranks.shards[("p", piece.producer_rank)].arenas[arena], job.producer_blocks, piece.producer_heads)
                    elif verdict.plan.mode == "regions" and mine:
                        step.index = _region_index(ranks, ranks.shards[("c", c)].arenas[arena], job.consumer_blocks, piece.consumer_heads)
                    steps.append(step)
    return steps


def _region_index(ranks: _Ranks, arena, blocks, heads) -> torch.Tensor:
    return R.connector.region_bytes(_regions(ranks, arena, list(blocks), heads), arena.region.device)


def _payload(ranks: _Ranks, step: _Step) -> torch.Tensor:
    arena = ranks.shards[("p", step.piece.producer_rank)].arenas[step.arena]
    if step.index is not None:
        return arena.region[step.index]
    blocks, heads = list(ranks.job.producer_blocks), step.piece.producer_heads
    if "wire" in ranks.backend.capabilities.ops:
        return ranks.backend.export_blocks(arena.cache, arena.spec, blocks, heads).data
    return R.connector.export_blocks(arena.region, arena.spec.layout, arena.spec.geometry, blocks, heads).data


def _land(ranks: _Ranks, step: _Step, payload: torch.Tensor) -> None:
    """One slice's bytes into the consumer arena: its regions, or its import of the (converted) wire."""
    arena, plan, s = ranks.shards[("c", step.consumer)].arenas[step.arena], step.plan, step.piece
    if step.index is not None:
        if step.index.numel() != payload.numel():
            raise ValueError(f"received {payload.numel()} bytes for heads {s.consumer_heads.start}..{s.consumer_heads.stop - 1}, "
                             f"whose regions hold {step.index.numel()}")
        arena.region[step.index] = payload
        return
    blocks = list(ranks.job.consumer_blocks)
    producer_spec = dataclasses.replace(arena.spec, layout=plan.producer.layout, geometry=plan.producer.geometry)
    wire_g = R.connector.wire_geometry(plan.producer.geometry, len(blocks), len(s.producer_heads))
    wire = compat.convert_wire(R.connector.Wire(payload, ranks.backend.wire_layout(producer_spec), wire_g), arena.spec.geometry.dtype, plan.ratios)
    if "wire" in ranks.backend.capabilities.ops:
        ranks.backend.import_blocks(arena.cache, arena.spec, blocks, wire, s.consumer_heads)
    else:
        R.connector.import_blocks(arena.region, arena.spec.layout, arena.spec.geometry, blocks, wire, s.consumer_heads)


def _transfer(job: DeviceJob, placement: Placement, index: int, wire: str) -> dict:
    """This device process's side of one job: its ranks' shards, the handshake, the sends and
    receives (timed: the region indices are computed before, at handshake), the comparison."""
    ranks = _Ranks(job, placement, index)
    gathered: list = [None] * len(placement.devices)
    dist.all_gather_object(gathered, ranks.descriptors())  # the handshake: every process sees every rank's layout
    descriptors = {key: d for part in gathered for key, d in part.items()}
    received = {c: 0 for c in placement.consumer_ranks_on(index)}
    modes: dict[int, set] = {c: set() for c in received}
    failures: dict[int, str] = {}
    seconds: dict[int, float] = {}
    steps = _steps(ranks, descriptors, failures)
    dist.barrier()
    start = time.perf_counter()
    for number, step in enumerate(steps):
        if placement.producers[step.piece.producer_rank] == index:
            _send_tensor(_payload(ranks, step), placement.consumers[step.consumer], wire)
        elif step.consumer in received:
            payload = _recv_tensor(placement.producers[step.piece.producer_rank], wire).to(ranks.device)
            received[step.consumer] += payload.numel()
            modes[step.consumer].add(step.plan.mode)
            try:
                _land(ranks, step, payload)
            except Exception as exc:  # noqa: BLE001 - a backend op that raised fails this consumer rank, the stream goes on
                failures.setdefault(step.consumer, f"landing the slice from producer rank {step.piece.producer_rank} raised {type(exc).__name__}: {exc}")
            if number + 1 == len(steps) or steps[number + 1].consumer != step.consumer:
                if ranks.device.startswith("cuda"):
                    torch.cuda.synchronize(ranks.device)
                seconds[step.consumer] = time.perf_counter() - start
    if ranks.device.startswith("cuda"):
        torch.cuda.synchronize(ranks.device)
    elapsed = time.perf_counter() - start
    out = {"seconds": elapsed, "consumers": {}}
    for c in received:
        heads = R.connector.rank_heads(job.total_heads, job.consumer_tp, c)
        note = (f"TP {job.producer_tp}→{job.consumer_tp}: consumer rank {c} on {ranks.device} (device process {index}), "
                f"model heads {heads.start}..{heads.stop - 1} of {job.total_heads}, from blocks {list(job.producer_blocks)} into {list(job.consumer_blocks)}")
        if c not in failures:
            try:
                assert_shards_equal("connector", ranks.case, ranks.expected[c], ranks.shards[("c", c)], note, initial=ranks.before[c])
            except ConformanceFailure as exc:
                failures[c] = str(exc)
        else:
            failures[c] = f"{note}: {failures[c]}"
        out["consumers"][c] = ConsumerReport(c, ranks.device, (heads.start, heads.stop), received[c], seconds.get(c, elapsed),
                                             tuple(sorted(modes[c])), failures.get(c))
    return out


def _device_process(index: int, devices: tuple[str, ...], engine: str, jobs: tuple[DeviceJob, ...], port: int, results) -> None:
    try:
        oracle_guard.install()  # spawned: the oracle before the backend's import; forked: the parent's record
        device = devices[index]
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
        else:
            torch.set_num_threads(1)  # a forked child must not enter the parent's OpenMP pool (it can hang)
        dist.init_process_group(engine, init_method=f"tcp://127.0.0.1:{port}", rank=index, world_size=len(devices), timeout=timedelta(seconds=120))
        for number, job in enumerate(jobs):
            results.put((index, number, _transfer(job, place(job.producer_tp, job.consumer_tp, devices), index, device if engine == "nccl" else "cpu")))
        dist.barrier()
    except oracle_guard.OracleChanged as exc:  # the parent raises it again: a void result, never a known failure
        results.put((index, ORACLE_CHANGED, str(exc)))
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the run
        results.put((index, None, traceback.format_exc()[-2000:]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reap(procs, grace: float) -> None:
    """Join each process, killing one still alive after ``grace`` seconds."""
    for p in procs:
        p.join(timeout=grace)
        if p.is_alive():
            p.kill()
            p.join()


def engine_for(devices) -> str:
    """NCCL between distinct GPUs; gloo otherwise: the CPU stand-in, and one GPU listed twice (NCCL
    refuses two ranks on one GPU; the wire is staged through host memory instead)."""
    distinct_gpus = all(str(d).startswith("cuda") for d in devices) and len({torch.device(d) for d in devices}) == len(devices)
    return "nccl" if distinct_gpus else "gloo"


def run_on_devices(jobs, devices, engine: str | None = None, timeout: float = 300.0) -> list[JobReport]:
    """Run the jobs in one process per device (started once, reused for every job); always reaps them.
    Raises :class:`DevicesFailed` when a device process raised or did not answer in time."""
    jobs, devices = tuple(jobs), tuple(devices)
    engine = engine or engine_for(devices)
    placements = [place(job.producer_tp, job.consumer_tp, devices) for job in jobs]  # CannotPlace before any process starts
    # Fork where no GPU is in use (the CPU stand-in: ~0.1 s a process instead of a fresh Python
    # importing torch, 4-8 s on a loaded 2-core machine); CUDA and NCCL need fresh processes.
    forkable = all(str(d).startswith("cpu") for d in devices) and not torch.cuda.is_initialized()
    ctx = mp.get_context("fork" if forkable else "spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_device_process, args=(i, devices, engine, jobs, port, results), daemon=True)
             for i in range(len(devices))]
    with warnings.catch_warnings():
        # Python 3.12 warns at each fork of a process with threads (torch's pool): the fork comes
        # while the pool is idle (the check waits here), and the child leaves the pool at once
        # (_device_process). Unfiltered, a certified CPU run printed 24 such warnings.
        warnings.filterwarnings("ignore", r"This process .* is multi-threaded, use of fork\(\)", DeprecationWarning)
        for p in procs:
            p.start()
    got: dict[tuple[int, int], dict] = {}
    deadline = time.perf_counter() + timeout
    try:
        while len(got) < len(jobs) * len(devices) and time.perf_counter() < deadline:
            try:
                index, number, out = results.get(timeout=1.0)
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    break
                continue
            if number == ORACLE_CHANGED:
                raise oracle_guard.OracleChanged(f"in device process {index} ({devices[index]}): {out}")
            if number is None:
                raise DevicesFailed(f"device process {index} ({devices[index]}) raised:\n{out}")
            got[(index, number)] = out
    finally:
        reap(procs, 10)
    missing = [(i, n) for n in range(len(jobs)) for i in range(len(devices)) if (i, n) not in got]
    if missing:
        raise DevicesFailed(f"device processes gave no result for (process, job) {missing[:4]} within {timeout:.0f} s "
                            f"(exit codes {[p.exitcode for p in procs]})")
    reports = []
    for number, (job, placement) in enumerate(zip(jobs, placements)):
        consumers = {c: r for i in range(len(devices)) for c, r in got[(i, number)]["consumers"].items()}
        reports.append(JobReport(job, placement.describe(), engine, tuple(consumers[c] for c in range(job.consumer_tp)),
                                 max(got[(i, number)]["seconds"] for i in range(len(devices)))))
    return reports


# ----------------------------------------------------------------------------- what a check asks
def declared_model_heads(backend, producer_tp: int, consumer_tp: int) -> int | None:
    """The most KV heads a model can have such that both sides' per-rank counts are declared (None: none)."""
    declared = set(backend.capabilities.num_kv_heads)

    def per_rank(total: int, tp: int) -> int | None:
        try:
            return len(R.connector.rank_heads(total, tp, 0))
        except ValueError:
            return None

    fits = [t for t in range(1, max(declared) * max(producer_tp, consumer_tp) + 1) if {per_rank(t, producer_tp), per_rank(t, consumer_tp)} <= declared]
    return max(fits) if fits else None


def report_lines(report: JobReport) -> list[str]:
    """One line per consumer rank: device, heads, bytes, seconds; then the transfer's bytes/s."""
    staged = "" if report.engine == "nccl" else ", staged through host memory"
    lines = [f"{report.job.name} on {report.placement} ({report.engine}{staged}):"]
    lines += [f"  consumer rank {c.rank} on {c.device}: model heads {c.heads[0]}..{c.heads[1] - 1}, {c.bytes_received} B received "
              f"({'/'.join(c.modes) or 'nothing'}) in {c.seconds:.4f} s: {'bit for bit' if c.ok else 'WRONG'}" for c in report.consumers]
    lines.append(f"  {report.bytes_moved} B in {report.seconds:.4f} s: {report.bytes_per_second / 1e6:.1f} MB/s")
    return lines


def assert_consumers_hold_their_heads(prop: str, case: Case, report: JobReport) -> None:
    """Every consumer rank's arenas equal the reference's after the transfer between devices."""
    if not report.failures:
        return
    lines = [f"{prop}: resharding between devices, {report.job.name}: {len(report.failures)} of {len(report.consumers)} consumer ranks "
             f"do not hold their heads bit for bit ({report.placement})", *report_lines(report)[1:]]
    lines += [f.failure for f in report.failures]
    raise ConformanceFailure("\n".join(lines), {"property": prop, "mismatches": [
        {"where": f"consumer rank {f.rank} on {f.device} (model heads {f.heads[0]}..{f.heads[1] - 1})", "expected": "its heads",
         "actual": f.failure.splitlines()[0][:300]} for f in report.failures]})
