"""The latent part of the backend contract (SPEC §17 LATENT-DECLARE): what a backend may declare is
checked when it declares it, and a latent-only backend is a backend."""

import pytest
import torch
from kvconform.backends_under_test.contract import Capabilities
from kvconform.backends_under_test.latent_contract import LATENT_OPS, LatentCapabilities
from kvconform.backends_under_test.reference_mla import ReferenceMLA

from kvconform import reference as R

MLA = R.latent.LatentFormat(kind="mla")


def test_a_latent_only_backend_declares_no_layout_and_every_latent_op():
    caps = ReferenceMLA().capabilities
    assert caps.layouts == () and caps.latent.ops == LATENT_OPS
    assert {f.kind for f in caps.latent.formats} == {"mla", "fp8_ds_mla", "indexer"}


@pytest.mark.parametrize("declaration, words", [
    ({"formats": (MLA,), "ops": frozenset({"latent_write", "latent_scribble"})}, "unknown ops"),
    ({"formats": (), "ops": frozenset({"latent_write"})}, "at least one record format"),
    ({"formats": ("mla",), "ops": frozenset({"latent_write"})}, "kinds"),
    ({"formats": (MLA,), "ops": frozenset({"latent_write"}), "block_sizes": (0,)}, "must be positive"),
])
def test_a_latent_declaration_the_contract_cannot_hold_is_refused_when_made(declaration, words):
    with pytest.raises(ValueError, match=words):
        LatentCapabilities(**declaration)


def test_a_record_the_reference_cannot_lay_out_is_refused_before_any_capability_exists():
    with pytest.raises(ValueError, match="fp8_ds_mla needs"):
        R.latent.LatentFormat(kind="fp8_ds_mla", kv_lora_rank=256)
    with pytest.raises(ValueError, match="declare at least one layout"):
        Capabilities(layouts=(), ops=frozenset(), dtypes=(torch.bfloat16,))


def test_a_backend_that_did_not_load_is_one_errored_case_of_a_latent_check_not_a_collection_error():
    from kvconform.backends_under_test.registry import Loaded
    from kvconform.conformance.harness.applicability import CaseParam
    from kvconform.conformance.harness.sweeps import expand

    broken = CaseParam(Loaded("acme", error="ImportError: no module named acme_kernels"), None)
    names, values, ids = expand(["case", "latent_format"], [broken], ("mla",))
    assert names == ["case_param", "latent_format"] and values == [(broken, None)] and ids == ["acme"]
