"""Live KV transfer between processes over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

Pairs: rank 0 writes KV with backend A and ships each written block's bytes — one region per
block when A's layout is block-compact, one region per K/V run otherwise — as a connector would.
Rank 1 lands the regions at the same offsets of a staging copy of A's cache, converts (layout
through canonical block bytes; e4m3fn → e4m3fnuz with vLLM's doubled scale) into backend B's
cache, and checks B's own decode over the received blocks against SDPA on the KV that was sent.

Resharding: P producer ranks and C consumer ranks of one model (different TP sizes). Each rank
writes or allocates its own heads, all ranks exchange kvconform.compat layout descriptors (the
handshake), and every consumer rank receives, from each producer rank that holds some of its
heads, exactly the transfer the compat plan names — region to region when the layouts agree,
the canonical wire form otherwise — then checks its own decode over its own heads.

Between devices (issue #41): ``python -m kvconform.transfer devices [cuda:0,cuda:1 | cpu,cpu]``
runs TP 1→2, 2→1, 2→4, 4→2 with producer ranks on the first half of the devices and consumer ranks
on the second, one process per device (conformance/harness/device_transfer.py, which the check
CONN-RESHARD-DEVICES runs too), every consumer rank compared bit for bit with the reference, and
prints each consumer rank's device, heads, bytes, seconds and the transfer's bytes per second.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from kvconform import reference as R
from kvconform.conformance.harness.device_transfer import DeviceJob, free_port, reap, report_lines, run_on_devices

TOKENS, SEED = 37, 7
FIRST_BLOCK = 2


@dataclasses.dataclass(frozen=True)
class Side:
    backend: str
    layout: str  # "era:alias" of one of the backend's declared layouts
    kv_cache_dtype: str = "auto"


@dataclasses.dataclass(frozen=True)
class Pair:
    name: str
    sender: Side
    receiver: Side
    wrong_plane: bool = False  # a faulty sender that ships V's bytes where K's belong


PAIRS = (
    Pair("same-backend", Side("reference", "E1:NHD"), Side("reference", "E1:NHD")),
    Pair("NHD-to-HND", Side("reference", "E1:NHD"), Side("reference", "E1:HND")),
    Pair("blocks-first-to-shuffled", Side("reference", "E1:NHD"), Side("reference", "AITER:shuffle-blocks_first")),
    Pair("fn-to-fnuz", Side("reference", "E1:NHD", "fp8"), Side("reference_gfx942", "E1:NHD", "fp8")),
    Pair("kv-first-planes-to-blocks-first", Side("reference_kv_first", "E0:NHD"), Side("reference", "E1:NHD")),
)


def _setup(side: Side, device: str = "cpu"):
    from kvconform.backends_under_test import registry
    from kvconform.backends_under_test.contract import CacheSpec

    backend = registry.load(side.backend).backend
    layout = next(lay for lay in backend.capabilities.layouts if f"{lay.era}:{lay.alias}" == side.layout)
    dtype = backend.cache_dtype(side.kv_cache_dtype, torch.bfloat16)
    g = R.Geometry(num_blocks=FIRST_BLOCK + 4, block_size=16, num_kv_heads=2, head_size=64, dtype=dtype)
    scale = 2.0 if dtype == torch.float8_e4m3fnuz else 1.0  # vLLM doubles checkpoint scales on fnuz
    spec = CacheSpec(layout=layout, geometry=g, kv_cache_dtype=side.kv_cache_dtype, model_dtype=torch.bfloat16)
    buffer = torch.zeros(layout.nbytes(g), dtype=torch.uint8, device=device)
    scales = torch.tensor([0.5 * scale], device=device), torch.tensor([0.25 * scale], device=device)
    return backend, spec, buffer, backend.allocate(buffer, spec), *scales


def _kv():
    gen = torch.Generator().manual_seed(SEED)
    key, value = (torch.randn(2, TOKENS, 2, 64, generator=gen)).to(torch.bfloat16).unbind(0)
    slots = torch.arange(TOKENS) + FIRST_BLOCK * 16  # one sequence: blocks 2, 3, 4
    return key, value, slots


def _regions(spec, blocks) -> list[tuple[int, int]]:
    """Byte regions a connector registers for these blocks (one per block if block-compact)."""
    omap = R.offset_map(spec.layout, spec.geometry)
    return [run for b in blocks for run in R.block_byte_runs(omap, spec.geometry.element_size, 0, b)]


def _send(pair: Pair, blocks, device: str) -> dict:
    backend, spec, buffer, cache, k_scale, v_scale = _setup(pair.sender, device)
    key, value, slots = (t.to(device) for t in _kv())
    backend.write(cache, key, value, slots, spec, k_scale=k_scale, v_scale=v_scale)
    regions = _regions(spec, blocks)
    payloads = [buffer[start:end].clone() for start, end in regions]
    if pair.wrong_plane:  # ship V's bytes in K's place: the second half of each page over the first
        payloads = [torch.cat([p[len(p) // 2:], p[len(p) // 2:]]) for p in payloads]
    header = json.dumps({"regions": regions, "k_scale": float(k_scale), "v_scale": float(v_scale)}).encode()
    dist.send(torch.tensor([len(header)], device=device), dst=1)
    dist.send(torch.frombuffer(bytearray(header), dtype=torch.uint8).to(device), dst=1)
    for payload in payloads:
        dist.send(payload, dst=1)
    return {"regions": len(regions), "bytes": sum(end - start for start, end in regions)}


def _receive(pair: Pair, blocks, device: str) -> dict:
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src=0)
    raw = torch.zeros(int(size), dtype=torch.uint8, device=device)
    dist.recv(raw, src=0)
    header = json.loads(bytes(raw.cpu().tolist()).decode())
    _, a_spec, a_buffer, _, _, _ = _setup(pair.sender, device)  # A's layout, for the staging copy
    for start, end in header["regions"]:
        region = torch.zeros(end - start, dtype=torch.uint8, device=device)
        dist.recv(region, src=0)
        a_buffer[start:end] = region
    backend, spec, buffer, cache, k_scale, v_scale = _setup(pair.receiver, device)
    canonical = R.canonical_block_bytes(a_buffer, a_spec.layout, a_spec.geometry, blocks)
    if a_spec.geometry.dtype != spec.geometry.dtype:
        ratio = header["k_scale"] / float(k_scale)
        if ratio != header["v_scale"] / float(v_scale):
            raise ValueError("k and v scale ratios differ between sender and receiver")
        converted, exact = R.fp8.convert_codes(canonical.flatten(), str(a_spec.geometry.dtype)[6:], str(spec.geometry.dtype)[6:], ratio)
        if not bool(exact.all()):
            return {"ok": False, "why": f"fp8 conversion inexact on {int((~exact).sum())} elements"}
        canonical = converted.view_as(canonical)
    R.place_canonical_block_bytes(buffer, spec.layout, spec.geometry, blocks, canonical)
    key, value, _ = _kv()
    query = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(SEED + 1)).to(torch.bfloat16)
    table = torch.tensor([blocks], device=device)
    got = backend.decode(cache, query.to(device), table, torch.tensor([TOKENS], device=device), spec, scale=64 ** -0.5, k_scale=k_scale, v_scale=v_scale).cpu()
    sent = [R.ops.stored_values(t, a_spec.geometry, s, 1) for t, s in ((key, header["k_scale"]), (value, header["v_scale"]))]
    want = F.scaled_dot_product_attention(query[0].float()[:, None], *(t.transpose(0, 1).repeat_interleave(2, 0) for t in sent))[:, 0]
    err = float((got[0].float() - want).abs().max())
    return {"ok": err <= 2e-2, "max_abs_err": err}


@contextlib.contextmanager
def _rank(rank: int, world: int, engine: str, port: int, results):
    """One rank's process group, on its device; whatever the rank raises is reported to the
    parent, which fails the check."""
    try:
        device = f"cuda:{rank}" if engine == "nccl" else "cpu"
        if engine == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(engine, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        yield device
    except Exception:  # noqa: BLE001 - reported to the parent
        results.put((rank, {"ok": False, "why": traceback.format_exc()[-1500:]}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _timed(rank: int, results, transfer) -> None:
    """Run this rank's side of a transfer; report its outcome once every rank is done."""
    start = time.perf_counter()
    out = transfer()
    dist.barrier()
    results.put((rank, {**out, "seconds": time.perf_counter() - start}))


