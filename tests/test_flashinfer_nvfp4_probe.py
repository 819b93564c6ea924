"""The FlashInfer NVFP4 probe's judging (tests/real_kernels_gpu/flashinfer_nvfp4_probe.py) on the CPU,
with stand-in writers in place of FlashInfer's kernel: the reference's own writer agrees in every
field; a writer that stores V's scales linearly through vLLM's views (what FlashInfer's kernel does
with the strides it is given) is named by field and coordinates and matches the linear variant; a
writer with another block-scale rounding, or one that takes slot -1 as the last slot, is told
apart. The probe's copy of vLLM's page views is held equal to vLLM's own, read from its sdist."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from . import vllm_sdist
from .real_kernels_gpu import flashinfer_nvfp4_probe as P
from .suite_runs import ROOT

SWIZZLED, LINEAR = "NVFP4 (V scales swizzled)", "variant: V scales linear"
ROUNDED_UP = "e4m3 rounded up from amax / (6·s)"


def reference_writer(kv_cache, key, value, slots, k_scale, v_scale, g):
    QC.write(key, value, kv_cache.as_strided((g.nbytes(),), (1,), 0), g, slots, k_scale=k_scale, v_scale=v_scale)


def write_through_views(data_views, scale_views, layout, key, value, slots, k_scale, v_scale, block_size, block_scales):
    """FlashInfer's kernel (page.cuh:556-617) in torch: each (token, head) at its views' strides, so
    V's scales land where the view says (linear); ``block_scales(x, s)`` picks the rounding."""
    rows = torch.nonzero(slots >= 0).flatten()
    b, t, h = slots[rows, None] // block_size, slots[rows, None] % block_size, torch.arange(key.shape[1])
    at = (b, h, t) if layout == "HND" else (b, t, h)
    for data, sf_view, x, s in zip(data_views, scale_views, (key, value), (k_scale, v_scale)):
        sf = block_scales(x[rows], s)
        data[at], sf_view.view(torch.uint8)[at] = P.codes_from_scales(x[rows], sf, s), sf


def views_writer(block_scales=lambda x, s: QC.nvfp4_encode(x, s)[1]):
    def write(kv_cache, key, value, slots, k_scale, v_scale, g):
        data, scales, layout = P.nvfp4_kv_views(kv_cache, g.num_kv_heads)
        write_through_views(data, scales, layout, key, value, slots, k_scale, v_scale, g.block_size, block_scales)
    return write


