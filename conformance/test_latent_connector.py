"""Latent caches (SPEC §17) — connector: a latent cache ships as byte regions of whole blocks of
every layer (an indexer block's scales with its values) and has no head slice; under tensor
parallelism it is replicated, so each consumer rank pulls each block from exactly the one producer
rank vLLM's NIXL mapping names, for more producer than consumer ranks and fewer; and the record
descriptor a handshake compares tells apart every peer whose records mean other bytes."""

import dataclasses

import pytest
import torch

from kvconform import reference as R

from .harness.latent import assert_facts_equal, attempt, latent_spec

pytestmark = [pytest.mark.connector, pytest.mark.kvc_layouts("latent")]
TP_CHANGES = [(4, 2), (8, 2), (3, 2), (2, 4), (1, 4), (2, 3), (4, 1), (2, 2)]  # producer -> consumer ranks: P > D, P < D, equal


def covered_bytes(regions, nbytes: int) -> torch.Tensor:
    """How many regions cover each byte of the cache."""
    count = torch.zeros(nbytes + 1, dtype=torch.int64)
    for start, length in regions:
        count[max(start, 0) : min(start + length, nbytes)] += 1
    return count[:nbytes]


@pytest.mark.kvc_clause("LATENT-TP-SOURCE", "LATENT-BLOCK", "IDX-LAYOUT")
@pytest.mark.kvc_op("latent_regions")
def test_latent_regions_are_whole_blocks_of_every_layer_and_nothing_else(case, latent_format):
    spec = latent_spec(case, latent_format.fmt, num_layers=max(case.backend.capabilities.latent.num_layers))
    blocks = [5, 0, 3]
    g = spec.geometry
    got = covered_bytes(case.backend.latent_regions(spec, blocks), g.nbytes())
    want = covered_bytes(R.latent.block_byte_ranges(g, blocks), g.nbytes())
    wrong = (got != want).nonzero().flatten()
    where = R.latent.coordinates_of(g, wrong[:1]) if wrong.numel() else {}
    first = " ".join(f"{k}={v[0] if isinstance(v, list) else int(v[0])}" for k, v in where.items())
    assert_facts_equal("connector", case, 0, wrong.numel(), f"bytes covered other than once by the regions of blocks {blocks} "
                                                            f"({g.short()}; first at {first or '-'})")


@pytest.mark.kvc_clause("LATENT-TP-SOURCE")
@pytest.mark.kvc_op("latent_regions")
def test_a_head_slice_of_a_latent_cache_is_refused(case, latent_format):
    spec = latent_spec(case, latent_format.fmt)
    _, refused = attempt(lambda: case.backend.latent_regions(spec, [1, 2], heads=range(1)))
    assert_facts_equal("connector", case, "ValueError", type(refused).__name__ if refused else "regions returned",
                       f"latent_regions(blocks [1, 2], heads=range(0, 1)) of {latent_format.id}: the latent is replicated, it has no head slice")


@pytest.mark.kvc_clause("LATENT-TP-SOURCE")
@pytest.mark.kvc_op("latent_plan")
@pytest.mark.parametrize("tp", TP_CHANGES, ids=[f"P{p}-D{d}" for p, d in TP_CHANGES])
def test_each_consumer_rank_pulls_each_block_from_exactly_one_producer_rank(case, tp):
    producers, consumers = tp
    blocks = [7, 0, 3, 12]
    for rank in range(consumers):
        pulls = case.backend.latent_transfer_plan(producers, consumers, rank, blocks)
        want = sorted(R.latent.replicated_block_sources(producers, consumers, rank, blocks).items())
        assert_facts_equal("connector", case, want, sorted((int(b), int(r)) for b, r in pulls),
                           f"(block, producer rank) pulls of consumer rank {rank} of {consumers} from {producers} producer ranks")


def record_variants(fmt):
    """Formats whose records differ from ``fmt``'s in one respect each (the reference says how)."""
    other_dtype = torch.float16 if fmt.model_dtype == torch.bfloat16 else torch.bfloat16
    variants = [dataclasses.replace(fmt, model_dtype=other_dtype), dataclasses.replace(fmt, platform="rocm", arch="gfx942")]
    if fmt.kind == "mla":
        variants += [dataclasses.replace(fmt, cache_dtype="fp8" if fmt.cache_dtype == "auto" else "auto"),
                     dataclasses.replace(fmt, rope_dim=fmt.rope_dim + 16)]
    if fmt.kind == "indexer":
        variants += [dataclasses.replace(fmt, scale_format=s) for s in R.latent.INDEXER_SCALE_FORMATS if s != fmt.scale_format]
    return [v for v in variants if R.latent.record_descriptor(v) != R.latent.record_descriptor(fmt)]


@pytest.mark.kvc_clause("LATENT-COMPAT")
@pytest.mark.kvc_op("latent_regions")
def test_descriptor_refuses_a_peer_with_another_record_format(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    ours = case.backend.latent_descriptor(spec)
    assert_facts_equal("connector", case, R.latent.record_descriptor(fmt), ours, f"descriptor of {fmt.label()}")
    for peer in record_variants(fmt):
        theirs = case.backend.latent_descriptor(dataclasses.replace(spec, geometry=dataclasses.replace(spec.geometry, fmt=peer)))
        assert_facts_equal("connector", case, True, theirs != ours, f"a {peer.label()} peer ({peer.model_dtype}, {peer.platform}) is refused by a {fmt.label()} cache")
