"""A quantised-cache check is not applicable, by declaration, where the backend declares no
geometry the mode can take (harness/quant.py ``quant_spec``; SPEC NVFP4-PAGE: nvfp4 needs
block_size % 4 == 0 and head_size % 64 == 0) — never a pass on a geometry it did not declare."""

from types import SimpleNamespace

import pytest

from kvconform.backends_under_test.quant_contract import QuantCapabilities
from kvconform.conformance.harness import quant as Q
from kvconform.conformance.harness.applicability import DECLARATION, NotApplicableHere


def case_declaring(**quant) -> SimpleNamespace:
    caps = SimpleNamespace(quant=QuantCapabilities(modes=("int8_per_token_head", "nvfp4"), **quant))
    return SimpleNamespace(backend=SimpleNamespace(name="acme", capabilities=caps))


@pytest.mark.parametrize("quant, why", [
    (dict(block_sizes=(6,)), "nvfp4 needs block_size % 4 == 0"),
    (dict(head_sizes=(32, 80)), "nvfp4 needs head_size % 64 == 0"),
], ids=["block-6", "heads-32-80"])
def test_an_nvfp4_geometry_the_swizzle_cannot_tile_is_not_applicable_by_declaration(quant, why):
    with pytest.raises(NotApplicableHere) as raised:
        Q.quant_spec(case_declaring(**quant), "quant_write", "nvfp4", "HND")
    reason = raised.value.reason
    assert reason.kind == DECLARATION and why in reason.what, reason


def test_the_first_declared_geometry_the_mode_can_take_is_used():
    case = case_declaring(block_sizes=(6, 16), head_sizes=(32, 128))
    g = Q.quant_spec(case, "quant_write", "nvfp4", "NHD").geometry
    assert (g.block_size, g.head_size) == (16, 128)
    assert Q.quant_spec(case, "quant_write", "int8_per_token_head", "NHD").geometry.block_size == 6  # no such rule for the per-token-head modes
