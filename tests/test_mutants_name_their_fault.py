"""Every seeded fault whose failure is a byte comparison names its fault class (issue #23): a
check aimed at it fails, and the failure's diagnosis (``failure.diagnosis``) contains the class
the mutant's docstring describes. One suite run holds every mutant, each selected down to one
check (and one layout and cache dtype) that shows its fault, so the proof costs about a minute."""

from collections import defaultdict

import pytest

from kvconform.backends_under_test.mutants import MUTANTS
from kvconform.conformance.harness.diagnosis import FAULTS

from .suite_runs import run_suite

BYTE_FAMILIES = {"write", "shuffle", "swap", "copy", "split", "connector"}  # checks that compare arenas byte for byte
CACHE_DTYPE = "test_each_declared_cache_dtype_is_written_at_reference_offsets"
SIZE_CLASS = "test_each_declared_size_class_is_written_at_reference_offsets"
EDGES = "test_fp8_codes_equal_the_reference_encoder_for_edge_values"
WRITE = "test_written_elements_land_at_reference_offsets_and_nothing_else_changes"
SWAP_OUT = "test_swap_out_places_each_block_at_its_host_slot"
RESHARD = "test_resharding_gives_every_consumer_rank_exactly_its_heads"
HYBRID = "test_hybrid_model_groups_round_trip_each_with_its_own_geometry"


def declared_in(family: str) -> set[str]:
    """The mutants of one module of the mutants package."""
    return {m for m, cls in MUTANTS.items() if cls.__module__.endswith(f".mutants.{family}")}


