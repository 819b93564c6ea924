"""``reference_quant``: a model of vLLM 0.33.0 TRITON_ATTN's per-token-head caches, written
through tensor views the way vLLM builds them, not through the reference's offset map: the
logical ``(B, H, N, C)`` cache in HND or NHD strides, float32 scale views carved from its storage
by its strides (``_ensure_scale_caches``), K/V data views by ``transpose(1, 2).split``
(``_pth_key_value_caches``). The checks hold it against reference/quant_codecs.py.

Each step is a method so that a mutant (mutants/quant.py) replaces exactly one.
"""

from __future__ import annotations

import torch

from kvconform.reference import quant_codecs as QC
from kvconform.reference import quant_layouts as QL

from .contract import Backend, Capabilities
from .quant_contract import QuantCapabilities, QuantOps, QuantSpec


class ReferenceQuant(Backend, QuantOps):
    name = "reference_quant"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(layouts=(), ops=frozenset(), quant=QuantCapabilities(modes=QL.MODES))

    def allocate(self, buffer, spec):
        raise NotImplementedError("reference_quant keeps per-token-head caches only (quant_allocate)")

    # ------------------------------------------------------------------ views
    def strides(self, g: QL.QuantGeometry) -> tuple[int, ...]:
        """Byte strides of the logical ``(B, H, N, C)`` per layer."""
        return g.strides()

    def quant_allocate(self, buffer: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
        g = spec.geometry
        cache = torch.as_strided(buffer, (g.num_layers, *g.shape()), (g.layer_bytes(), *self.strides(g)), buffer.storage_offset())
        self.initialise_scales(cache, spec)
        return cache

    def initialise_scales(self, cache: torch.Tensor, spec: QuantSpec) -> None:
        """The first use of a layer: its scale views are built and filled with 1.0."""
        for view in self.scale_views(cache[spec.layer]):
            view.fill_(1.0)

    def scale_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V float32 scales ``[B, N, H]`` over the cache's storage, from its strides."""
        B, H, N, C = kv_cache.shape
        D = C // 2 - QL.SCALE_BYTES
        f32 = torch.tensor([], dtype=torch.float32, device=kv_cache.device).set_(kv_cache.untyped_storage())
        sb, sh, sn, _ = (s // 4 for s in kv_cache.stride())
        base = kv_cache.storage_offset() // 4
        return tuple(torch.as_strided(f32, (B, N, H), (sb, sn, sh), base + offset // 4) for offset in (D, C // 2 + D))

    def data_views(self, kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V codes ``[B, N, H, D]`` (uint8 views of the cache)."""
        padded = kv_cache.shape[-1] // 2
        key, value = kv_cache.transpose(1, 2).split(padded, dim=-1)
        return key[..., : padded - QL.SCALE_BYTES], value[..., : padded - QL.SCALE_BYTES]

    # ------------------------------------------------------------------ ops
    def encode(self, key: torch.Tensor, value: torch.Tensor, g: QL.QuantGeometry):
        """(K codes, K scales), (V codes, V scales) of rows ``[T, H, D]``."""
        return QC.encode(key, g.mode, self.platform, self.arch()), QC.encode(value, g.mode, self.platform, self.arch())

    def valid_rows(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(slot_mapping >= 0).flatten()

    def quant_write(self, cache, key, value, slot_mapping, spec: QuantSpec) -> None:
        g, kv_cache = spec.geometry, cache[spec.layer]
        rows = self.valid_rows(slot_mapping)
        slots = slot_mapping[rows].long()
        blocks, within = slots // g.block_size, slots % g.block_size
        (k_codes, k_scales), (v_codes, v_scales) = self.encode(key[: len(slot_mapping)][rows], value[: len(slot_mapping)][rows], g)
        k_data, v_data = self.data_views(kv_cache)
        k_scale, v_scale = self.scale_views(kv_cache)
        k_data[blocks, within], v_data[blocks, within] = k_codes, v_codes
        k_scale[blocks, within], v_scale[blocks, within] = k_scales, v_scales

    def dequantised(self, cache, block_table, seq_lens, spec: QuantSpec):
        """float32 K, V ``[S, T, H, D]`` of every sequence and the valid mask, read through the views."""
        g, kv_cache = spec.geometry, cache[spec.layer]
        positions = torch.arange(int(seq_lens.max()), device=kv_cache.device)
        valid = positions[None, :] < seq_lens[:, None]
        blocks = torch.where(valid, block_table[:, positions // g.block_size], 0)
        within = (positions % g.block_size)[None, :].expand_as(blocks)
        out = []
        for data, scale in zip(self.data_views(kv_cache), self.scale_views(kv_cache)):
            values = self.decode_values(data[blocks, within], scale[blocks, within], g)
            out.append(values.masked_fill(~valid[..., None, None], 0.0))
        return out[0], out[1], valid

    def decode_values(self, codes: torch.Tensor, scales: torch.Tensor, g: QL.QuantGeometry) -> torch.Tensor:
        return QC.decode(codes, scales, g.mode, self.platform, self.arch())

    def quant_decode(self, cache, query, block_table, seq_lens, spec: QuantSpec, *, scale: float) -> torch.Tensor:
        k, v, valid = self.dequantised(cache, block_table, seq_lens, spec)
        group = query.shape[1] // spec.geometry.num_kv_heads
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
        scores = torch.einsum("shd,sthd->sht", query.float(), k) * scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        return torch.einsum("sht,sthd->shd", torch.softmax(scores, dim=-1), v).to(query.dtype)

    def quant_copy(self, cache, block_mapping, spec: QuantSpec) -> None:
        for src, dst in block_mapping.tolist():
            cache[:, dst] = cache[:, src]  # a page: every head, slot and byte (codes and scales), every layer

    def quant_regions(self, cache, spec: QuantSpec, block_ids, heads: range) -> list[tuple[int, int]]:
        """Runs of whole cells, read off the cache's strides: a cell holds its head's scales."""
        g = spec.geometry
        s_l, s_b, s_h, s_n, _ = cache.stride()
        runs = []
        for layer in range(g.num_layers):
            for b in block_ids:
                start = layer * s_l + b * s_b + heads.start * s_h
                if s_h == g.block_size * g.cell_bytes:  # HND: the slice's cells are one run per block
                    runs.append((start, len(heads) * s_h))
                else:  # NHD: one run per slot
                    runs += [(start + n * s_n, len(heads) * s_h) for n in range(g.block_size)]
        return runs

    def quant_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids) -> None:
        dst_cache[:, dst_ids.to(dst_cache.device)] = src_cache[:, src_ids.to(src_cache.device)].to(dst_cache.device)
