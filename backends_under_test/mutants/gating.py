"""Seeded faults of backend selection: what a backend declares about the connector and the
configurations it validates.
"""

from __future__ import annotations

from kvconform import reference as R

from . import mutant
from .base import Mutant


@mutant("kv_first_claims_connector")
class KvFirstClaimsConnector(Mutant):
    """ROCM_ATTN-style kv-first cache that still says ``supports_kv_connector() = True`` (F.17)."""

    catches = ("gating",)
    kills = ("test_connector_support_matches_the_layouts",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def supports_kv_connector(self):
        return True


@mutant("selector_ignores_connector")
class SelectorIgnoresConnector(Mutant):
    """ROCM_ATTN-style kv-first backend that declares no connector support, but the platform's
    priority list still offers it when a connector is configured (GATE-SELECTOR, F.1)."""

    catches = ("gating",)
    kills = ("test_selector_offers_a_connector_configuration_only_backends_that_support_one",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def selection_order(self, *, use_kv_connector):
        return [self.name]


@mutant("validate_drops_connector_flag")
class ValidateDropsConnectorFlag(Mutant):
    """A ``validate_configuration`` override on a kv-first backend that does not forward
    ``use_kv_connector`` to the base class: it declares no connector support, yet a connector
    configuration validates clean (GATE-REJECT; ROCM_AITER_MLA must forward it)."""

    catches = ("gating",)
    kills = ("test_connector_configuration_is_rejected_iff_unsupported",)

    def __init__(self):
        super().__init__(layouts=(R.kv_first("NHD"),), standards=frozenset())

    def validate_configuration(self, *, head_size, dtype, kv_cache_dtype, block_size, use_kv_connector):
        return super().validate_configuration(head_size=head_size, dtype=dtype, kv_cache_dtype=kv_cache_dtype, block_size=block_size, use_kv_connector=False)


@mutant("validate_rejects_declared_head_size")
class ValidateRejectsDeclaredHeadSize(Mutant):
    """``validate_configuration`` tests ``head_size > min`` instead of membership: the smallest
    declared head size is rejected, so selection skips a backend that supports it."""

    catches = ("gating",)
    kills = ("test_supported_configuration_has_no_other_reasons",)

    def validate_configuration(self, *, head_size, **kwargs):
        reasons = super().validate_configuration(head_size=head_size, **kwargs)
        if head_size <= min(self.capabilities.head_sizes):
            reasons.append("head_size not supported")
        return reasons


@mutant("blocks_first_denies_connector")
class BlocksFirstDeniesConnector(Mutant):
    """A blocks-first backend that declares no connector support: selection loses it for nothing."""

    catches = ("gating",)
    kills = ("test_connector_support_matches_the_layouts",)

    def supports_kv_connector(self):
        return False
