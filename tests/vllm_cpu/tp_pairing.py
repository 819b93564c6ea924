"""vLLM 0.33.0's own answer to "which producer rank's head lands in each consumer head" — run
with the vLLM venv's Python (``python -m tests.vllm_cpu.tp_pairing``): one JSON document on
stdout, compared with kvconform.compat's plans by tests/test_compat_vllm_pairing.py.

For every valid (total KV heads K, prefill TP P, decode TP D) of the grid and every consumer
(decode) rank d, each connector's mapping functions are called as the connector calls them:

- NIXL (a decode rank reads): ``compute_tp_mapping`` on the decode rank's ``TransferTopology``
  — source ranks, their head slots, the head offset inside a larger remote rank — or the
  refusal ``base_worker.py`` asserts (P > D while the remote replicates heads);
- Mooncake (a prefill rank sends): the decode rank's ``handshake_target_ranks``, each target's
  own ``handshake_target_ranks`` (an unpaired decode rank is refused) and the prefill rank's
  ``_compute_sender_transfer_plan`` (whether it sends, offsets and length, in heads);
- MoRIIO (a prefill rank writes): ``compute_write_tp_mapping`` of every prefill rank.

Each consumer head maps to the list of ``[producer rank, producer-local head]`` that land in
it (one, when the mapping is right). Nothing of kvconform is imported here.
"""

from __future__ import annotations

import json
import os
import sys

HEADS = (1, 2, 4, 6, 8, 16)
TP_SIZES = (1, 2, 4, 8)


def splits(heads: int, tp: int) -> bool:
    """vLLM shards ``heads`` over ``tp`` ranks evenly, or replicates each over ``tp // heads`` ranks."""
    return heads % tp == 0 if tp <= heads else tp % heads == 0


def grid():
    return [(k, p, d) for k in HEADS for p in TP_SIZES for d in TP_SIZES if splits(k, p) and splits(k, d)]


def local_heads(k: int, tp: int) -> int:
    return max(k // tp, 1)


def topology(rank: int, tp: int, k: int):
    from vllm.distributed.kv_transfer.kv_connector.utils import TransferTopology

    return TransferTopology(tp_rank=rank, tp_size=tp, block_size=16, engine_id=f"tp{tp}", is_mla=False, is_mamba=False,
                            total_num_kv_heads=k, attn_backends=[])


def nixl(k: int, p: int, d: int, rank: int) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.tp_mapping import compute_tp_mapping
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    local = topology(rank, d, k)
    if local.tp_ratio(p) < 0 and p > k:  # base_worker.py: `assert not (tp_ratio < 0 and is_kv_replicated(remote))`
        return {"refused": f"NIXL asserts against TP {p} -> {d} over {k} KV heads (tp_ratio < 0 with replicated remote KV)"}
    mapping = compute_tp_mapping(local, p, (FullAttentionSpec,))
    heads = [[] for _ in range(local_heads(k, d))]
    ranks = mapping.source_ranks_per_group[0]
    if d >= p:  # one remote rank; this rank's heads sit at slice `rank_offset_factor` of its block
        (source,) = ranks
        for j in range(len(heads)):
            heads[j].append([source, mapping.rank_offset_factor * len(heads) + j])
    else:  # several remote ranks, each filling head slot `rank_to_attention_slot[r]`
        per_remote = local_heads(k, p)
        for source in ranks:
            slot = mapping.rank_to_attention_slot[source]
            for i in range(per_remote):
                heads[slot * per_remote + i].append([source, i])
    return {"heads": heads}


def mooncake(k: int, p: int, d: int, rank: int) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.mooncake_connector import _compute_sender_transfer_plan

    heads = [[] for _ in range(local_heads(k, d))]
    for source in topology(rank, d, k).handshake_target_ranks(p):
        paired = topology(source, p, k).handshake_target_ranks(d)
        if rank not in paired:  # send_kv_to_decode: "This D tp_rank … is not paired with P tp_rank …"
            return {"refused": f"producer rank {source} is paired with consumer ranks {paired}, not {rank}"}
        sends, src, dst, length = _compute_sender_transfer_plan(
            local_tp_rank=source, local_tp_size=p, remote_tp_rank=rank, remote_tp_size=d, local_kv_block_len=local_heads(k, p),
            remote_kv_block_len=len(heads), producer_cache_replicated=p > k, total_num_kv_heads=k)
        if sends:
            for i in range(length):
                heads[dst + i].append([source, src + i])
    return {"heads": heads}


def moriio(k: int, p: int, d: int, rank: int) -> dict:
    from vllm.distributed.kv_transfer.kv_connector.v1.moriio.moriio_tp_mapping import compute_write_tp_mapping

    heads = [[] for _ in range(local_heads(k, d))]
    for source in range(p):
        for target in compute_write_tp_mapping(source, p, d, k, False, False).targets:
            if target.tp_rank == rank:
                for i in range(target.num_heads):
                    heads[target.remote_head + i].append([source, target.local_head + i])
    return {"heads": heads}


def main() -> int:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    os.environ.setdefault("HIP_VISIBLE_DEVICES", "")
    import vllm

    rows = []
    for k, p, d in grid():
        for rank in range(d):
            rows.append({"K": k, "P": p, "D": d, "rank": rank,
                         "nixl": nixl(k, p, d, rank), "mooncake": mooncake(k, p, d, rank), "moriio": moriio(k, p, d, rank)})
    json.dump({"vllm": vllm.__version__, "rows": rows}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
