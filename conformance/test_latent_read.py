"""Latent caches (SPEC §17) — read: the gathers return exactly what the records hold (plain MLA bits,
per-tensor fp8 dequantised, fp8_ds_mla upconverted, the indexer's value and scale bytes) for
sequences whose blocks lie anywhere in the cache, without changing it; MLA decode equals SDPA on the
dense latent (K the whole latent, V its first kv_lora_rank values) within the roundings of its output and of P;
gathers read blocks past 2^31 bytes in 64 bits."""

import pytest
import torch

from kvconform import reference as R

from .harness.assertions import assert_close
from .harness.latent import (
    assert_inputs_unchanged,
    assert_latent_bytes_equal,
    assert_rows_equal,
    copy_records,
    declared_op,
    default_scale,
    filled,
    inputs_of,
    latent_rows,
    latent_spec,
    probe_arena,
    probe_spec,
    probe_twin,
    reference_write,
    slots_of,
    synchronize,
)

pytestmark = [pytest.mark.read, pytest.mark.kvc_layouts("latent")]
BLOCK_TABLE = [[4, 1, 5, 0], [2, 3, 0, 0], [5, 0, 0, 0]]  # blocks out of order; a table wider than a sequence needs


def sequences(spec):
    """Three sequences: a partial last block, one of exactly two blocks, a single token."""
    N = spec.geometry.block_size
    return torch.tensor(BLOCK_TABLE), torch.tensor([2 * N + 3, 2 * N, 1])


def gather(case, arena, twin, table, lens):
    """Backend gather and the reference's on the twin, from clones of the inputs taken before the call."""
    spec, scale = arena.spec, default_scale(arena.spec.fmt)
    (d_table, d_lens), (table, lens) = inputs_of(case, table, lens)
    if spec.fmt.kind == "indexer":
        expected = R.latent.gather_indexer(twin.region, spec.geometry, table, lens, layer=spec.layer)
        got = case.backend.indexer_gather(arena.cache, d_table, d_lens, spec)
    else:
        expected = R.latent.gather_latent(twin.region, spec.geometry, table, lens, scale=scale, layer=spec.layer)
        got = case.backend.latent_gather(arena.cache, d_table, d_lens, spec, scale=None if scale is None else scale.to(case.device))
    assert_inputs_unchanged("read", case, {"block_table": (table, d_table), "seq_lens": (lens, d_lens)})
    return got, expected


@pytest.mark.kvc_clause("LATENT-GATHER", "DSMLA-UPCONVERT", "MLA-WRITE-FP8")
@pytest.mark.kvc_op("latent_gather")
@pytest.mark.kvc_latent("mla", "fp8_ds_mla")
def test_gather_returns_exactly_the_written_latent(case, latent_format):
    spec = latent_spec(case, latent_format.fmt, num_layers=max(case.backend.capabilities.latent.num_layers))
    spec = type(spec)(geometry=spec.geometry, layer=spec.geometry.num_layers - 1)
    arena, twin = filled(case, spec, case.seed, default_scale(spec.fmt))
    got, expected = gather(case, arena, twin, *sequences(spec))
    synchronize(case)
    assert_rows_equal("read", case, expected, got, f"gathered latent of {latent_format.id}, layer {spec.layer}", ("token", "value"))
    assert_latent_bytes_equal("read", case, twin, arena, "a gather must not change the cache")


@pytest.mark.kvc_clause("IDX-GATHER", "IDX-LAYOUT")
@pytest.mark.kvc_op("indexer_gather")
@pytest.mark.kvc_latent("indexer")
def test_indexer_gather_returns_the_stored_value_and_scale_bytes(case, latent_format):
    spec = latent_spec(case, latent_format.fmt)
    arena, twin = filled(case, spec, case.seed)
    (values, scales), (want_values, want_scales) = gather(case, arena, twin, *sequences(spec))
    synchronize(case)
    assert_rows_equal("read", case, want_values, values, f"gathered indexer values of {latent_format.id}", ("token", "value"))
    assert_rows_equal("read", case, want_scales, scales, f"gathered indexer scale bytes of {latent_format.id}", ("token", "byte"))
    assert_latent_bytes_equal("read", case, twin, arena, "a gather must not change the cache")