# mutant: (the fault class its failure names, the check that shows it, the test id after "mutant:NAME-")
NAMED = {
    "kv_first_reported_as_blocks_first": ("wrong-layout", CACHE_DTYPE, "E1:NHD-auto-bfloat16"),
    "write_padding_slots": ("padding-written", CACHE_DTYPE, "E1:NHD-auto-bfloat16"),
    "write_dense_block_stride": ("other-element", CACHE_DTYPE, "E1:NHD-auto-bfloat16"),
    "write_head_stride_ignored": ("other-element", CACHE_DTYPE, "E1:HND-auto-bfloat16"),
    "fp8_scale_multiplied": ("scale-inverted", CACHE_DTYPE, "E1:NHD-fp8-float8_e4m3fn"),
    "shuffle_v_in_k_form": ("wrong-layout", CACHE_DTYPE, "AITER:shuffle-blocks_first-auto-bfloat16"),
    "shuffle_x_from_model_dtype": ("wrong-layout", "test_fp8_tiles_use_x_from_the_cache_dtype", "AITER:shuffle-blocks_first"),
    "write_tokens_from_key_rows": ("extra-row", WRITE, "E1:NHD"),
    "write_k_scale_for_v": ("scale-swapped", CACHE_DTYPE, "E1:NHD-fp8-float8_e4m3fn"),  # fixed_scales(): not a reciprocal pair
    "fp8_truncates_instead_of_rne": ("fp8-rounding", EDGES, "E1:NHD-fp8-float8_e4m3fn-exact-ties"),
    "fn_to_fnuz_without_negative_zero_fix": ("fp8-fnuz-vs-fn", EDGES, "E1:NHD-fp8_e4m3-float8_e4m3fnuz-exact-ties"),
    "write_scribbles_past_the_end": ("out-of-bounds", CACHE_DTYPE, "E1:NHD-auto-bfloat16"),
    "write_int32_offset_wraparound": ("block-id-wrap", "test_last_block_of_a_cache_past_2_31_elements_is_written", "E1:NHD"),
    "write_one_bit_flipped": ("bit-flip", CACHE_DTYPE, "E1:NHD-auto-bfloat16"),
    "shuffle_dense_block_stride": ("neighbour-block", CACHE_DTYPE, "AITER:shuffle-blocks_first-auto-bfloat16"),
    "fp8_nan_saturates_to_max": ("fp8-nan", EDGES, "E1:NHD-fp8-float8_e4m3fn-exact-ties"),
    "fp8_near_ties_rounded_as_ties": ("fp8-rounding", EDGES, "E1:NHD-fp8-float8_e4m3fn-near-ties"),
    "write_head_stride_power_of_two": ("other-element", SIZE_CLASS, "E1:NHD-D80"),
    "write_ignores_layer": ("other-layer", SIZE_CLASS, "E3:LBHNC-L3"),
    "fp8_e5m2_written_as_e4m3": ("fp8-format", CACHE_DTYPE, "E1:NHD-fp8_e5m2-float8_e5m2"),
    "swap_indexes_dim1": ("other-element", "test_swap_of_blocks_0_and_1_moves_blocks_not_planes", "E1:NHD"),
    "swap_dim0_on_kv_first": ("other-element", "test_swap_of_blocks_0_and_1_moves_blocks_not_planes", "E0:NHD"),
    "swap_k_view_block_bytes": ("neighbour-block", SWAP_OUT, "E1:NHD-auto-bfloat16"),
    "swap_only_below_two": ("never-written", "test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements", "E1:NHD"),
    "swap_block_bytes_for_two_byte_elements": ("neighbour-block", SWAP_OUT, "E1:NHD-fp8-float8_e4m3fn"),
    "swap_16_bit_ids": ("block-id-wrap", "test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements", "E1:NHD"),
    "swap_byte_offsets_int32": ("block-id-wrap", "test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements", "E1:NHD"),
    "block_copies_first_layer_only": ("never-written", "test_swap_out_moves_every_layer_of_a_block", "E3:LBHNC"),
    "copy_blocks_one_plane": ("never-written", "test_copy_blocks_copies_both_planes_of_every_slot", "E1:NHD-auto-bfloat16"),
    "copy_blocks_dense_plane_stride": ("other-element", "test_copy_blocks_copies_both_planes_of_every_slot", "E1:NHD-auto-bfloat16"),
    "copy_blocks_16_bit_ids": ("never-written", "test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements", "E1:NHD"),
    "split_copies": ("never-written", "test_writes_through_split_views_reach_the_cache", "E1:NHD-auto-bfloat16"),
    "split_v_offset_for_two_byte_elements": ("never-written", "test_writes_through_split_views_reach_the_cache", "E1:NHD-auto-float32"),
    "connector_wire_casts_values": ("value-cast", RESHARD, "E1:NHD-wire"),
    "connector_nhd_slice_as_hnd": ("other-element", RESHARD, "E1:NHD-regions"),
    "connector_import_into_a_copy": ("never-written", RESHARD, "E1:NHD-wire"),
    "connector_reblock_drops_last_partial_block": ("never-written", "test_block_size_translation_keeps_every_token", "E1:NHD-N32to16"),
    "connector_hybrid_group_other_head_size": ("never-written", HYBRID, "E1:NHD"),
    "connector_hybrid_group_first_block_size": ("stray-write", HYBRID, "E1:NHD"),
    "connector_export_head_range_from_first_head": ("other-head", HYBRID, "E1:NHD"),
    "connector_multi_head_slice_head_major": ("other-element", "test_exported_head_ranges_import_bit_for_bit", "E1:NHD"),
}

