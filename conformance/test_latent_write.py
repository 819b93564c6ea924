"""Latent caches (SPEC §17) — write: ``concat_and_cache_mla``, ``concat_and_cache_ds_mla`` and
``indexer_k_quant_and_cache`` store each token's record exactly where the reference's address
formula says and nothing else changes (other rows, blocks, layers, padding slots, the guard bytes);
input rows are read through their strides; fp8 codes equal the reference's for edge values in every
tile, given the record's own stored scale, and the stored scales follow the scale policy of the
format's version and platform; caches past 2^31 bytes are addressed in 64 bits."""

import pytest
import torch
from kvconform.reference import latent_records

from kvconform import reference as R

from .harness.applicability import undeclared
from .harness.latent import (
    allocate,
    assert_latent_bytes_equal,
    assert_probe_equal,
    assert_rows_equal,
    backend_write,
    declared_op,
    default_scale,
    edge_rows,
    inputs_of,
    latent_rows,
    latent_spec,
    probe_arena,
    probe_spec,
    probe_twin,
    reference_write,
    run_write,
    slots_of,
    synchronize,
    write_and_compare,
)

pytestmark = [pytest.mark.write, pytest.mark.kvc_layouts("latent")]
WRITERS = ("MLA-WRITE-SLOT", "DSMLA-RECORD", "IDX-WRITE", "LATENT-ONLY-TARGET")


