"""Seeded faults of one class: an op that computes right and changes the inputs it was given
(SPEC OP-INPUTS-UNCHANGED). Each caller of such a kernel sees its own tensors change — vLLM
reuses ``slot_mapping``, the scales and the block tables across layers and steps — and before
the suite handed ops copies of their inputs (conformance/harness/oracle_guard.py) a decode that
scaled ``query`` in place also bent the expected value computed from it."""

from __future__ import annotations

from ..reference_backend import ReferenceBackend
from . import mutant


class InputMutant(ReferenceBackend):
    catches: tuple[str, ...] = ()  # check families that must fail (base.Mutant)
    suite_args: tuple[str, ...] = ()


@mutant("write_destroys_its_inputs")
class WriteDestroysItsInputs(InputMutant):
    """Writes every token right, then uses ``key``, ``value``, ``slot_mapping`` and ``k_scale`` as
    scratch: zeroes the rows, marks every slot padding, zeroes the scale."""

    catches = ("write",)
    kills = ("test_padding_slots_leave_cache_untouched",)

    def write(self, cache, key, value, slot_mapping, spec, *, k_scale, v_scale):
        super().write(cache, key, value, slot_mapping, spec, k_scale=k_scale, v_scale=v_scale)
        key.zero_()
        value.zero_()
        slot_mapping.fill_(-1)
        k_scale.zero_()


@mutant("decode_scales_query_in_place")
class DecodeScalesQueryInPlace(InputMutant):
    """Ignores the softmax scale (decodes with scale 1), then multiplies the caller's ``query`` in
    place by ``1 / scale``: an oracle computed from that query afterwards expects the same wrong
    output (it passed every read check before the suite handed ops copies)."""

    catches = ("read",)
    kills = ("test_decode_reads_the_last_blocks_of_a_cache_past_2_31_elements",)

    def decode(self, cache, query, block_table, seq_lens, spec, *, scale, k_scale, v_scale):
        out = super().decode(cache, query, block_table, seq_lens, spec, scale=1.0, k_scale=k_scale, v_scale=v_scale)
        query.mul_(1 / scale)
        return out


@mutant("copy_blocks_sorts_its_mapping")
class CopyBlocksSortsItsMapping(InputMutant):
    """Copies every pair right, after sorting ``block_mapping``'s rows in place by source block
    (a kernel that orders its work by reordering the caller's tensor)."""

    catches = ("copy",)
    kills = ("test_copy_blocks_of_the_last_blocks_of_a_cache_past_2_31_elements",)

    def copy_blocks(self, cache, block_mapping, spec):
        block_mapping.copy_(block_mapping[block_mapping[:, 0].argsort()])
        super().copy_blocks(cache, block_mapping, spec)


@mutant("swap_out_consumes_its_ids")
class SwapOutConsumesItsIds(InputMutant):
    """Swaps every block right, then zeroes ``src_ids`` (used as a completion list)."""

    catches = ("swap",)
    kills = ("test_swap_in_restores_blocks_into_other_device_blocks",)

    def swap_out(self, cache, host_cache, src_ids, dst_ids, spec):
        super().swap_out(cache, host_cache, src_ids, dst_ids, spec)
        src_ids.zero_()
