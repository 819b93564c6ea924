"""The ``reference_mla`` backend: kvconform's latent-cache spec (``reference/latent.py``) wearing the
backend contract — the plain MLA cache, ``fp8_ds_mla`` records and the DSA indexer cache, every latent
op. It keeps no K/V cache (``layouts=()``): the K/V checks are not applicable to it by declaration.
The latent mutants subclass it and break one thing each.
"""

from __future__ import annotations

import torch

from kvconform import reference as R

from .contract import Backend, Capabilities
from .latent_contract import LATENT_OPS, LatentCapabilities, LatentSpec


def latent_formats(platform: str = "cpu", arch: str = "") -> tuple:
    """Every record format vLLM 0.33.0 writes, on ``platform``: plain MLA (576 wide in bf16, fp16,
    per-tensor fp8 e4m3 and e5m2; a narrower 256 + 32 latent), fp8_ds_mla, the indexer with each scale format."""
    LF = R.latent.LatentFormat
    on = {"platform": platform, "arch": arch}
    return (
        LF(kind="mla", **on), LF(kind="mla", model_dtype=torch.float16, **on), LF(kind="mla", kv_lora_rank=256, rope_dim=32, **on),
        LF(kind="mla", cache_dtype="fp8", **on), LF(kind="mla", cache_dtype="fp8_e5m2", **on),
        LF(kind="fp8_ds_mla", **on),
        *(LF(kind="indexer", scale_format=s, **on) for s in R.latent.INDEXER_SCALE_FORMATS),
    )


def region_of(cache: torch.Tensor, spec: LatentSpec) -> torch.Tensor:
    """The flat uint8 bytes (``spec.geometry.nbytes()``) a latent cache tensor views."""
    flat = torch.as_strided(cache, (cache.numel(),), (1,), cache.storage_offset())
    return flat.view(torch.uint8)[: spec.geometry.nbytes()]


def on_cpu(regions, op) -> None:
    """Run ``op`` on CPU copies of device ``regions`` and copy them back (the reference is CPU code)."""
    if all(r.device.type == "cpu" for r in regions):
        op(*regions)
        return
    copies = [r.cpu() for r in regions]
    op(*copies)
    for region, copy in zip(regions, copies):
        region.copy_(copy)


class ReferenceMLA(Backend):
    name = "reference_mla"

    def __init__(self, formats=None, block_sizes=(16, 64), num_layers=(1, 3)):
        self._capabilities = Capabilities(
            layouts=(), ops=frozenset(),
            latent=LatentCapabilities(formats=tuple(formats or latent_formats(self.platform, self.arch())), ops=LATENT_OPS,
                                      block_sizes=block_sizes, num_layers=num_layers),
        )

    @property
    def capabilities(self) -> Capabilities:
        return self._capabilities

    def allocate(self, buffer, spec):
        raise NotImplementedError("reference_mla keeps latent caches only")

    def latent_allocate(self, buffer, spec):
        return buffer.view(spec.fmt.storage_dtype()).view(spec.geometry.shape())

    def latent_write(self, cache, kv_c, k_pe, slot_mapping, spec, *, scale):
        g, fmt = spec.geometry, spec.fmt
        if fmt.kind == "fp8_ds_mla":
            write = lambda region: R.latent.concat_and_cache_ds_mla(kv_c.cpu(), k_pe.cpu(), region, g, slot_mapping, layer=spec.layer)
        else:
            write = lambda region: R.latent.concat_and_cache_mla(kv_c.cpu(), k_pe.cpu(), region, g, slot_mapping, scale=scale, layer=spec.layer)
        on_cpu([region_of(cache, spec)], write)

    def latent_grouped_write(self, per_layer_cache, kv_cs, k_pes, slot_mappings, specs, *, scales):
        regions = [region_of(cache, spec) for cache, spec in zip(per_layer_cache, specs)]
        on_cpu(regions, lambda *cpu: R.latent.concat_and_cache_mla_grouped([x.cpu() for x in kv_cs], [x.cpu() for x in k_pes], list(cpu),
                                                                           [s.geometry for s in specs], [m.cpu() for m in slot_mappings],
                                                                           scales=None if scales is None else scales.cpu()))

    def indexer_write(self, cache, k, slot_mapping, spec):
        on_cpu([region_of(cache, spec)], lambda region: R.latent.indexer_k_quant_and_cache(k.cpu(), region, spec.geometry, slot_mapping, layer=spec.layer))

    def latent_gather(self, cache, block_table, seq_lens, spec, *, scale):
        return R.latent.gather_latent(region_of(cache, spec).cpu(), spec.geometry, block_table, seq_lens, scale=scale, layer=spec.layer).to(cache.device)

    def indexer_gather(self, cache, block_table, seq_lens, spec):
        values, scales = R.latent.gather_indexer(region_of(cache, spec).cpu(), spec.geometry, block_table, seq_lens, layer=spec.layer)
        return values.to(cache.device), scales.to(cache.device)

    def latent_decode(self, query, cache, block_table, seq_lens, spec, *, scale, softmax_scale):
        out = R.latent.mla_decode(query.cpu(), region_of(cache, spec).cpu(), spec.geometry, block_table, seq_lens, scale=scale,
                                  softmax_scale=softmax_scale, layer=spec.layer)
        return out.to(query.device)

    def latent_copy(self, cache, block_mapping, spec):
        on_cpu([region_of(cache, spec)], lambda region: R.latent.copy_latent_blocks(region, spec.geometry, block_mapping.cpu()))

    def latent_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids):
        on_cpu([region_of(src_cache, src_spec), region_of(dst_cache, dst_spec)],
               lambda src, dst: R.latent.swap_latent_blocks(src, src_spec.geometry, dst, dst_spec.geometry, src_ids.cpu(), dst_ids.cpu()))

    def latent_regions(self, spec, blocks, heads=None):
        if heads is not None:
            raise ValueError("a latent cache is replicated across TP ranks: it has no head slice (LATENT-TP-SOURCE)")
        return R.latent.block_byte_ranges(spec.geometry, blocks)

    def latent_transfer_plan(self, producer_tp, consumer_tp, consumer_rank, blocks):
        return sorted(R.latent.replicated_block_sources(producer_tp, consumer_tp, consumer_rank, blocks).items())


class Gfx942ReferenceMLA(ReferenceMLA):
    """The latent reference as an MI300 (gfx942) runs it: e4m3fnuz codes, scale divisor 224."""

    platform = "rocm"

    def arch(self):
        return "gfx942"
