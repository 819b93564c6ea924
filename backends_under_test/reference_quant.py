"""``reference_quant``: a model of vLLM 0.33.0 TRITON_ATTN's per-token-head caches, written
through tensor views the way vLLM builds them, not through the reference's offset map: the
logical ``(B, H, N, C)`` cache in HND or NHD strides, float32 scale views carved from its storage
by its strides (``_ensure_scale_caches``), K/V data views by ``transpose(1, 2).split``
(``_pth_key_value_caches``). The checks hold it against reference/quant_codecs.py.

``nvfp4`` caches are modelled on FlashInfer's views (``_nvfp4_kv_views``, ``nvfp4_split_data_scale``:
each side's data and scale regions viewed from the page, whatever the logical strides say) and on
``reshape_and_cache_nvfp4_kernel``'s stores (K scales linear, V scales at the kernel's own swizzle), or
FlashInfer's on SM80/90/120 (V scales linear like K's) for a cache whose geometry says ``v_scales="linear"``.

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
        return Capabilities(layouts=(), ops=frozenset(), quant=QuantCapabilities(modes=QL.MODES, block_sizes=(16, 32),
                                                                                      v_scales=QL.V_SCALE_PLACEMENTS))

    def allocate(self, buffer, spec):
        raise NotImplementedError("reference_quant keeps per-token-head caches only (quant_allocate)")

    # ------------------------------------------------------------------ views
    def strides(self, g: QL.QuantGeometry) -> tuple[int, ...]:
        """Byte strides of the logical ``(B, H, N, C)`` per layer."""
        return g.strides()

    def quant_allocate(self, buffer: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
        g = spec.geometry
        cache = torch.as_strided(buffer, (g.num_layers, *g.shape()), (g.layer_bytes(), *self.strides(g)), buffer.storage_offset())
        if g.mode != QL.NVFP4:  # FlashInfer's nvfp4 views are built without writing
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

    # ------------------------------------------------------------------ per-token-head
    def encode(self, key: torch.Tensor, value: torch.Tensor, g: QL.QuantGeometry):
        """(K codes, K scales), (V codes, V scales) of rows ``[T, H, D]``."""
        return QC.encode(key, g.mode, self.platform, self.arch()), QC.encode(value, g.mode, self.platform, self.arch())

    def valid_rows(self, slot_mapping: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(slot_mapping >= 0).flatten()

    # ------------------------------------------------------------------ nvfp4
    def nvfp4_views(self, kv_cache: torch.Tensor, g: QL.QuantGeometry) -> dict[str, torch.Tensor]:
        """Each side's data ``[B, N, H, D/2]`` and scale bytes ``[B, N, H, D/16]`` (the scale plane
        of a head as stored: V's swizzled), from the page: ``[K data | K scales | V data | V scales]``."""
        B, N, H = g.num_blocks, g.block_size, g.num_kv_heads
        page = kv_cache.stride(0)
        views = {}
        for side in ("k", "v"):
            start = kv_cache.storage_offset() + (g.side_bytes if side == "v" else 0)
            for field, width, at in (("data", g.data_bytes, 0), ("scale", g.scale_count, H * N * g.data_bytes)):
                inner = (width, H * width) if g.order == "NHD" else (N * width, width)  # (head, slot) strides
                view = torch.as_strided(kv_cache, (B, H, N, width), (page, *inner, 1), start + at)
                views[f"{side}_{field}"] = view.transpose(1, 2)
        return views

    def scale_slots(self, slots: torch.Tensor, g: QL.QuantGeometry, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, column) of each slot's scales ``[T, S]`` in its head's scale plane: K linear, V by
        ``swizzle_scale_offset`` (csrc/nvfp4_kv_cache_kernels.cu:42-48) or, FlashInfer's, linear too."""
        S = g.scale_count
        s = torch.arange(S, device=slots.device)
        if side == "k" or g.v_scales == QL.LINEAR:
            return slots[:, None].expand(-1, S), s.expand(len(slots), -1)
        offset = ((slots[:, None] // 4) * 4 + s // (S // 4)) * S + (s % (S // 4)) * 4 + slots[:, None] % 4
        return offset // S, offset % S

    def nvfp4_encode(self, x: torch.Tensor, k_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed e2m1 ``[T, H, D/2]``, e4m3 scale bytes ``[T, H, D/16]``)."""
        data, scales = QC.nvfp4_encode(x.cpu(), k_scale)
        return data.to(x.device), scales.to(x.device)

    def nvfp4_write(self, cache, key, value, slot_mapping, spec: QuantSpec) -> None:
        g = spec.geometry
        views = self.nvfp4_views(cache[spec.layer], g)
        rows = self.valid_rows(slot_mapping)
        slots = slot_mapping[rows].long()
        blocks, within = slots // g.block_size, slots % g.block_size
        heads = torch.arange(g.num_kv_heads, device=slots.device)
        for side, x, checkpoint in (("k", key, spec.k_scale), ("v", value, spec.v_scale)):
            data, scales = self.nvfp4_encode(x[: len(slot_mapping)][rows], checkpoint)
            views[f"{side}_data"][blocks, within] = data
            row, col = self.scale_slots(within, g, side)
            views[f"{side}_scale"][blocks[:, None, None], row[:, None, :], heads[None, :, None], col[:, None, :]] = scales

    def nvfp4_dequantised(self, kv_cache, blocks, within, spec: QuantSpec):
        """float32 K, V ``[S, T, H, D]`` at ``(blocks, within)`` ``[S, T]``."""
        g = spec.geometry
        views = self.nvfp4_views(kv_cache, g)
        heads = torch.arange(g.num_kv_heads, device=blocks.device)
        out = []
        for side, checkpoint in (("k", spec.k_scale), ("v", spec.v_scale)):
            row, col = self.scale_slots(within.flatten(), g, side)
            row, col = row.reshape(*within.shape, 1, -1), col.reshape(*within.shape, 1, -1)
            scales = views[f"{side}_scale"][blocks[..., None, None], row, heads[:, None], col]
            out.append(QC.nvfp4_decode(views[f"{side}_data"][blocks, within].cpu(), scales.cpu(), checkpoint).to(kv_cache.device))
        return out

    # ------------------------------------------------------------------ ops
    def quant_write(self, cache, key, value, slot_mapping, spec: QuantSpec) -> None:
        if spec.geometry.mode == QL.NVFP4:
            return self.nvfp4_write(cache, key, value, slot_mapping, spec)
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
        if g.mode == QL.NVFP4:
            k, v = (x.masked_fill(~valid[..., None, None], 0.0) for x in self.nvfp4_dequantised(kv_cache, blocks, within, spec))
            return k, v, valid
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
        if g.mode == QL.NVFP4:
            return self.nvfp4_regions(cache, spec, block_ids, heads)
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

    def registered_views(self, kv_cache, g: QL.QuantGeometry) -> list[torch.Tensor]:
        """The nvfp4 views whose bytes a head slice registers: data and scales of both sides."""
        return list(self.nvfp4_views(kv_cache, g).values())

    def nvfp4_regions(self, cache, spec: QuantSpec, block_ids, heads: range) -> list[tuple[int, int]]:
        """Per field view (K, V data and scales): one run of the slice's heads per block (HND) or
        per (block, row) (NHD); a swizzled scale stays in its head's plane, so runs hold it."""
        g, base = spec.geometry, cache.storage_offset()
        runs = []
        for layer in range(g.num_layers):
            for view in self.registered_views(cache[layer], g):
                _, s_n, s_h, _ = view.stride()
                for b in block_ids:
                    start = view.storage_offset() - base + b * view.stride(0) + heads.start * s_h
                    if s_h > s_n:  # HND: the slice's rows are contiguous within the block
                        runs.append((start, len(heads) * s_h))
                    else:
                        runs += [(start + n * s_n, len(heads) * s_h) for n in range(g.block_size)]
        return runs

    def token_fields(self, kv_cache, g: QL.QuantGeometry, blocks: torch.Tensor, within: torch.Tensor) -> list[tuple[torch.Tensor, tuple]]:
        """(view, index) per field such that ``view[index]`` is the field of tokens at
        ``(blocks, within)``, ``[T, H, ...]``, in logical order (nvfp4 scales unswizzled)."""
        if g.mode != QL.NVFP4:
            return [(view, (blocks, within)) for view in (*self.data_views(kv_cache), *self.scale_views(kv_cache))]
        views = self.nvfp4_views(kv_cache, g)
        heads = torch.arange(g.num_kv_heads, device=blocks.device)[None, :, None]
        out = [(views["k_data"], (blocks, within)), (views["v_data"], (blocks, within))]
        for side in ("k", "v"):
            row, col = self.reblock_scale_slots(within, g, side)
            out.append((views[f"{side}_scale"], (blocks[:, None, None], row[:, None, :], heads, col[:, None, :])))
        return out

    def reblock_scale_slots(self, slots, g: QL.QuantGeometry, side: str):
        return self.scale_slots(slots, g, side)

    def quant_reblock(self, src_cache, src_spec, dst_cache, dst_spec, src_table, dst_table, num_tokens: int) -> None:
        ends = []
        for cache, spec, table in ((src_cache, src_spec, src_table), (dst_cache, dst_spec, dst_table)):
            t, N = torch.arange(num_tokens, device=cache.device), spec.geometry.block_size
            ends.append((cache, spec.geometry, torch.as_tensor(table, device=cache.device)[t // N], t % N))
        (src, src_g, src_blocks, src_within), (dst, dst_g, dst_blocks, dst_within) = ends
        for layer in range(src_g.num_layers):
            for (s_view, s_index), (d_view, d_index) in zip(self.token_fields(src[layer], src_g, src_blocks, src_within),
                                                            self.token_fields(dst[layer], dst_g, dst_blocks, dst_within)):
                d_view[d_index] = s_view[s_index].to(d_view.device)

    def quant_swap(self, src_cache, src_spec, dst_cache, dst_spec, src_ids, dst_ids) -> None:
        dst_cache[:, dst_ids.to(dst_cache.device)] = src_cache[:, src_ids.to(src_cache.device)].to(dst_cache.device)
