"""The golden digests of latent records and quantised caches stay current, and the quantised
golden inputs are exact: every mode decodes them back to themselves on every platform."""

import pytest
import torch

from kvconform.conformance.harness import golden_digest_files, latent_digests, quant_digests
from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL


def test_committed_quant_digests_are_what_the_reference_computes():
    assert quant_digests.load() == quant_digests.reference_digests()


def test_committed_latent_digests_are_what_the_reference_computes():
    assert latent_digests.load() == latent_digests.reference_digests()


def test_fp8_per_token_head_has_one_digest_per_e4m3_variant():
    digests = quant_digests.load()
    assert digests["fp8_per_token_head:HND"] != digests["fp8_per_token_head:HND-fnuz"]
    assert quant_digests.label("fp8_per_token_head", "HND", "rocm", "gfx950") == "fp8_per_token_head:HND"
    assert quant_digests.label("int8_per_token_head", "NHD", "rocm", "gfx942") == "int8_per_token_head:NHD"


def test_a_label_whose_bytes_differ_between_platforms_is_refused():
    with pytest.raises(AssertionError, match="nvfp4:HND hashes differently on rocm/gfx942"):
        golden_digest_files.one_per_label([("nvfp4:HND", "cuda/sm90", "aa"), ("nvfp4:HND", "rocm/gfx942", "bb")])


@pytest.mark.parametrize("platform, arch", golden_digest_files.PLATFORMS)
@pytest.mark.parametrize("mode", QL.MODES)
def test_golden_inputs_decode_to_themselves(mode, platform, arch):
    """Exact inputs: no rounding step (of a scale, a reciprocal or a code) can move a byte."""
    g = quant_digests.golden_spec(mode, "HND").geometry
    key, value, _ = quant_digests.golden_inputs(mode)
    for x, checkpoint_scale in zip((key, value), quant_digests.CHECKPOINT_SCALES):
        data, scales = QC.encoded_fields(x, g, platform=platform, arch=arch, k_scale=checkpoint_scale)
        decoded = QC.decoded_fields(data, scales, g, platform=platform, arch=arch, k_scale=checkpoint_scale)
        assert torch.equal(decoded, x.float()), f"{mode} on {platform}/{arch}: {(decoded != x.float()).sum()} values not exact"