def _pair_worker(rank: int, pair: Pair, engine: str, port: int, results) -> None:
    with _rank(rank, 2, engine, port, results) as device:
        blocks = sorted({int(s) // 16 for s in _kv()[2].tolist()})
        _timed(rank, results, lambda: _send(pair, blocks, device) if rank == 0 else _receive(pair, blocks, device))


def _run_processes(worker, world: int, args: tuple, timeout: float) -> tuple[dict, list, float]:
    """``worker(rank, *args, port, results, engine)`` in ``world`` fresh processes; always reaps them.
    Returns each rank's result, the exit codes, and the wall time."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(rank, *args, port, results), daemon=True) for rank in range(world)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < world and time.perf_counter() - start < timeout:
            try:
                rank, out = results.get(timeout=1.0)
                got[rank] = out
            except Exception:  # queue.Empty: keep waiting while they may still answer
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        reap(procs, 5)
    return got, [p.exitcode for p in procs], time.perf_counter() - start


def run_pair(pair: Pair, timeout: float = 120.0, engine: str = "gloo") -> dict:
    """Run one transfer in two fresh processes (gloo: CPU; nccl: GPUs 0 and 1); always reaps them.
    Returns the receiver's verdict."""
    got, codes, wall = _run_processes(_pair_worker, 2, (pair, engine), timeout)
    verdict = got.get(1, {"ok": False, "why": f"receiver gave no result within {timeout:.0f} s (exit codes {codes})"})
    return {**verdict, "sender": got.get(0), "wall_s": wall}


# ----------------------------------------------------------------------------- TP resharding
MODEL_HEADS, HEAD_SIZE = 4, 64


@dataclasses.dataclass(frozen=True)
class Reshard:
    name: str
    producer: Side
    consumer: Side
    producer_tp: int
    consumer_tp: int
    wrong_heads: bool = False  # a faulty producer that ships the next head's bytes for each slice


RESHARDS = (
    Reshard("tp1-to-tp2 HND (regions)", Side("reference", "E1:HND"), Side("reference", "E1:HND"), 1, 2),
    Reshard("tp2-to-tp1 NHD-to-HND (wire)", Side("reference", "E1:NHD"), Side("reference", "E1:HND"), 2, 1),
    Reshard("tp1-to-tp2 fn-to-fnuz shuffled (wire)", Side("reference", "E1:NHD", "fp8"), Side("reference_gfx942", "AITER:shuffle-blocks_first", "fp8"), 1, 2),
)


def _rank_setup(side: Side, tp: int, rank: int, device: str):
    """One rank's cache: its share of the model's heads, zero-filled; its scales (doubled on fnuz)."""
    from kvconform.backends_under_test import registry
    from kvconform.backends_under_test.contract import CacheSpec

    backend = registry.load(side.backend).backend
    layout = next(lay for lay in backend.capabilities.layouts if f"{lay.era}:{lay.alias}" == side.layout)
    dtype = backend.cache_dtype(side.kv_cache_dtype, torch.bfloat16)
    heads = R.connector.rank_heads(MODEL_HEADS, tp, rank)
    g = R.Geometry(num_blocks=FIRST_BLOCK + 4, block_size=16, num_kv_heads=len(heads), head_size=HEAD_SIZE, dtype=dtype)
    factor = 2.0 if dtype == torch.float8_e4m3fnuz else 1.0
    spec = CacheSpec(layout=layout, geometry=g, kv_cache_dtype=side.kv_cache_dtype, model_dtype=torch.bfloat16)
    buffer = torch.zeros(layout.nbytes(g), dtype=torch.uint8, device=device)
    scales = torch.tensor([0.5 * factor], device=device), torch.tensor([0.25 * factor], device=device)
    return backend, spec, heads, buffer, backend.allocate(buffer, spec), *scales


def _model_kv():
    """The whole model's K and V ``[T, MODEL_HEADS, D]`` and the sequence's slots (blocks 2, 3, 4)."""
    gen = torch.Generator().manual_seed(SEED)
    key, value = torch.randn(2, TOKENS, MODEL_HEADS, HEAD_SIZE, generator=gen).to(torch.bfloat16).unbind(0)
    return key, value, torch.arange(TOKENS) + FIRST_BLOCK * 16


def _send_tensor(t: torch.Tensor, dst: int, device: str) -> None:
    dist.send(torch.tensor([t.numel()], device=device), dst=dst)
    dist.send(t.to(device).contiguous(), dst=dst)


def _recv_tensor(src: int, device: str) -> torch.Tensor:
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src=src)
    out = torch.zeros(int(size), dtype=torch.uint8, device=device)
    dist.recv(out, src=src)
    return out


def _slice_regions(backend, cache, buffer, spec, blocks, heads):
    """Byte regions from the buffer start: the backend's own op where it declares one."""
    if "regions" in backend.capabilities.ops:
        origin = cache.data_ptr() - buffer.data_ptr()
        return [(offset + origin, length) for offset, length in sorted(backend.block_regions(cache, spec, blocks, heads))]
    return R.connector.byte_regions(spec.layout, spec.geometry, blocks, heads)


def _produce(job: Reshard, rank: int, setup, descriptors, blocks, device: str) -> dict:
    from kvconform import compat

    backend, spec, heads, buffer, cache, k_scale, v_scale = setup
    key, value, slots = _model_kv()
    backend.write(cache, key[:, heads.start:heads.stop].to(device), value[:, heads.start:heads.stop].to(device), slots.to(device), spec, k_scale=k_scale, v_scale=v_scale)
    sent = 0
    for c, consumer in enumerate(descriptors[job.producer_tp:]):
        plan = compat.check(descriptors[rank], consumer).plan
        for s in plan.slices if plan else ():
            ship = [(h + 1) % len(heads) for h in s.producer_heads] if job.wrong_heads else s.producer_heads
            if plan.mode == "regions":
                payload = buffer[R.connector.region_bytes(_slice_regions(backend, cache, buffer, spec, blocks, ship), buffer.device)]
            else:
                payload = (backend.export_blocks(cache, spec, blocks, ship) if "wire" in backend.capabilities.ops
                           else R.connector.export_blocks(buffer, spec.layout, spec.geometry, blocks, ship)).data
            _send_tensor(payload, job.producer_tp + c, device)
            sent += payload.numel()
    return {"bytes_sent": sent}


def _consume(job: Reshard, rank: int, setup, descriptors, blocks, device: str) -> dict:
    from kvconform import compat

    backend, spec, heads, buffer, cache, k_scale, v_scale = setup
    own = descriptors[job.producer_tp + rank]
    verdicts = [compat.check(d, own) for d in descriptors[: job.producer_tp]]
    refused = next((v for v in verdicts if not v.compatible), None)
    if refused:
        return {"ok": False, "why": f"handshake refused: {refused.reason}"}
    received, modes = 0, set()
    for p, verdict in enumerate(verdicts):
        plan = verdict.plan
        for s in plan.slices:
            payload = _recv_tensor(p, device)
            received += payload.numel()
            modes.add(plan.mode)
            if plan.mode == "regions":
                buffer[R.connector.region_bytes(_slice_regions(backend, cache, buffer, spec, blocks, s.consumer_heads), buffer.device)] = payload
                continue
            wire_g = R.connector.wire_geometry(plan.producer.geometry, len(blocks), len(s.producer_heads))
            wire = compat.convert_wire(R.connector.Wire(payload, R.connector.CANONICAL_WIRE, wire_g), spec.geometry.dtype, plan.ratios)
            if "wire" in backend.capabilities.ops:
                backend.import_blocks(cache, spec, blocks, wire, s.consumer_heads)
            else:
                R.connector.import_blocks(buffer, spec.layout, spec.geometry, blocks, wire, s.consumer_heads)
    key, value, _ = _model_kv()
    h = len(heads)
    query = torch.randn(1, 2 * MODEL_HEADS, HEAD_SIZE, generator=torch.Generator().manual_seed(SEED + 1)).to(torch.bfloat16)[:, 2 * heads.start: 2 * heads.stop]
    got = backend.decode(cache, query.to(device), torch.tensor([blocks], device=device), torch.tensor([TOKENS], device=device), spec,
                         scale=HEAD_SIZE ** -0.5, k_scale=k_scale, v_scale=v_scale).cpu()
    producer = compat.parse(descriptors[0])  # every producer rank announces the same scales
    sent = [R.ops.stored_values(t[:, heads.start:heads.stop], dataclasses.replace(producer.geometry, num_kv_heads=h), producer.scale(kv), 1)
            for kv, t in enumerate((key, value))]
    want = F.scaled_dot_product_attention(query[0].float()[:, None], *(t.transpose(0, 1).repeat_interleave(2, 0) for t in sent))[:, 0]
    err = float((got[0].float() - want).abs().max())
    return {"ok": err <= 2e-2, "max_abs_err": err, "bytes_received": received, "modes": sorted(modes), "heads": [heads.start, heads.stop]}


def _reshard_worker(rank: int, job: Reshard, engine: str, port: int, results) -> None:
    world = job.producer_tp + job.consumer_tp
    with _rank(rank, world, engine, port, results) as device:
        producer = rank < job.producer_tp
        side, tp, local = (job.producer, job.producer_tp, rank) if producer else (job.consumer, job.consumer_tp, rank - job.producer_tp)
        setup = _rank_setup(side, tp, local, device)
        backend, spec, _, _, cache, k_scale, v_scale = setup
        announced = backend.layout_descriptor(cache, spec, tp_rank=local, tp_size=tp, total_kv_heads=MODEL_HEADS, k_scale=float(k_scale), v_scale=float(v_scale))
        descriptors = [None] * world
        dist.all_gather_object(descriptors, announced)  # the handshake: every rank sees every rank's layout
        blocks = sorted({int(s) // 16 for s in _model_kv()[2].tolist()})
        _timed(rank, results, lambda: (_produce if producer else _consume)(job, local, setup, descriptors, blocks, device))


def run_reshard(job: Reshard, timeout: float = 180.0, engine: str = "gloo") -> dict:
    """Run one resharding transfer in ``producer_tp + consumer_tp`` fresh processes. ``ok`` when
    every consumer rank's own decode over its own heads matches SDPA on the model's KV."""
    got, codes, wall = _run_processes(_reshard_worker, job.producer_tp + job.consumer_tp, (job, engine), timeout)
    consumers = [got.get(job.producer_tp + c, {"ok": False, "why": f"consumer rank {c} gave no result within {timeout:.0f} s (exit codes {codes})"})
                 for c in range(job.consumer_tp)]
    producers = [got.get(p) for p in range(job.producer_tp)]
    failed_producer = next((p for p in producers if p is None or "why" in p), None)
    ok = all(c.get("ok") for c in consumers) and failed_producer is None
    return {"ok": ok, "consumers": consumers, "producers": producers, "wall_s": wall}


DEVICE_TP_CHANGES = ((1, 2), (2, 1), (2, 4), (4, 2))


def device_jobs(num_blocks: int = 5, producer_layout: str = "E1:NHD", consumer_layout: str = "E1:NHD", backend: str = "reference") -> list[DeviceJob]:
    """The TP changes between devices over a 4-head model of 3 layers, blocks 2.. of ``num_blocks`` shipped."""
    g = R.Geometry(num_blocks=num_blocks, block_size=16, num_kv_heads=4, head_size=128, dtype=torch.bfloat16, num_layers=3)
    blocks = tuple(range(2, num_blocks))
    return [DeviceJob(backend, producer_layout, consumer_layout, g, 4, p, c, blocks, blocks, SEED) for p, c in DEVICE_TP_CHANGES]


def main_devices(devices: list[str]) -> None:
    for report in run_on_devices(device_jobs(), devices):
        print("\n".join(report_lines(report)))
        for failure in report.failures:
            print(failure.failure)


def main() -> None:
    """``python -m kvconform.transfer [gloo|nccl]``: every pair plus the wrong-plane sender, with timings;
    ``python -m kvconform.transfer devices [LIST]``: the TP changes between devices (default: cpu,cpu)."""
    import sys

    if sys.argv[1:2] == ["devices"]:
        main_devices((sys.argv[2] if len(sys.argv) > 2 else "cpu,cpu").split(","))
        return
    engine = sys.argv[1] if len(sys.argv) > 1 else "gloo"
    print(f"engine {engine}")
    for pair in PAIRS + (dataclasses.replace(PAIRS[0], name="wrong-plane (must fail)", wrong_plane=True),):
        v = run_pair(pair, engine=engine)
        sent = v.get("sender") or {}
        print(f"{pair.name:34s} ok={v['ok']!s:5s} max_abs_err={v.get('max_abs_err', float('nan')):.4g} "
              f"regions={sent.get('regions')} bytes={sent.get('bytes')} receive+verify={v.get('seconds', 0):.3f}s wall={v['wall_s']:.1f}s")
    for job in RESHARDS + (dataclasses.replace(RESHARDS[0], name="tp1-to-tp2 wrong heads (must fail)", wrong_heads=True),):
        v = run_reshard(job, engine=engine)
        ranks = "; ".join(f"rank {c}: ok={r.get('ok')} heads={r.get('heads')} err={r.get('max_abs_err', float('nan')):.4g} "
                          f"{'/'.join(r.get('modes', []))} {r.get('bytes_received')} B" + (f" why={r['why'][-200:]!r}" if "why" in r else "")
                          for c, r in enumerate(v["consumers"]))
        print(f"{job.name:38s} ok={v['ok']!s:5s} {ranks} wall={v['wall_s']:.1f}s")


if __name__ == "__main__":
    main()