def spread_slots(spec, padding: bool):
    """Slots in the first, a middle and the last block, first and last rows, and a -1 when declared."""
    N = spec.geometry.block_size
    pairs = [(2, 0), (3, N - 1), (5, N // 2), (0, 3), (4, 1)]
    return slots_of(spec, pairs[:2] + [None] + pairs[2:] if padding else pairs)


@pytest.mark.kvc_clause(*WRITERS, "MLA-WRITE-PAD", "MLA-WRITE-STRIDE", "MLA-WRITE-FP8", "DSMLA-SCALE", "DSMLA-ROPE", "IDX-LAYOUT", "IDX-MX")
def test_latent_records_land_in_their_slots_and_nothing_else_changes(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    slots = spread_slots(spec, case.backend.capabilities.latent.padding_slots)
    write_and_compare(case, "write", spec, latent_rows(fmt, len(slots), case.seed), slots, default_scale(fmt), fmt.label())


@pytest.mark.kvc_clause("MLA-WRITE-PAD", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_needs("latent_padding_slots")
def test_padding_slots_leave_the_latent_cache_untouched(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    write_and_compare(case, "write", spec, latent_rows(fmt, 4, case.seed), torch.full((4,), -1), default_scale(fmt), "all slots are -1")


@pytest.mark.kvc_clause("MLA-WRITE-TOKENS", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_latent("mla", "fp8_ds_mla")
def test_rows_past_the_slot_mapping_are_not_written(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    slots = slots_of(spec, [(1, 2), (5, spec.geometry.block_size - 1)])
    write_and_compare(case, "write", spec, latent_rows(fmt, 7, case.seed), slots, default_scale(fmt), "7 input rows, 2 slots")


@pytest.mark.kvc_clause("MLA-WRITE-STRIDE")
@pytest.mark.parametrize("contiguous", [True, False], ids=["contiguous-rows", "projection-slices"])
def test_latent_rows_are_read_through_their_strides(case, latent_format, contiguous):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    slots = torch.arange(6) * 3 + spec.geometry.block_size
    rows = latent_rows(fmt, 6, case.seed, contiguous=contiguous)
    write_and_compare(case, "write", spec, rows, slots, default_scale(fmt), f"kv_c row stride {rows.kv_c.stride(0)}")


@pytest.mark.kvc_clause("MLA-WRITE-FP8", "DSMLA-RECORD", "DSMLA-SCALE", "IDX-WRITE", "FP8-ENCODE", "FP8-SATURATE", "FP8-NEG-ZERO")
@pytest.mark.kvc_latent("mla_fp8", "fp8_ds_mla", "indexer")
def test_fp8_edge_values_in_every_tile_are_encoded_as_the_reference(case, latent_format):
    fmt = latent_format.fmt
    spec = latent_spec(case, fmt)
    slots = torch.arange(8) * 2 + spec.geometry.block_size
    rows = edge_rows(fmt, 8, case.seed, scale=0.5)
    write_and_compare(case, "write", spec, rows, slots, default_scale(fmt), "±0, −0 rounding, max, past max, a zero tile, exact ties, subnormal ties")


def stored_fields(arena, slots):
    """The codes and scales fields the backend stored for these slots."""
    spec = arena.spec
    N = spec.geometry.block_size
    fields = R.latent.field_offsets(spec.geometry, slots // N, slots % N, spec.layer)
    region = arena.region.cpu()
    codes = region[fields["nope" if spec.fmt.kind == "fp8_ds_mla" else "values"]]
    scale_bytes = region[fields["scales"]]
    scales = scale_bytes.contiguous().view(torch.float32) if spec.fmt.kind == "fp8_ds_mla" else R.latent.indexer_scales(scale_bytes, spec.fmt.scale_format)
    return codes, scales


def edge_records_written(case, fmt):
    """Eight edge-value rows written by the backend into every third slot: the rows, and the codes
    and scales fields it stored for them."""
    slots = torch.arange(8) * 3 + 1
    rows = edge_rows(fmt, 8, case.seed)
    arena = allocate(case, latent_spec(case, fmt))
    run_write(case, arena, rows, slots)
    return rows, stored_fields(arena, slots)


@pytest.mark.kvc_clause("DSMLA-RECORD", "IDX-WRITE", "FP8-ENCODE")
@pytest.mark.kvc_latent("fp8_ds_mla", "indexer")
def test_stored_codes_are_the_inputs_encoded_with_the_records_own_scales(case, latent_format):
    # Independent of the scale policy: whatever scale a record holds, its codes are x / that scale.
    fmt = latent_format.fmt
    rows, (codes, scales) = edge_records_written(case, fmt)
    expected = latent_records.encode_groups(rows.kv_c.cpu(), scales, 128, fmt.e4m3)
    assert_rows_equal("write", case, expected, codes, f"fp8 codes of {fmt.label()} given each record's stored scales", ("token", "value"))


@pytest.mark.kvc_clause("DSMLA-SCALE", "IDX-SCALE")
@pytest.mark.kvc_latent("fp8_ds_mla", "indexer")
def test_stored_scales_follow_the_scale_policy_of_the_platform(case, latent_format):
    fmt = latent_format.fmt
    rows, (_, scales) = edge_records_written(case, fmt)
    policy = R.latent.ScalePolicy.ds_mla("0.33.0", fmt.platform, fmt.arch) if fmt.kind == "fp8_ds_mla" else R.latent.ScalePolicy.indexer(fmt.scale_format, fmt.platform, fmt.arch)
    expected = policy.scales(latent_records.group_amax(rows.kv_c.cpu(), 128))
    assert_rows_equal("write", case, expected, scales, f"tile scales of {fmt.label()} (divisor {policy.divisor}, floor {policy.floor}, power of two: {policy.pow2})",
                      ("token", "tile"))


@pytest.mark.kvc_clause(*WRITERS, "LATENT-LAYERS")
def test_every_declared_block_size_and_the_last_layer_are_written_at_reference_offsets(case, latent_format):
    fmt, latent = latent_format.fmt, case.backend.capabilities.latent
    for block_size in latent.block_sizes:
        spec = latent_spec(case, fmt, num_blocks=4, block_size=block_size, num_layers=max(latent.num_layers), layer=max(latent.num_layers) - 1)
        slots = slots_of(spec, [(3, block_size - 1), (0, 0), (2, block_size // 2)])
        write_and_compare(case, "write", spec, latent_rows(fmt, 3, case.seed), slots, default_scale(fmt), f"N={block_size}, layer {spec.layer}")


@pytest.mark.kvc_clause("LATENT-ADDR-64BIT", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_needs("memory_2_31")
def test_last_block_of_a_latent_cache_past_2_31_bytes_is_written(case, latent_format):
    fmt = latent_format.fmt
    declared_op(case, fmt, "write")
    spec = probe_spec(case, fmt)
    last, N = spec.geometry.num_blocks - 1, spec.geometry.block_size
    slots = slots_of(spec, [(last, N - 1), (last, 0), (1, 3)])
    rows = latent_rows(fmt, 3, case.seed)
    arena = probe_arena(case, spec)
    expected = probe_twin(arena)
    reference_write(expected, rows, slots, default_scale(fmt))
    backend_write(case, arena, rows, slots, default_scale(fmt))
    synchronize(case)
    assert_probe_equal("write", case, expected, arena, f"{spec.geometry.num_blocks} blocks, the last at byte {last * spec.geometry.block_bytes()} > 2^31")


@pytest.mark.kvc_clause("MLA-GROUPED", "MLA-WRITE-SLOT", "LATENT-ONLY-TARGET")
@pytest.mark.kvc_op("latent_grouped_write")
@pytest.mark.kvc_latent("mla")
def test_grouped_writer_writes_each_layer_from_its_own_rows_and_slots(case, latent_format):
    fmt = latent_format.fmt
    if fmt.model_dtype != torch.bfloat16:  # MLA-GROUPED: the grouped writer takes bf16 inputs only
        raise undeclared(case.backend, f"declares {fmt.label()}: the grouped writer takes bfloat16 inputs only")
    spec = latent_spec(case, fmt, num_blocks=4)
    N = spec.geometry.block_size
    arenas = [allocate(case, spec, seed_offset=layer) for layer in range(3)]
    expected = [arena.snapshot() for arena in arenas]
    rows = [latent_rows(fmt, 4, case.seed + layer) for layer in range(3)]
    slots = [slots_of(spec, [(3, N - 1 - layer), (layer, 1), None, (2, layer)]) for layer in range(3)]
    scales = torch.tensor([0.5, 1.0, 2.0]) if fmt.cache_dtype != "auto" else None
    for layer in range(3):  # the grouped writer is the per-layer writer, layer by layer (MLA-GROUPED)
        reference_write(expected[layer], rows[layer].clone(), slots[layer].clone(), None if scales is None else scales[layer : layer + 1].clone())
    (d_scales, *d_slots), _ = inputs_of(case, scales, *slots)
    case.backend.latent_grouped_write([a.cache for a in arenas], [r.kv_c.to(case.device) for r in rows], [r.k_pe.to(case.device) for r in rows],
                                      d_slots, [spec] * 3, scales=d_scales)
    synchronize(case)
    for layer, (want, got) in enumerate(zip(expected, arenas)):
        assert_latent_bytes_equal("write", case, want, got, f"grouped write, layer {layer} of 3")
