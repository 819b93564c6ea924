"""kvconform's executable specification of paged KV-cache layouts and ops.

The spec's prose is docs/SPEC.md (clause ids such as ``WRITE-PAD-1``); symbols follow its §0 (B, N, H, D, L, e,
x, s, b, n). :meth:`Layout.offsets` is the single address formula; everything else here is
derived from it.
"""

from . import connector, fp8, latent
from .attention import gather_sequence_kv, paged_decode_attention
from .canonical import canonical_block_bytes, place_canonical_block_bytes
from .geometry import Geometry, bits_dtype
from .layouts import (
    LOGICAL_DIMS,
    Layout,
    aiter_shuffle,
    blocks_first,
    blocks_first_cross_layer,
    kv_first,
    legacy_paged,
    named_layouts,
    packed_content,
    permuted,
    standardized,
)
from .offsets import (
    block_byte_ranges,
    block_byte_runs,
    coordinates_of,
    is_block_compact,
    is_block_contiguous,
    is_block_outermost,
    is_blocks_first,
    is_connector_shippable,
    is_contiguous_per,
    is_in_bounds,
    is_injective,
    is_layer_compact,
    logical_grid,
    logical_shape,
    offset_map,
    strides_from_offsets,
    unravel,
)
from .ops import (
    copy_blocks,
    copy_blocks_between,
    insert_blocks_to_device,
    read_logical,
    reshape_and_cache,
    storage_bits,
    swap_out_blocks_to_host,
)

__all__ = [name for name in dir() if not name.startswith("_")]
