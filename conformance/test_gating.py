"""Check 8 — connector gating: a backend that may run a connector on a layout that is not
blocks-first with one region per block must declare ``supports_kv_connector() == False``; one
whose layouts all are must not; ``validate_configuration`` rejects a connector with "KV
connector not supported" exactly when support is not declared; and the platform's priority list
never offers a connector configuration a backend that cannot serve one (SPEC §10 GATE-*; F.1, F.17)."""

import pytest

from kvconform import reference as R
from kvconform.backends_under_test.contract import CONNECTOR_NOT_SUPPORTED

from .harness.assertions import assert_equal

pytestmark = [pytest.mark.gating, pytest.mark.kvc_layouts("none")]


def shippable_layouts(case, layouts) -> dict[str, bool]:
    """Per layout: blocks-first and one contiguous region per block (what connectors ship)."""
    g = case.geometry(kv_cache_dtype="auto", num_blocks=3, num_layers=1)
    return {str(layout): R.is_connector_shippable(R.offset_map(layout, g)) for layout in layouts}


def supported_configuration(case) -> dict:
    caps = case.backend.capabilities
    return dict(head_size=caps.head_sizes[0], dtype=caps.dtypes[0], kv_cache_dtype=caps.kv_cache_dtypes[0], block_size=caps.block_sizes[0])


@pytest.mark.kvc_clause("GATE-SUPPORT", "SHAPE-SHIPPABLE")
def test_connector_support_matches_the_layouts(case):
    # Declaring support is safe only if every layout a connector may run with is shippable;
    # declaring none is justified only if some declared layout is not.
    layouts = shippable_layouts(case, case.backend.capabilities.layouts)
    declared = case.backend.supports_kv_connector()
    with_connector = shippable_layouts(case, case.backend.connector_layouts())
    consistent = all(with_connector.values()) if declared else not all(layouts.values())
    assert_equal("gating", case, True, consistent, f"supports_kv_connector() = {declared} for layouts {layouts}, with a connector {with_connector}")


@pytest.mark.kvc_clause("GATE-REJECT")
@pytest.mark.parametrize("use_kv_connector", [True, False], ids=["connector", "no-connector"])
def test_connector_configuration_is_rejected_iff_unsupported(case, use_kv_connector):
    # A declared configuration has no other reason (next check), so the connector reason is the
    # only one allowed: a rejection worded otherwise is still a rejection.
    reasons = case.backend.validate_configuration(**supported_configuration(case), use_kv_connector=use_kv_connector)
    expected = [CONNECTOR_NOT_SUPPORTED] if use_kv_connector and not case.backend.supports_kv_connector() else []
    assert_equal("gating", case, expected, reasons, f"validate_configuration(..., use_kv_connector={use_kv_connector})")


@pytest.mark.kvc_clause("GATE-VALID")
def test_supported_configuration_has_no_other_reasons(case):
    reasons = case.backend.validate_configuration(**supported_configuration(case), use_kv_connector=False)
    assert_equal("gating", case, [], reasons, "validate_configuration for a declared configuration")


@pytest.mark.kvc_clause("GATE-SELECTOR")
@pytest.mark.kvc_needs("selector")
def test_selector_offers_a_connector_configuration_only_backends_that_support_one(case):
    name = case.backend.selection_name()  # as the selector lists it ("ROCM_ATTN", not "vllm:ROCM_ATTN")
    with_connector = case.backend.selection_order(use_kv_connector=True)
    without = case.backend.selection_order(use_kv_connector=False)
    if case.backend.supports_kv_connector():
        assert_equal("gating", case, name in without, name in with_connector, f"{name} offered with a connector (priorities {with_connector}) as without one ({without})")
    else:
        assert_equal("gating", case, False, name in with_connector, f"{name} (supports_kv_connector() = False) in the connector priority list {with_connector}")
