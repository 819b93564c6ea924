"""Live KV transfer between two processes over ``torch.distributed`` (gloo on CPU, NCCL on GPUs).

Rank 0 writes KV with backend A and ships each written block's bytes — one region per block
when A's layout is block-compact, one region per K/V run otherwise — as a connector would.
Rank 1 lands the regions at the same offsets of a staging copy of A's cache, converts (layout
through canonical block bytes; e4m3fn → e4m3fnuz with vLLM's doubled scale) into backend B's
cache, and checks B's own decode over the received blocks against SDPA on the KV that was sent.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from kvconform import reference as R

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


def _worker(rank: int, pair: Pair, port: int, results, engine: str) -> None:
    try:
        device = f"cuda:{rank}" if engine == "nccl" else "cpu"
        if engine == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(engine, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=60))
        blocks = sorted({int(s) // 16 for s in _kv()[2].tolist()})
        start = time.perf_counter()
        out = _send(pair, blocks, device) if rank == 0 else _receive(pair, blocks, device)
        dist.barrier()
        results.put((rank, {**out, "seconds": time.perf_counter() - start}))
    except Exception:  # noqa: BLE001 - reported to the parent, which fails the check
        results.put((rank, {"ok": False, "why": traceback.format_exc()[-1500:]}))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_pair(pair: Pair, timeout: float = 120.0, engine: str = "gloo") -> dict:
    """Run one transfer in two fresh processes (gloo: CPU; nccl: GPUs 0 and 1); always reaps them.
    Returns the receiver's verdict."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(rank, pair, port, results, engine), daemon=True) for rank in range(2)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    got = {}
    try:
        while len(got) < 2 and time.perf_counter() - start < timeout:
            try:
                rank, out = results.get(timeout=1.0)
                got[rank] = out
            except Exception:  # queue.Empty: keep waiting while both may still answer
                if not any(p.is_alive() for p in procs) and results.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    verdict = got.get(1, {"ok": False, "why": f"receiver gave no result within {timeout:.0f} s (exit codes {[p.exitcode for p in procs]})"})
    return {**verdict, "sender": got.get(0), "wall_s": time.perf_counter() - start}


def main() -> None:
    """``python -m conformance.transfer [gloo|nccl]``: every pair plus the wrong-plane sender, with timings."""
    import sys

    engine = sys.argv[1] if len(sys.argv) > 1 else "gloo"
    print(f"engine {engine}")
    for pair in PAIRS + (dataclasses.replace(PAIRS[0], name="wrong-plane (must fail)", wrong_plane=True),):
        v = run_pair(pair, engine=engine)
        sent = v.get("sender") or {}
        print(f"{pair.name:34s} ok={v['ok']!s:5s} max_abs_err={v.get('max_abs_err', float('nan')):.4g} "
              f"regions={sent.get('regions')} bytes={sent.get('bytes')} receive+verify={v.get('seconds', 0):.3f}s wall={v['wall_s']:.1f}s")


if __name__ == "__main__":
    main()
