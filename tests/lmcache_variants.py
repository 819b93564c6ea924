"""A deliberately broken LMCache adapter, to show the connector checks can fail on LMCache's kernel:
it hands LMCache's transfer the kv-first format for a blocks-first cache (a wrong EngineKVFormat)."""

from kvconform.backends_under_test.lmcache_connector import LMCacheTorchNHD


class KvFirstFormatOnBlocksFirst(LMCacheTorchNHD):
    name = "lmcache_wrong_format"

    def discover(self, cache):
        _, layers = super().discover(cache)
        return self._lmc.native.EngineKVFormat.NL_X_TWO_NB_BS_NH_HS, [t.transpose(0, 1) for t in layers]
