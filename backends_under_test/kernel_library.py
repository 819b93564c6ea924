"""What every adapter of a kernel library (AITER's writer, FlashInfer's append and decode) shares:
connector gating belongs to an attention engine (vLLM's backend classes), not to a kernel library,
and the cache a library gets is the layout's strided view of the suite's buffer."""

from __future__ import annotations

from .contract import Backend, OpUnavailable
from .reference_backend import view_over


class KernelLibrary(Backend):
    """``library``: the library and its version, as not-applicable reasons name it."""

    library: str

    def _engine_only(self, what: str):
        # The gating checks are not applicable, and peers in the connector interop row see no connector.
        raise OpUnavailable(f"{what} is an attention engine's (vLLM's), not a kernel library's", who=self.library)

    def supports_kv_connector(self):
        return False

    def connector_layouts(self):
        self._engine_only("the layouts a KV connector runs with")

    def validate_configuration(self, **_):
        self._engine_only("validate_configuration()")

    def allocate(self, buffer, spec):
        return view_over(buffer, spec)
