"""Correct backends that claim another platform than the machine they run on: the suite's reference
must be computed for the backend's platform (its fp8 variant and bound), not for the CPU."""

from kvconform.backends_under_test.reference_quant import ReferenceQuant


class ReferenceQuantOnGfx942(ReferenceQuant):
    """The reference's per-token-head writer and reader as an MI300 runs them (e4m3fnuz, bound 224)."""

    name = "reference_quant_on_gfx942"
    platform = "rocm"

    def arch(self):
        return "gfx942"