# Mutants aimed at a byte-comparing family whose failures name no fault class, and why.
UNNAMED = {
    "write_block_size_from_wrong_dim": "its writer indexes past its own views: an IndexError before any bytes are compared",
    "write_block_index_by_shift": "its writer indexes past the cache (N = 48): an IndexError before any bytes are compared",
    "split_on_block_dim": "fails the view checks (strides, data_ptr); its write-through raises before any bytes are compared",
    "connector_head_slice_off_by_one": "the consumer holds another rank's heads, bytes found nowhere in the consumer's own "
                                       "cache: unexplained (regions are checked as regions)",
    "connector_regions_dense_plane_block_stride": "its failures are region coverage, not bytes",
    "connector_regions_repeat_a_run": "its failures are region coverage, not bytes",
    "connector_import_bytes_of_another_dtype": "its failure is a refusal verdict (the wire had to be refused or converted), not bytes",
    "connector_import_assumes_own_wire_layout": "its failures are interop cells, each summarised by its first wrong element",
    "connector_descriptor_guesses_layout_from_shape": "its failures are a descriptor's facts, not bytes",
    "connector_handshake_accepts_inexact_fnuz_scale": "its failures are handshake verdicts, not bytes",
    "connector_handshake_ignores_layer_grouping": "its failures are handshake verdicts, not bytes",
    "connector_handshake_k_scale_only": "its failures are handshake verdicts, not bytes",
    "connector_handshake_layout_by_shape": "its failures are handshake verdicts, not bytes",
    "connector_handshake_slices_ignore_replication": "its failures are handshake plans, not bytes",
    "connector_reshard_routes_heads_to_the_wrong_device": "its check runs only with --kvc-devices; its failures are told by consumer rank, "
                                                          "device and head (harness/device_transfer.py)",
}
# Latent-cache faults are told in record coordinates by harness/latent.py (never-written, stray-write,
# moved), not in the K/V diagnosis' fault classes.
UNNAMED.update({m: "a latent-cache fault: its failures are told by record, field and byte (harness/latent.py)"
                for m in declared_in("latent") if set(MUTANTS[m].catches) & BYTE_FAMILIES})
# Input-changing faults fail OP-INPUTS-UNCHANGED before any cache byte is compared (harness/oracle_guard.py).
UNNAMED.update({m: "an op that changes its inputs: its failure names the argument and its first changed element"
                for m in declared_in("inputs") if set(MUTANTS[m].catches) & BYTE_FAMILIES})
# Per-token-head faults are told in cell coordinates by harness/quant.py (layer, block, slot, head, field, byte).
UNNAMED.update({m: "a per-token-head cache fault: its failures are told by cell, field and byte (harness/quant.py)"
                for m in declared_in("quant") if set(MUTANTS[m].catches) & BYTE_FAMILIES})


def test_every_mutant_of_a_byte_comparing_family_is_named_or_says_why_not():
    aimed = {m for m, cls in MUTANTS.items() if set(cls.catches) & BYTE_FAMILIES}
    assert aimed == set(NAMED) | set(UNNAMED), (sorted(aimed - set(NAMED) - set(UNNAMED)), sorted((set(NAMED) | set(UNNAMED)) - aimed))
    assert not set(NAMED) & set(UNNAMED)
    assert {fault for fault, _, _ in NAMED.values()} <= set(FAULTS)


@pytest.fixture(scope="module")
def diagnoses(tmp_path_factory):
    """Fault classes named by each mutant's failures, from one suite run of all of them."""
    chosen = " or ".join(f"({check} and mutant:{mutant}-{ids}]" + ")" for mutant, (_, check, ids) in NAMED.items())
    run = run_suite(tmp_path_factory.mktemp("suite"), "-n", "2", "--backend", ",".join(f"mutant:{m}" for m in NAMED),
                    "--standard", "e1", "-m", " or ".join(sorted(BYTE_FAMILIES)), "-k", chosen)
    named = defaultdict(lambda: {"outcomes": set(), "faults": set()})
    for record in run.records:
        mutant = record["backend"].removeprefix("mutant:")
        named[mutant]["outcomes"].add(record["outcome"])
        named[mutant]["faults"] |= {finding["fault"] for finding in ((record.get("failure") or {}).get("diagnosis") or [])}
    return dict(named)


@pytest.mark.parametrize("mutant", sorted(NAMED))
def test_mutant_failure_names_its_fault(diagnoses, mutant):
    fault, check, ids = NAMED[mutant]
    seen = diagnoses.get(mutant)
    assert seen and "failed" in seen["outcomes"], f"mutant:{mutant} did not fail {check}[…{ids}]: {seen}"
    assert fault in seen["faults"], f"mutant:{mutant}: its failures name {sorted(seen['faults'])}, not {fault}"
