"""Latent (MLA) cache formats and their one address formula (SPEC §17: MLA-SHAPE, DSMLA-RECORD,
IDX-LAYOUT, LATENT-LAYERS).

A cache is ``region``: a flat contiguous uint8 tensor of ``geom.nbytes()`` bytes holding ``L`` layers
one after another, each ``B`` blocks of ``block_bytes()`` (symbols of SPEC §0). Inside a block the plain
and ds_mla caches hold ``N`` token rows of ``entry_bytes()``; the indexer cache holds all ``N·D`` value
bytes first (token rows, or vLLM ROCm's 16x16 tiles), then all ``N·D/32`` scale bytes.
:func:`field_offsets` is the only place these address formulas are written.
"""

from __future__ import annotations

import dataclasses

import torch

from . import fp8
from .latent_records import DS_MLA_RANK, DS_MLA_RECORD_BYTES, DS_MLA_ROPE, INDEXER_GROUP, MX_GROUP, fp8_scale_divisor

KINDS = ("mla", "fp8_ds_mla", "indexer")
MLA_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
INDEXER_SCALE_FORMATS = ("float32", "ue8m0", "mx")
# Indexer value regions: token rows (vLLM's CUDA op), or vLLM's ROCm Triton writer's 16-row x 16-byte tiles.
INDEXER_LAYOUTS = ("rows", "shuffle")
SHUFFLE_TILE = 16
MODEL_DTYPES = (torch.bfloat16, torch.float16, torch.float32)  # float32 on the plain MLA cache only (vLLM's DTYPES)
_DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
# Per kind: (kv_lora_rank, rope_dim, cache_dtype) a field left at None resolves to.
_DEFAULTS = {"mla": (512, 64, "auto"), "fp8_ds_mla": (DS_MLA_RANK, DS_MLA_ROPE, "fp8_ds_mla"), "indexer": (128, 0, "fp8")}


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentFormat:
    """What one token's record holds and how it is encoded. Fields left ``None`` take the kind's
    value: mla 512/64/auto, fp8_ds_mla 512/64/fp8_ds_mla, indexer 128/0/fp8."""

    kind: str
    kv_lora_rank: int | None = None
    rope_dim: int | None = None
    cache_dtype: str | None = None
    scale_format: str = "float32"
    indexer_layout: str = "rows"
    model_dtype: torch.dtype = torch.bfloat16
    platform: str = "cpu"
    arch: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"LatentFormat.kind must be one of {KINDS}, got {self.kind!r}")
        for name, default in zip(("kv_lora_rank", "rope_dim", "cache_dtype"), _DEFAULTS[self.kind]):
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)
        allowed = MODEL_DTYPES if self.kind == "mla" else MODEL_DTYPES[:2]
        if self.model_dtype not in allowed:
            raise ValueError(f"LatentFormat.model_dtype for {self.kind} must be one of {allowed}, got {self.model_dtype}")
        fp8_scale_divisor("0.33.0", self.platform, self.arch)  # validates platform
        if self.kind != "indexer" and self.indexer_layout != "rows":
            raise ValueError(f"indexer_layout is for the indexer kind only, got {self.indexer_layout!r} on {self.kind}")
        getattr(self, f"_check_{self.kind}")()

    def _check_mla(self):
        if not _positive(self.kv_lora_rank) or self.kv_lora_rank % 16:
            raise ValueError(f"LatentFormat.kv_lora_rank must be a positive multiple of 16, got {self.kv_lora_rank!r}")
        if not isinstance(self.rope_dim, int) or self.rope_dim < 0:
            raise ValueError(f"LatentFormat.rope_dim must be an int >= 0, got {self.rope_dim!r}")
        if self.cache_dtype not in MLA_CACHE_DTYPES:
            raise ValueError(f"LatentFormat.cache_dtype for mla must be one of {MLA_CACHE_DTYPES}, got {self.cache_dtype!r}")

    def _check_fp8_ds_mla(self):
        wanted = _DEFAULTS["fp8_ds_mla"]
        if (self.kv_lora_rank, self.rope_dim, self.cache_dtype) != wanted:
            raise ValueError(f"fp8_ds_mla needs kv_lora_rank, rope_dim, cache_dtype = {wanted}, got "
                             f"{(self.kv_lora_rank, self.rope_dim, self.cache_dtype)}")

    def _check_indexer(self):
        if not _positive(self.kv_lora_rank) or self.kv_lora_rank % INDEXER_GROUP:
            raise ValueError(f"indexer kv_lora_rank (head dim) must be a positive multiple of {INDEXER_GROUP}, "
                             f"got {self.kv_lora_rank!r}")
        if self.rope_dim != 0 or self.cache_dtype != "fp8":
            raise ValueError(f"indexer needs rope_dim 0 and cache_dtype 'fp8', got {self.rope_dim!r}, {self.cache_dtype!r}")
        if self.scale_format not in INDEXER_SCALE_FORMATS:
            raise ValueError(f"indexer scale_format must be one of {INDEXER_SCALE_FORMATS}, got {self.scale_format!r}")
        if self.scale_format == "mx" and self.kv_lora_rank != INDEXER_GROUP:
            raise ValueError(f"indexer mx scales need head dim {INDEXER_GROUP} (cache_kernels.cu:1966-1967), got {self.kv_lora_rank}")
        if self.indexer_layout not in INDEXER_LAYOUTS:
            raise ValueError(f"indexer_layout must be one of {INDEXER_LAYOUTS}, got {self.indexer_layout!r}")
        if self.indexer_layout == "shuffle" and self.kv_lora_rank != INDEXER_GROUP:
            raise ValueError(f"indexer_layout 'shuffle' (vLLM's ROCm Triton writer: one scale per row) needs head dim "
                             f"{INDEXER_GROUP}, got {self.kv_lora_rank}")
        if self.indexer_layout == "shuffle" and self.scale_format == "mx":
            raise ValueError("indexer_layout 'shuffle' (vLLM's ROCm Triton writer) has no mx scales "
                             "(rocm_aiter_mla_sparse.py:212 rounds for 'ue8m0' only)")

    @property
    def e4m3(self) -> fp8.Fp8Format:
        """The platform's e4m3 variant (fnuz on gfx94x, OCP fn elsewhere)."""
        return fp8.platform_e4m3(self.platform, self.arch)

    def storage_dtype(self) -> torch.dtype:
        """Element dtype of the backend's cache tensor."""
        if self.kind != "mla":
            return torch.uint8
        return fp8.cache_dtype_for(self.cache_dtype, self.model_dtype, self.platform, self.arch)

    def entry_bytes(self) -> int:
        """Bytes per token row as the cache tensor's last dim declares it (MLA-SHAPE)."""
        if self.kind == "mla":
            return (self.kv_lora_rank + self.rope_dim) * self.storage_dtype().itemsize
        if self.kind == "fp8_ds_mla":
            return DS_MLA_RECORD_BYTES
        return self.kv_lora_rank + self.kv_lora_rank // MX_GROUP

    def width(self) -> int:
        """Latent values per token: ``kv_lora_rank + rope_dim``."""
        return self.kv_lora_rank + self.rope_dim

    def label(self) -> str:
        """Short stable id, e.g. ``mla-576-bf16``, ``mla-576-fp8_e4m3``, ``fp8_ds_mla-bf16``, ``indexer-128-ue8m0``."""
        dt = _DTYPE_NAMES[self.model_dtype]
        fnuz = "-fnuz" if self.e4m3.name == "float8_e4m3fnuz" and self.cache_dtype != "fp8_e5m2" else ""
        if self.kind == "indexer":
            shuffle = "-shuffle" if self.indexer_layout == "shuffle" else ""
            return f"indexer-{self.kv_lora_rank}-{self.scale_format}{fnuz}{shuffle}"
        if self.kind == "fp8_ds_mla":
            return f"fp8_ds_mla-{dt}{fnuz}"
        size = "576" if (self.kv_lora_rank, self.rope_dim) == (512, 64) else f"{self.kv_lora_rank}+{self.rope_dim}"
        if self.cache_dtype == "auto":
            return f"mla-{size}-{dt}"
        return f"mla-{size}-{self.cache_dtype}{fnuz}" + ("" if self.model_dtype == torch.bfloat16 else f"-{dt}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatentGeometry:
    """One latent allocation: ``L`` layers of ``B`` blocks of ``N`` token rows of ``fmt``."""

    num_blocks: int
    block_size: int
    fmt: LatentFormat
    num_layers: int = 1

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "num_layers"):
            if not _positive(getattr(self, name)):
                raise ValueError(f"LatentGeometry.{name} must be a positive int, got {getattr(self, name)!r}")
        if not isinstance(self.fmt, LatentFormat):
            raise ValueError(f"LatentGeometry.fmt must be a LatentFormat, got {type(self.fmt).__name__}")
        if self.fmt.indexer_layout == "shuffle" and self.block_size > 1 and self.block_size % SHUFFLE_TILE:
            raise ValueError(f"LatentGeometry.block_size must be 1 or a multiple of {SHUFFLE_TILE} for shuffled indexer "
                             f"values, got {self.block_size}")

    def shuffled(self) -> bool:
        """Indexer values in 16x16 tiles: vLLM's ROCm writer shuffles when ``N > 1``
        (rocm_aiter_mla_sparse.py:196, ``layout = "NORMAL" if block_size == 1 else "SHUFFLE"``)."""
        return self.fmt.indexer_layout == "shuffle" and self.block_size > 1

    def block_bytes(self) -> int:
        """One block of one layer: ``N · entry_bytes`` (contiguous in every format)."""
        return self.block_size * self.fmt.entry_bytes()

    def layer_bytes(self) -> int:
        return self.num_blocks * self.block_bytes()

    def nbytes(self) -> int:
        return self.num_layers * self.layer_bytes()

    def shape(self) -> tuple:
        """The backend tensor's shape: ``(B, N, entry_bytes / e)``, ``(L, B, N, entry_bytes / e)`` if ``L > 1``."""
        per_layer = (self.num_blocks, self.block_size, self.fmt.entry_bytes() // self.fmt.storage_dtype().itemsize)
        return per_layer if self.num_layers == 1 else (self.num_layers, *per_layer)

    def short(self) -> str:
        layers = f" L{self.num_layers}" if self.num_layers > 1 else ""
        return f"{self.fmt.label()} B{self.num_blocks} N{self.block_size}{layers}"


def _positive(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# ---------------------------------------------------------------------------------------------
# Addresses (MLA-SHAPE, DSMLA-RECORD, IDX-LAYOUT): the only address formulas.

def field_widths(fmt: LatentFormat) -> dict[str, int]:
    """Bytes of each named field of one token, in record order."""
    if fmt.kind == "mla":
        return {"latent": fmt.entry_bytes()}
    if fmt.kind == "fp8_ds_mla":
        return {"nope": DS_MLA_RANK, "scales": 16, "rope": 2 * DS_MLA_ROPE}
    return {"values": fmt.kv_lora_rank, "scales": fmt.kv_lora_rank // MX_GROUP}


def field_offsets(geom: LatentGeometry, blocks, rows, layer: int = 0) -> dict[str, torch.Tensor]:
    """Byte offsets into the region of every byte of each field of tokens ``(blocks[i], rows[i])``.

    Per token, ``base = layer·B·block_bytes + block·block_bytes``. Plain and ds_mla: field bytes at
    ``base + row·entry_bytes + field_start + j``. Indexer: values at ``base + row·D + j`` (shuffled:
    ``base + (row//16)·16·D + (j//16)·256 + (row%16)·16 + j%16``), scales at ``base + N·D + row·D/32 + j``.
    Returns ``{field: int64 [n, width]}``.
    """
    blocks, rows = _token_coords(geom, blocks, rows)
    _check_layer(geom, layer)
    base = layer * geom.layer_bytes() + blocks * geom.block_bytes()
    out = {}
    if geom.fmt.kind == "indexer":
        D = geom.fmt.kv_lora_rank
        widths = field_widths(geom.fmt)
        d, t = torch.arange(D), SHUFFLE_TILE
        if geom.shuffled():
            out["values"] = (base + rows // t * t * D + rows % t * t)[:, None] + d // t * t * t + d % t
        else:
            out["values"] = (base + rows * D)[:, None] + d
        scales = base + geom.block_size * D + rows * widths["scales"]
        out["scales"] = scales[:, None] + torch.arange(widths["scales"])
        return out
    start = base + rows * geom.fmt.entry_bytes()
    for name, width in field_widths(geom.fmt).items():
        out[name] = start[:, None] + torch.arange(width)
        start = start + width
    return out


def record_offsets(geom: LatentGeometry, blocks, rows, layer: int = 0) -> torch.Tensor:
    """All bytes of each token, fields in record order: ``int64 [n, entry_bytes]``."""
    return torch.cat(list(field_offsets(geom, blocks, rows, layer).values()), dim=1)


def coordinates_of(geom: LatentGeometry, byte_offsets) -> dict:
    """Inverse of :func:`field_offsets`: ``{"layer", "block", "row", "byte"}`` int64 tensors and
    ``"field"`` a list of names, one per offset (for diagnosis)."""
    offs = torch.as_tensor(byte_offsets, dtype=torch.int64).flatten()
    if offs.numel() and (int(offs.min()) < 0 or int(offs.max()) >= geom.nbytes()):
        raise ValueError(f"byte_offsets must lie in [0, {geom.nbytes()}) of {geom.short()}")
    layer, within = offs // geom.layer_bytes(), offs % geom.layer_bytes()
    block, inner = within // geom.block_bytes(), within % geom.block_bytes()
    widths = field_widths(geom.fmt)
    if geom.fmt.kind == "indexer":
        values_end = geom.block_size * geom.fmt.kv_lora_rank
        in_values = inner < values_end
        scale_inner = inner - values_end
        value_row, value_byte = inner // widths["values"], inner % widths["values"]
        if geom.shuffled():
            t = SHUFFLE_TILE
            in_tile = inner % (t * geom.fmt.kv_lora_rank)
            value_row = inner // (t * geom.fmt.kv_lora_rank) * t + in_tile % (t * t) // t
            value_byte = in_tile // (t * t) * t + in_tile % t
        row = torch.where(in_values, value_row, scale_inner // widths["scales"])
        byte = torch.where(in_values, value_byte, scale_inner % widths["scales"])
        field = ["values" if v else "scales" for v in in_values.tolist()]
        return {"layer": layer, "block": block, "row": row, "field": field, "byte": byte}
    row, in_record = inner // geom.fmt.entry_bytes(), inner % geom.fmt.entry_bytes()
    ends = torch.tensor(list(widths.values())).cumsum(0)
    index = torch.bucketize(in_record, ends, right=True)
    starts = torch.cat([torch.zeros(1, dtype=torch.int64), ends[:-1]])
    names = list(widths)
    return {"layer": layer, "block": block, "row": row, "field": [names[i] for i in index.tolist()],
            "byte": in_record - starts[index]}


def _token_coords(geom: LatentGeometry, blocks, rows) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = torch.as_tensor(blocks, dtype=torch.int64).flatten().cpu()
    rows = torch.as_tensor(rows, dtype=torch.int64).flatten().cpu()
    if blocks.numel() != rows.numel():
        raise ValueError(f"blocks ({blocks.numel()}) and rows ({rows.numel()}) must have one entry per token")
    if blocks.numel() and (int(blocks.min()) < 0 or int(blocks.max()) >= geom.num_blocks):
        raise ValueError(f"blocks must lie in [0, {geom.num_blocks}), got {blocks.tolist()}")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= geom.block_size):
        raise ValueError(f"rows must lie in [0, {geom.block_size}), got {rows.tolist()}")
    return blocks, rows


def _check_layer(geom: LatentGeometry, layer: int) -> None:
    if not isinstance(layer, int) or not 0 <= layer < geom.num_layers:
        raise ValueError(f"layer must be an int in [0, {geom.num_layers}), got {layer!r}")
