"""kvconform's executable specification of paged KV-cache layouts and ops.

The spec's prose is docs/SPEC.md (clause ids such as ``WRITE-PAD-1``); symbols follow its §0 (B, N, H, D, L, e,
x, s, b, n). :meth:`Layout.offsets` is the single address formula; everything else here is
derived from it.
"""

import importlib

# name -> the module of this package that defines it. Imported on first use (PEP 562): the
# error types of reference.errors, which the pytest plugin loads in every pytest run of an
# environment, then come without torch.
_SUBMODULES = ('connector', 'fp8')
_EXPORTS = {
    **dict.fromkeys(('gather_sequence_kv', 'paged_decode_attention'), 'attention'),
    **dict.fromkeys(('canonical_block_bytes', 'place_canonical_block_bytes'), 'canonical'),
    **dict.fromkeys(('Geometry', 'bits_dtype'), 'geometry'),
    **dict.fromkeys(('LOGICAL_DIMS', 'Layout', 'aiter_shuffle', 'blocks_first', 'blocks_first_cross_layer', 'kv_first', 'legacy_paged', 'named_layouts', 'packed_content', 'permuted', 'standardized'), 'layouts'),
    **dict.fromkeys(('block_byte_ranges', 'block_byte_runs', 'coordinates_of', 'is_block_compact', 'is_block_contiguous', 'is_block_outermost', 'is_blocks_first', 'is_connector_shippable', 'is_contiguous_per', 'is_in_bounds', 'is_injective', 'is_layer_compact', 'logical_grid', 'logical_shape', 'offset_map', 'strides_from_offsets'), 'offsets'),
    **dict.fromkeys(('copy_blocks', 'copy_blocks_between', 'insert_blocks_to_device', 'read_logical', 'reshape_and_cache', 'storage_bits', 'swap_out_blocks_to_host'), 'ops'),
}
__all__ = sorted([*_SUBMODULES, *_EXPORTS])


def __getattr__(name: str):
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