def sdpa_on_dense_latent(query, dense, lens, kv_lora_rank, softmax_scale):
    """The oracle of MLA decode: torch's SDPA in float32 over each sequence's dense latent, K = the
    whole latent, V = its first kv_lora_rank values (one KV head shared by every query head)."""
    T = int(lens.max())
    starts = torch.cumsum(lens, 0) - lens
    position = torch.arange(T)
    valid = position[None, :] < lens[:, None]
    index = (starts[:, None] + position[None, :]).clamp(max=dense.shape[0] - 1)
    keys = dense.float()[index]  # [S, T, R + P]
    mask = valid[:, None, None, :]  # [S, 1, 1, T]
    out = torch.nn.functional.scaled_dot_product_attention(query.float()[:, :, None, :], keys[:, None], keys[:, None, :, :kv_lora_rank],
                                                           attn_mask=mask, scale=softmax_scale)
    return out[:, :, 0]


@pytest.mark.kvc_clause("MLA-DECODE")
@pytest.mark.kvc_op("latent_decode")
@pytest.mark.kvc_latent("mla", "fp8_ds_mla")
def test_mla_decode_equals_sdpa_on_the_dense_latent(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    arena, twin = filled(case, spec, case.seed, default_scale(fmt))
    table, lens = sequences(spec)
    query = (torch.randn(3, 4, fmt.width(), generator=torch.Generator().manual_seed(case.seed)) / 4).to(fmt.model_dtype)
    softmax_scale = fmt.width() ** -0.5
    dense = R.latent.gather_latent(twin.region, spec.geometry, table, lens, scale=default_scale(fmt))
    expected = sdpa_on_dense_latent(query, dense, lens, fmt.kv_lora_rank, softmax_scale)
    (d_query, d_table, d_lens, d_scale), before = inputs_of(case, query, table, lens, default_scale(fmt))
    got = case.backend.latent_decode(d_query, arena.cache, d_table, d_lens, spec, scale=d_scale, softmax_scale=softmax_scale)
    assert_inputs_unchanged("read", case, dict(zip(("query", "block_table", "seq_lens", "scale"), zip(before, (d_query, d_table, d_lens, d_scale)))))
    synchronize(case)
    # MLA-DECODE: the output rounded to the model dtype (half an ulp of it), the probabilities P
    # too before P·V (half an ulp of the largest |V|), plus float32 summation order.
    half_ulp = 2.0**-8 if fmt.model_dtype == torch.bfloat16 else 2.0**-11
    largest_v = float(dense[..., : fmt.kv_lora_rank].float().abs().max())
    assert_close("read", case, expected, got, atol=1e-3 + half_ulp * largest_v, rtol=half_ulp, dims=("sequence", "head", "value"))


@pytest.mark.kvc_clause("LATENT-ADDR-64BIT", "LATENT-GATHER", "IDX-GATHER")
@pytest.mark.kvc_needs("memory_2_31")
def test_gathers_read_the_last_block_of_a_latent_cache_past_2_31_bytes(case, latent_format):
    fmt = latent_format.fmt
    declared_op(case, fmt, "gather")
    spec = probe_spec(case, fmt)
    last, N = spec.geometry.num_blocks - 1, spec.geometry.block_size
    arena = probe_arena(case, spec)
    twin = probe_twin(arena)
    slots = slots_of(spec, [(last, r) for r in range(N)] + [(1, r) for r in range(N)])
    reference_write(twin, latent_rows(fmt, 2 * N, case.seed), slots, default_scale(fmt))
    copy_records(twin, arena, slots)
    got, expected = gather(case, arena, twin, torch.tensor([[last, 1]]), torch.tensor([N + 5]))
    synchronize(case)
    for want, have, what in zip(expected if isinstance(expected, tuple) else (expected,), got if isinstance(got, tuple) else (got,), ("values", "scales")):
        assert_rows_equal("read", case, want, have, f"{what} gathered from block {last} at byte {last * spec.geometry.block_bytes()} > 2^31", ("token", "value"))
