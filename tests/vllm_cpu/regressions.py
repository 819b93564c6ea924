"""Realistic regressions edited into vLLM 0.33.0's own source, to prove the checks fail on them.

kvconform's own mutants (backends_under_test/mutants/) prove a check can fail on *our*
backends; a check that runs against vLLM also has to fail when *vLLM's* code goes wrong — a
check that compares the wrong names, or whose inputs steer vLLM off its production path, passes
whatever vLLM does. Each regression below is a textual edit of one vLLM module, applied when
the module is imported (``KVCONFORM_VLLM_REGRESSION=NAME`` in a suite run with
``-p tests.vllm_cpu.plugin``): the edited source is compiled under the original file name, so
tracebacks point into vLLM. An edit whose text is no longer in the installed vLLM is an error
naming the file (the vLLM version moved on), never a silent no-op.

tests/test_vllm_regressions.py runs each one and asserts that the checks it names fail, and
that together they fail every check that passes on unmodified vLLM.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import os
import sys

ENV = "KVCONFORM_VLLM_REGRESSION"


@dataclasses.dataclass(frozen=True)
class Edit:
    module: str
    old: str
    new: str


@dataclasses.dataclass(frozen=True)
class Regression:
    """One realistic bug in vLLM: the edits, the backend that shows it, and the checks it fails."""

    doc: str
    edits: tuple[Edit, ...]
    backend: str  # vllm:NAME[+shuffle]
    fails: tuple[str, ...]  # check names that must fail (all their records not passing)
    select: str  # pytest -k expression: the families worth running
    passes: tuple[str, ...] = ()  # checks that must still pass (the regression is that narrow)


FLASH = "vllm.v1.attention.ops.triton_reshape_and_cache_flash"
CPU_MLA = "vllm.v1.attention.backends.mla.cpu_mla"
CPU_MLA_ROWS = ("        flat[slots, :kv_lora_rank] = kv_c_normed.to(target_dtype)\n"
                "        flat[slots, kv_lora_rank:] = k_pe_sq.view(-1, pe_dim).to(target_dtype)\n")
SHUFFLE_KERNEL = "vllm.v1.attention.backends.rocm_aiter_fa"

REGRESSIONS = {
    "rocm_attn_claims_connector": Regression(
        "ROCM_ATTN's supports_kv_connector() edited to True (its asymmetric native K/V views are "
        "not connector-safe, and the ROCm priority list still leaves it out with a connector)",
        (Edit("vllm.v1.attention.backends.rocm_attn",
              "        # incompatible with KV connectors that require blocks-first layout.\n        return False",
              "        # incompatible with KV connectors that require blocks-first layout.\n        return True"),),
        backend="vllm:ROCM_ATTN", select="gating",
        fails=("test_selector_offers_a_connector_configuration_only_backends_that_support_one",),
    ),
    "validate_ignores_connector": Regression(
        "AttentionBackend.validate_configuration no longer rejects a connector the backend does not support",
        (Edit("vllm.v1.attention.backend",
              "        if use_kv_connector and not cls.supports_kv_connector():\n",
              "        if False and use_kv_connector and not cls.supports_kv_connector():\n"),),
        backend="vllm:ROCM_ATTN", select="gating",
        fails=("test_connector_configuration_is_rejected_iff_unsupported",),
        passes=("test_supported_configuration_has_no_other_reasons",),
    ),
    "triton_attn_rejects_block_16": Regression(
        "TRITON_ATTN.supports_block_size rejects its own smallest kernel block size (an off-by-one in a range check)",
        (Edit("vllm.v1.attention.backends.triton_attn",
              "    def supports_block_size(cls, block_size: int | None) -> bool:\n        if block_size is None:\n            return True\n",
              "    def supports_block_size(cls, block_size: int | None) -> bool:\n        if block_size is None:\n            return True\n"
              "        if block_size <= 16:\n            return False\n"),),
        backend="vllm:TRITON_ATTN", select="gating",
        fails=("test_supported_configuration_has_no_other_reasons", "test_connector_configuration_is_rejected_iff_unsupported"),
    ),
    "flash_attn_denies_connector": Regression(
        "FLASH_ATTN declares supports_kv_connector() = False although every layout it lists is blocks-first",
        (Edit("vllm.v1.attention.backends.flash_attn",
              "class FlashAttentionBackend(AttentionBackend):\n",
              "class FlashAttentionBackend(AttentionBackend):\n"
              "    @classmethod\n    def supports_kv_connector(cls) -> bool:\n        return False\n\n"),),
        backend="vllm:FLASH_ATTN", select="gating",
        fails=("test_selector_offers_a_connector_configuration_only_backends_that_support_one",),
    ),
    "nixl_asks_head_outermost": Regression(
        "NixlConnector asks for LHBNC (heads outside blocks) instead of LBHNC: with a connector, "
        "TRITON_ATTN runs a layout whose blocks are not one region each",
        (Edit("vllm.distributed.kv_transfer.kv_connector.v1.nixl.connector", '        return "LBHNC"\n', '        return "LHBNC"\n'),),
        backend="vllm:TRITON_ATTN", select="gating or shape",
        fails=("test_connector_support_matches_the_layouts", "test_blocks_are_outermost_and_each_block_is_one_region"),
    ),
    "copy_fast_path_raises": Regression(
        "copy_kv_cache_blocks_inplace's whole-storage fast path (block-outermost layouts) raises",
        (Edit("vllm.v1.worker.utils",
              "            copied_storages.add(storage_key)\n",
              "            copied_storages.add(storage_key)\n            raise RuntimeError('kvconform regression: whole-storage copy path')\n"),),
        backend="vllm:TRITON_ATTN", select="copy",
        fails=("test_copy_blocks_copies_both_planes_of_every_slot", "test_copy_blocks_moves_only_the_mapped_blocks"),
    ),
    "copy_slow_path_one_plane": Regression(
        "copy_kv_cache_blocks_inplace's per-view path copies only the first half of each block's C bytes (K, not V)",
        (Edit("vllm.v1.worker.utils",
              "            blocks = cache.unflatten(0, (num_blocks, kernel_blocks_per_block))\n",
              "            blocks = cache.unflatten(0, (num_blocks, kernel_blocks_per_block))[..., : cache.shape[-1] // 2]\n"),),
        backend="vllm:ROCM_AITER_FA", select="copy",
        fails=("test_copy_blocks_copies_both_planes_of_every_slot", "test_copy_blocks_moves_only_the_mapped_blocks",
               "test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements"),
    ),
    "rocm_swap_indexes_dim1": Regression(
        "RocmPlatform.swap_out_blocks_to_host / insert_blocks_to_device index dim 1 of the per-layer [B, H, N, C] view (the E0-era kv dim)",
        (Edit("vllm.platforms.rocm",
              "        \"\"\"Copy blocks from GPU to host (CPU).\"\"\"\n        _src_cache = src_cache[src_block_indices]\n        dst_cache[dst_block_indices] = _src_cache.cpu()",
              "        \"\"\"Copy blocks from GPU to host (CPU).\"\"\"\n        _src_cache = src_cache[:, src_block_indices % src_cache.shape[1]]\n"
              "        dst_cache[:, dst_block_indices % dst_cache.shape[1]] = _src_cache.cpu()"),
         Edit("vllm.platforms.rocm",
              "        \"\"\"Copy blocks from src_cache to dst_cache on GPU.\"\"\"\n        _src_cache = src_cache[src_block_indices]\n"
              "        dst_cache[dst_block_indices] = _src_cache.to(dst_cache.device)",
              "        \"\"\"Copy blocks from src_cache to dst_cache on GPU.\"\"\"\n        _src_cache = src_cache[:, src_block_indices % src_cache.shape[1]]\n"
              "        dst_cache[:, dst_block_indices % dst_cache.shape[1]] = _src_cache.to(dst_cache.device)")),
        backend="vllm:ROCM_AITER_FA", select="swap",
        fails=("test_swap_out_places_each_block_at_its_host_slot", "test_swap_in_restores_blocks_into_other_device_blocks",
               "test_swap_of_blocks_0_and_1_moves_blocks_not_planes", "test_swap_of_the_last_blocks_of_a_cache_past_2_31_elements"),
    ),
    "kv_views_layer_outermost": Regression(
        "compute_layout_strides puts the layer dim outermost whatever the layout: block-outermost "
        "layouts no longer interleave the layers of a block (one layer looks right; three do not)",
        (Edit("vllm.v1.kv_cache_interface",
              "    order = layout.stride_order\n",
              "    order = (_DIM_L, *(d for d in layout.stride_order if d != _DIM_L))\n"),),
        backend="vllm:TRITON_ATTN", select="shape or connector",
        fails=("test_every_layer_and_block_sits_where_the_permutation_puts_it",
               # the connector family's three-layer caches: regions, descriptor and resharding read vLLM's views
               "test_block_regions_cover_exactly_the_requested_blocks", "test_head_slice_regions_cover_exactly_the_requested_heads",
               "test_layout_descriptor_describes_the_allocated_cache", "test_resharding_gives_every_consumer_rank_exactly_its_heads"),
    ),
    "kv_views_heads_and_slots_swapped": Regression(
        "create_kv_cache_views hands out [B, N, H, C] (transposed) per-layer views instead of [B, H, N, C]",
        (Edit("vllm.v1.kv_cache_interface",
              "        cache_logical = view_5d[layer_idx]\n",
              "        cache_logical = view_5d[layer_idx].transpose(1, 2)\n"),),
        backend="vllm:ROCM_AITER_FA", select="shape or split or connector",
        fails=("test_cache_has_the_standard_logical_shape", "test_cache_strides_are_rebuilt_from_the_declared_stride_order",
               "test_blocks_are_outermost_and_each_block_is_one_region", "test_split_views_have_the_layout_strides",
               "test_writes_through_split_views_reach_the_cache",
               "test_head_slice_regions_cover_exactly_the_requested_heads", "test_blocks_shipped_to_every_peer_land_as_the_compat_plan_says"),
    ),
    "aiter_split_copies": Regression(
        "ROCM_AITER_FA's _split_kv_cache returns contiguous copies of K and V (a .contiguous() added for a kernel)",
        (Edit("vllm.v1.attention.backends.rocm_aiter_fa",
              "        return kv_cache.transpose(1, 2).split(self.head_size, dim=-1)\n",
              "        return tuple(t.contiguous() for t in kv_cache.transpose(1, 2).split(self.head_size, dim=-1))\n"),),
        backend="vllm:ROCM_AITER_FA", select="split",
        fails=("test_split_views_share_the_cache_storage", "test_writes_through_split_views_reach_the_cache"),
    ),
    "flash_writer_clamps_padding": Regression(
        "the Triton flash writer clamps padding slots (-1) to slot 0 instead of skipping them",
        (Edit(FLASH,
              "    if slot_idx < 0:\n        # Padding token that should be ignored.\n        return\n\n    block_idx = slot_idx // block_size\n",
              "    slot_idx = tl.maximum(slot_idx, 0)\n\n    block_idx = slot_idx // block_size\n"),),
        backend="vllm:TRITON_ATTN", select="write",
        fails=("test_padding_slots_leave_cache_untouched", "test_key_rows_beyond_slot_mapping_are_ignored",
               "test_single_kv_head_with_degenerate_head_stride_is_written", "test_written_elements_land_at_reference_offsets_and_nothing_else_changes",
               "test_each_declared_cache_dtype_is_written_at_reference_offsets", "test_each_declared_size_class_is_written_at_reference_offsets",
               "test_last_block_of_a_cache_past_2_31_elements_is_written"),
    ),
    "flash_writer_packed_heads": Regression(
        "the Triton flash writer assumes heads packed inside a slot (NHD): head stride = head_size on every view",
        (Edit(FLASH, "        head_stride = key_cache.stride()[2]\n", "        head_stride = head_size\n"),),
        backend="vllm:TRITON_ATTN", select="equivalence or write",
        fails=("test_canonical_bytes_equal_the_committed_reference_digests", "test_written_elements_land_at_reference_offsets_and_nothing_else_changes",
               "test_int32_and_int64_slot_mappings_write_the_same_bytes", "test_key_value_rows_are_read_through_their_row_stride"),
    ),
    "flash_writer_packed_key_rows": Regression(
        "the Triton flash writer derives the token stride from the head stride (assumes packed [T, H, D] rows)",
        (Edit(FLASH,
              "    key_stride = key.stride()[0]\n    value_stride = value.stride()[0]\n",
              "    key_stride = key.stride()[1] * num_heads\n    value_stride = value.stride()[1] * num_heads\n"),),
        backend="vllm:ROCM_ATTN", select="write or shuffle",
        fails=("test_key_value_rows_are_read_through_their_row_stride", "test_int32_and_int64_slot_mappings_write_the_same_bytes",
               "test_single_kv_head_with_degenerate_head_stride_is_written", "test_written_elements_land_at_reference_offsets_and_nothing_else_changes",
               "test_shuffled_tiles_stay_inside_their_block_and_side", "test_v_is_written_in_the_v_tile_not_the_k_tile",
               "test_a_prefill_run_of_consecutive_slots_is_written_like_scattered_ones"),
    ),
    "cpu_mla_writes_padding_slots": Regression(
        "CPU_MLA's do_kv_cache_update no longer drops the -1 padding slots: slot -1 indexes the cache's last row",
        (Edit(CPU_MLA, "        if not valid_mask.all().item():\n", "        if False:\n"),),
        backend="vllm:CPU_MLA", select="latent and write",
        fails=("test_padding_slots_leave_the_latent_cache_untouched", "test_latent_records_land_in_their_slots_and_nothing_else_changes"),
        passes=("test_latent_rows_are_read_through_their_strides",),
    ),
    "cpu_mla_rope_first": Regression(
        "CPU_MLA's do_kv_cache_update stores k_pe before kv_c in each record (the record order of another layout)",
        (Edit(CPU_MLA, CPU_MLA_ROWS, CPU_MLA_ROWS.replace("[slots, :kv_lora_rank]", "[slots, pe_dim:]").replace("[slots, kv_lora_rank:]", "[slots, :pe_dim]")),),
        backend="vllm:CPU_MLA", select="latent and (write or equivalence)",
        fails=("test_latent_records_land_in_their_slots_and_nothing_else_changes", "test_latent_rows_are_read_through_their_strides",
               "test_every_declared_block_size_and_the_last_layer_are_written_at_reference_offsets",
               "test_last_block_of_a_latent_cache_past_2_31_bytes_is_written", "test_golden_records_hash_to_the_stored_digest_of_their_format"),
        passes=("test_padding_slots_leave_the_latent_cache_untouched",),
    ),
}


class _EditedSource(importlib.machinery.SourceFileLoader):
    """Loads one module from its source with the edits applied (never from its bytecode cache)."""

    def __init__(self, fullname, path, edits):
        super().__init__(fullname, path)
        self.edits = edits

    def get_code(self, fullname):
        source = self.get_data(self.path).decode()
        for edit in self.edits:
            count = source.count(edit.old)
            if count != 1:
                raise RuntimeError(f"{ENV}: {self.path} contains the text to edit {count} times, not once "
                                   f"(a vLLM other than 0.33.0?):\n{edit.old}")
            source = source.replace(edit.old, edit.new)
        # Triton reads a kernel's source through inspect/linecache: it must see the edit too
        # (mtime None: linecache.checkcache leaves the entry alone).
        linecache.cache[self.path] = (len(source), None, source.splitlines(True), self.path)
        return compile(source, self.path, "exec", dont_inherit=True)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, edits: dict[str, list[Edit]]):
        self.edits = edits

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.edits:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.origin is None:
            raise RuntimeError(f"{ENV}: cannot find vLLM module {fullname} to edit")
        return importlib.util.spec_from_file_location(fullname, spec.origin, loader=_EditedSource(fullname, spec.origin, self.edits[fullname]))


def install_from_env() -> str | None:
    """Apply the regression ``$KVCONFORM_VLLM_REGRESSION`` names (before vLLM is imported)."""
    name = os.environ.get(ENV)
    if not name:
        return None
    if name not in REGRESSIONS:
        raise RuntimeError(f"{ENV}={name}: unknown; known: {', '.join(REGRESSIONS)}")
    edits: dict[str, list[Edit]] = {}
    for edit in REGRESSIONS[name].edits:
        edits.setdefault(edit.module, []).append(edit)
    if any(module in sys.modules for module in edits):
        raise RuntimeError(f"{ENV}={name}: {', '.join(edits)} already imported; the regression must be installed first")
    sys.meta_path.insert(0, _Finder(edits))
    return name