def differing(case, against):
    return {name for name, v in case["verdicts"][against].items() if v["differ"]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("order", QL.ORDERS)
def test_the_references_own_writer_agrees_in_every_field_and_hypothesis(order, dtype):
    case = P.run_case(reference_writer, order, 1.0, 2.0, dtype=dtype)
    assert differing(case, SWIZZLED) == set()
    h = case["hypotheses"]
    assert h["v_scale_placement"]["swizzled"] == h["v_scale_placement"]["of"] > h["v_scale_placement"]["linear"]
    assert h["block_scale_rounding"]["reference: e4m3 RNE of (1/s)·(amax·rcp(6))"] == h["block_scale_rounding"]["of"]
    assert h["block_scale_rounding"][ROUNDED_UP] < h["block_scale_rounding"]["of"]  # the e4m3 ties are in the data
    assert h["codes_at_stored_scales"]["agree"] == h["codes_at_stored_scales"]["of"]


@pytest.mark.parametrize("order", QL.ORDERS)
def test_linear_v_scales_are_named_as_v_scales_with_their_coordinates(order):
    whole_tiles = [*range(16, 24), -1, *range(36, 40)]
    case = P.run_case(views_writer(), order, 1.0, 2.0, slot_mapping=whole_tiles)
    assert differing(case, SWIZZLED) == {"V scales"}
    first = case["verdicts"][SWIZZLED]["V scales"]["first"]
    assert (first["block"], first["slot"], first["head"]) == (2, 0, 0) and first["expected"] != first["actual"]
    assert differing(case, LINEAR) == set()
    assert case["hypotheses"]["v_scale_placement"]["linear"] == case["hypotheses"]["v_scale_placement"]["of"]


def test_linear_v_scales_of_a_partial_tile_also_overwrite_bytes_the_swizzle_gives_other_slots():
    case = P.run_case(views_writer(), "HND", 1.0, 2.0)
    assert differing(case, SWIZZLED) == {"V scales", "untouched"}
    first = case["verdicts"][SWIZZLED]["untouched"]["first"]
    assert (first["block"], first["field"]) == (3, "v_scale") and first["slot"] not in (0, 1)  # slots 0, 1 of block 3 are written
    assert differing(case, LINEAR) == set()


@pytest.mark.parametrize("global_scales", P.GLOBAL_SCALES)
def test_block_scales_rounded_up_are_told_apart_from_round_to_nearest(global_scales):
    rounded_up = views_writer(lambda x, s: P.block_scale_candidates(x, s)[ROUNDED_UP])
    case = P.run_case(rounded_up, "NHD", *global_scales)
    assert {"K scales", "K data"} <= differing(case, LINEAR)
    h = case["hypotheses"]
    assert h["block_scale_rounding"][ROUNDED_UP] == h["block_scale_rounding"]["of"] > h["block_scale_rounding"]["e4m3 RNE of amax / (6·s)"]
    assert h["codes_at_stored_scales"]["agree"] == h["codes_at_stored_scales"]["of"]


def test_a_writer_that_takes_slot_minus_one_as_the_last_slot_is_caught_as_untouched_bytes_changed():
    def wraps_padding(kv_cache, key, value, slots, k_scale, v_scale, g):
        reference_writer(kv_cache, key, value, torch.where(slots < 0, g.num_blocks * g.block_size - 1, slots), k_scale, v_scale, g)

    case = P.run_case(wraps_padding, "HND", 0.75, 1.25)
    assert differing(case, SWIZZLED) == {"untouched"}
    first = case["verdicts"][SWIZZLED]["untouched"]["first"]
    assert (first["block"], first["slot"]) == (P.GEOMETRY["num_blocks"] - 1, P.GEOMETRY["block_size"] - 1)


def test_the_flashinfer_writer_makes_vllms_call(monkeypatch):
    """The GPU-only part, with a stand-in ``flashinfer`` module of the documented signature
    (flashinfer/page.py:920-929): tuples of data and scale views, float32 scalar global scales."""
    def append(key, value, slot_mapping, paged_kv_cache, kv_cache_sf, k_scale, v_scale, kv_layout="NHD"):
        assert k_scale.dtype == v_scale.dtype == torch.float32 and k_scale.numel() == v_scale.numel() == 1
        assert all(v.dtype == torch.float8_e4m3fn for v in kv_cache_sf) and slot_mapping.dtype == torch.int64
        write_through_views(paged_kv_cache, kv_cache_sf, kv_layout, key, value, slot_mapping, float(k_scale), float(v_scale),
                            P.GEOMETRY["block_size"], lambda x, s: QC.nvfp4_encode(x, s)[1])

    monkeypatch.setitem(sys.modules, "flashinfer", types.SimpleNamespace(nvfp4_quantize_append_paged_kv_cache_with_slot_mapping=append))
    for order in QL.ORDERS:
        case = P.run_case(P.flashinfer_writer, order, 0.75, 1.25)
        assert differing(case, LINEAR) == set() and differing(case, SWIZZLED) == {"V scales", "untouched"}


def test_the_committed_h200_run_found_linear_v_scales_and_nothing_else_off_the_reference():
    """docs/QUANT.md's finding, from the run it cites: FlashInfer 0.7.2.post1 on an H200."""
    run = json.loads((ROOT / "docs" / "runs" / "flashinfer-nvfp4-h200" / "nvfp4-probe.json").read_text())
    assert (run["flashinfer"], run["device"], len(run["cases"])) == ("0.7.2.post1", "NVIDIA H200", 8)
    for case in run["cases"]:
        assert differing(case, LINEAR) == set() and differing(case, SWIZZLED) == {"V scales", "untouched"}
        assert case["verdicts"][SWIZZLED]["untouched"]["first"]["block"] == 3  # the partial tile's rows
        assert case["hypotheses"]["block_scales_off_the_reference"] == []


def test_the_summary_names_each_field_and_hypothesis():
    lines = P.summary(P.run_case(views_writer(), "NHD", 1.0, 2.0))
    text = "\n".join(lines)
    assert "V scales: " in text and "differ, first at block 2, slot 0, head 0" in text
    assert "K data: agree" in text and "V scales placed swizzled" in text and "stored scales" in text


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM 0.33.0's ``_nvfp4_kv_views`` and ``nvfp4_split_data_scale``, loaded without vLLM."""
    src = vllm_sdist.read_sources(vllm_sdist.sdist(tmp_path_factory), ("vllm/v1/attention/backends/flashinfer.py", "vllm/utils/torch_utils.py"))
    return vllm_sdist.load_module(tmp_path_factory.mktemp("views"), "vllm_nvfp4_views", "\n\n".join((
        "import torch\n_KVPair = tuple\n", vllm_sdist.definitions(src["vllm/utils/torch_utils.py"], "nvfp4_split_data_scale"),
        vllm_sdist.definitions(src["vllm/v1/attention/backends/flashinfer.py"], "_nvfp4_kv_views"))))


@pytest.mark.parametrize("order", QL.ORDERS)
def test_the_probes_page_views_are_vllms(vllm, order):
    g = P.geometry(order)
    cache = torch.as_strided(torch.zeros(g.nbytes(), dtype=torch.uint8), g.shape(), g.strides())
    ours, theirs = P.nvfp4_kv_views(cache, g.num_kv_heads), vllm._nvfp4_kv_views(cache, g.num_kv_heads)
    assert ours[2] == theirs[2] == order
    for a, b in zip((*ours[0], *ours[1]), (*theirs[0], *theirs[1])):
        assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(), b.dtype)
