"""Layout descriptors: where every logical KV element lives (SPEC §1 LAYOUT-*).

A layout lists its *physical* dimensions, outermost first, as symbols. Each symbol is both
an extent (from the :class:`~reference.geometry.Geometry`) and an index into the logical
coordinates ``(layer, block, kv, slot, head, dim)`` = ``(l, b, kv, n, h, d)``:

====== ============ ===============   ======== ============ ==============
symbol extent       index             symbol   extent       index
====== ============ ===============   ======== ============ ==============
``L``  L            l                 ``D/x``  D // x       d // x
``B``  B            b                 ``x:d``  x            d % x
``2``  2            kv                ``N/x``  N // x       n // x
``N``  N            n                 ``x:n``  x            n % x
``H``  H            h
``D``  D            d
====== ============ ===============   ======== ============ ==============

Strides are dense (mixed radix) over that list, except that ``block_pad`` extra elements
follow every block page (padded pages, SPEC §14). Tiled layouts (legacy paged, AITER shuffle)
give K and V different inner dimension lists of equal size. :meth:`Layout.offsets` is the
one address formula of the project: every other fact (shape, strides, views, canonical
bytes, pictures) is derived from it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
from collections.abc import Mapping

import torch

from .geometry import Geometry

LOGICAL_DIMS = ("layer", "block", "kv", "slot", "head", "dim")

# symbol -> (logical coordinate, how the index is taken from it)
_INDEX = {
    "L": ("layer", None),
    "B": ("block", None),
    "2": ("kv", None),
    "N": ("slot", None),
    "H": ("head", None),
    "D": ("dim", None),
    "D/x": ("dim", "div"),
    "x:d": ("dim", "mod"),
    "N/x": ("slot", "div"),
    "x:n": ("slot", "mod"),
}

# Inner tiles of one (block, side): SPEC LAYOUT-LEGACY / LAYOUT-SHUFFLE.
KEY_X_TILE = ("H", "D/x", "N", "x:d")  # legacy paged key == AITER shuffle K
VALUE_X_TILE = ("H", "N/x", "D", "x:n")  # interleaved V == AITER shuffle V
VALUE_DN_TILE = ("H", "D", "N")  # legacy paged value


def _extent(g: Geometry, symbol: str) -> int:
    return g.extent(symbol.split(":")[0])


def _index(symbol: str, coords: dict, x: int):
    coord, how = _INDEX[symbol]
    value = coords[coord]
    if how == "div":
        return value // x
    if how == "mod":
        return value % x
    return value


@functools.lru_cache(maxsize=4096)
def _strides(layout: "Layout", g: Geometry, kv: int) -> Mapping[str, int]:
    # Every address computation asks for these (tens of thousands of times a run): computed once
    # per (layout, geometry, side), read-only so that no caller can change what the next one sees.
    dims = layout.v_dims if kv else layout.k_dims
    out, running = {}, 1
    for symbol in reversed(dims):
        out[symbol] = running + (layout.block_pad if symbol == "B" else 0)
        running = out[symbol] * _extent(g, symbol)
    return types.MappingProxyType(out)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """A frozen layout descriptor; see the module docstring for the symbols.

    ``native`` groups physical symbols into the dimensions of the tensor a backend exposes,
    in logical order (``(("B",), ("2",), ("N",), ("H",), ("D",))`` for E1, ``("2", "D")``
    for a packed K‖V content dim). Tiled layouts have no strided logical view; their
    ``container`` is the strided layout whose tensor a backend hands out (the bytes are
    re-viewed by its kernels). ``slot_coord`` is the coordinate E3 calls "head"
    (``"kv"`` for the 2-slot specs, SPEC LAYOUT-E3).
    """

    era: str
    alias: str
    k_dims: tuple[str, ...]
    v_dims: tuple[str, ...]
    native: tuple[tuple[str, ...], ...] | None = None
    container: "Layout | None" = None
    block_pad: int = 0
    slot_coord: str = "head"

    def __post_init__(self):
        for dims in (self.k_dims, self.v_dims):
            unknown = [s for s in dims if s not in _INDEX]
            if unknown:
                raise ValueError(f"Layout {self.alias}: unknown dimension symbols {unknown}")
        if self.block_pad < 0:
            raise ValueError(f"Layout {self.alias}: block_pad must be >= 0, got {self.block_pad}")
        if (self.native is None) == (self.container is None):
            raise ValueError(f"Layout {self.alias}: give exactly one of native or container")

    # ----------------------------------------------------------------- naming
    @property
    def name(self) -> str:
        """The physical shape, outermost first: ``E1[B,2,N,H,D]``, ``AITER[B,2|H,D/x,N,x|…]``."""
        if self.is_tiled:
            common = 0
            while self.k_dims[common] == self.v_dims[common]:
                common += 1
            shape = ",".join(self.k_dims[:common]) + "|" + ",".join(self.k_dims[common:])
            shape += "|" + ",".join(self.v_dims[common:])
        else:
            shape = ",".join(self.k_dims)
        return f"{self.era}[{shape.replace('x:d', 'x').replace('x:n', 'x')}]"

    def __str__(self) -> str:
        return f"{self.alias} {self.name}"

    def _repr_pretty_(self, printer, cycle) -> None:
        # How Hypothesis prints a drawn layout in a failing example: one line, not nine fields.
        printer.text(f"Layout({self})")

    @property
    def is_tiled(self) -> bool:
        return self.k_dims != self.v_dims

    # ----------------------------------------------------------------- geometry
    def validate(self, g: Geometry) -> None:
        """Raise ValueError naming the geometry field this layout cannot hold."""
        symbols = set(self.k_dims) | set(self.v_dims)
        if "L" not in symbols and g.num_layers != 1:
            raise ValueError(
                f"Layout {self.alias}: num_layers must be 1 (no layer dimension), got {g.num_layers}"
            )
        if symbols & {"D/x", "x:d"} and g.head_size % g.x:
            raise ValueError(
                f"Layout {self.alias}: head_size={g.head_size} must be a multiple of "
                f"x=16//{g.element_size}={g.x}"
            )
        if symbols & {"N/x", "x:n"} and g.block_size % g.x:
            raise ValueError(
                f"Layout {self.alias}: block_size={g.block_size} must be a multiple of "
                f"x=16//{g.element_size}={g.x}"
            )

    def strides(self, g: Geometry, kv: int = 0) -> Mapping[str, int]:
        """Element stride of every physical symbol of side ``kv`` (dense, plus block padding)."""
        return _strides(self, g, kv)

    def numel(self, g: Geometry) -> int:
        """Elements spanned by the allocation (padding included)."""
        self.validate(g)
        symbol = self.k_dims[0]
        return self.strides(g)[symbol] * _extent(g, symbol)

    def nbytes(self, g: Geometry) -> int:
        return self.numel(g) * g.element_size

    def offsets(self, g: Geometry, *, layer=0, block=0, kv=0, slot=0, head=0, dim=0) -> torch.Tensor:
        """Element offset of logical ``(l, b, kv, n, h, d)``; arguments broadcast like tensors.

        ``off = Σ_symbols index(symbol) · stride(symbol)`` over the physical symbols of the
        element's side. This is the only address formula in kvconform.
        """
        self.validate(g)
        coords = {
            name: torch.as_tensor(value, dtype=torch.int64)
            for name, value in zip(LOGICAL_DIMS, (layer, block, kv, slot, head, dim))
        }

        def side(dims, kv_side):
            strides = self.strides(g, kv_side)
            return sum(_index(s, coords, g.x) * strides[s] for s in dims)

        k_off = side(self.k_dims, 0)
        if not self.is_tiled:
            return k_off
        return torch.where(coords["kv"] == 0, k_off, side(self.v_dims, 1))

    # ----------------------------------------------------------------- views
    def view_shape_strides(self, g: Geometry) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shape and element strides of the tensor a backend exposes (tiled: the container)."""
        if self.container is not None:
            return self.container.view_shape_strides(g)
        if self.native is None:
            raise ValueError("a layout with neither native dims nor a container (__post_init__ refuses it)")
        strides = self.strides(g)
        shape, view_strides = [], []
        for group in self.native:
            for outer, inner in zip(group, group[1:]):
                if strides[outer] != strides[inner] * _extent(g, inner):
                    raise ValueError(f"Layout {self.alias}: dims {group} cannot merge into one")
            shape.append(math.prod(_extent(g, s) for s in group))
            view_strides.append(strides[group[-1]])
        return tuple(shape), tuple(view_strides)

    def side_view(self, g: Geometry, kv: int, layer: int = 0) -> tuple[tuple, tuple, int]:
        """``(shape, strides, element offset)`` of the K (kv=0) or V (kv=1) tensor a kernel sees.

        Strided layouts: ``(B, N, H, D)`` in logical order (what ``unbind(1)`` / ``split``
        return). Tiled layouts: ``B`` then the side's tile in physical order
        (``[B, H, D/x, N, x]`` for K).
        """
        dims = self.v_dims if kv else self.k_dims
        order = [s for s in dims if s not in ("L", "2")] if self.is_tiled else ["B", "N", "H", "D"]
        strides = self.strides(g, kv)
        shape = tuple(_extent(g, s) for s in order)
        base = int(self.offsets(g, layer=layer, kv=kv))
        return shape, tuple(strides[s] for s in order), base

    def block_strides(self, g: Geometry) -> tuple[int, int]:
        """K and V block strides in elements (what the shuffle writer receives, SPEC LAYOUT-SHUFFLE-BASE)."""
        return self.strides(g, 0)["B"], self.strides(g, 1)["B"]


# --------------------------------------------------------------------- constructors
_LOGICAL_E1 = (("B",), ("2",), ("N",), ("H",), ("D",))
_LOGICAL_E1_CROSS = (("L",),) + _LOGICAL_E1
_LOGICAL_E0 = (("2",), ("B",), ("N",), ("H",), ("D",))
_LOGICAL_E2 = (("B",), ("H",), ("N",), ("2", "D"))
_LOGICAL_E2_CROSS = (("L",),) + _LOGICAL_E2
_LOGICAL_E3_STANDARD = (("L",), ("B",), ("H",), ("N",), ("2", "D"))
_LOGICAL_E3_TWO_SLOT = (("L",), ("B",), ("2",), ("N",), ("H", "D"))


def permuted(era: str, alias: str, logical, stride_order, *, block_pad=0, slot_coord="head") -> Layout:
    """A layout given as vLLM declares it: logical dims plus a stride order (SPEC SHAPE-STRIDES).

    ``physical[i] = logical[stride_order[i]]``.
    """
    order = tuple(stride_order)
    if sorted(order) != list(range(len(logical))):
        raise ValueError(
            f"Layout {alias}: stride_order {order} is not a permutation of 0..{len(logical) - 1}"
        )
    dims = tuple(s for i in order for s in logical[i])
    return Layout(
        era=era, alias=alias, k_dims=dims, v_dims=dims, native=tuple(logical),
        block_pad=block_pad, slot_coord=slot_coord,
    )


E1_STRIDE_ORDERS = {"NHD": (0, 1, 2, 3, 4), "HND": (0, 1, 3, 2, 4)}
# include_num_layers_dimension=True orders of (L, B, 2, N, H, D), SPEC §14.
E1_CROSS_LAYER_ORDERS = {
    "NHD": (1, 0, 2, 3, 4, 5),
    "HND_FLASH_ATTN": (1, 4, 0, 2, 3, 5),
    "HND_FLASHINFER": (1, 2, 4, 0, 3, 5),
}


def blocks_first(order: str = "NHD", *, block_pad: int = 0) -> Layout:
    """E1 ``(B, 2, N, H, D)``, stride order NHD or HND (SPEC LAYOUT-E1); split by ``unbind(1)``."""
    return permuted("E1", order, _LOGICAL_E1, _lookup(E1_STRIDE_ORDERS, order), block_pad=block_pad)


def blocks_first_cross_layer(order: str = "NHD") -> Layout:
    """E1 cross-layer ``(L, B, 2, N, H, D)`` with one backend's physical order (SPEC §14)."""
    return permuted("E1", f"cross-{order}", _LOGICAL_E1_CROSS, _lookup(E1_CROSS_LAYER_ORDERS, order))


def kv_first(order: str = "NHD") -> Layout:
    """E0 ``(2, B, N, H, D)`` (ROCM_ATTN), split by ``unbind(0)`` (SPEC LAYOUT-E0)."""
    return permuted("E0", order, _LOGICAL_E0, _lookup(E1_STRIDE_ORDERS, order))


def packed_content(order: str = "NHD", *, cross_layer: bool = False) -> Layout:
    """E2 ``(B, H, N, 2·D)``: K‖V adjacent per (n, h) (SPEC §14)."""
    if cross_layer:
        orders = {"NHD": (1, 0, 3, 2, 4), "HND": (1, 2, 0, 3, 4)}
        return permuted("E2", f"cross-{order}", _LOGICAL_E2_CROSS, _lookup(orders, order))
    return permuted("E2", order, _LOGICAL_E2, _lookup({"NHD": (0, 2, 1, 3), "HND": (0, 1, 2, 3)}, order))


def legacy_paged(*, interleaved_v: bool = False) -> Layout:
    """Legacy paged split (SPEC LAYOUT-LEGACY): K ``[B,H,D/x,N,x]``, V ``[B,H,D,N]`` or ``[B,H,N/x,D,x]``.

    K and V are separate tensors in ROCM_ATTN; here they are the two planes of one
    kv-first allocation, which is also what the E0 container holds.
    """
    v_tile = VALUE_X_TILE if interleaved_v else VALUE_DN_TILE
    return Layout(
        era="LEGACY", alias="legacy-interleaved-v" if interleaved_v else "legacy",
        k_dims=("2", "B") + KEY_X_TILE, v_dims=("2", "B") + v_tile, container=kv_first("NHD"),
    )


def aiter_shuffle(placement: str = "blocks_first", *, block_pad: int = 0) -> Layout:
    """AITER shuffle (SPEC LAYOUT-SHUFFLE): per block side K ``[H,D/x,N,x]``, V ``[H,N/x,D,x]``.

    ``blocks_first``: K and V of a block adjacent, block stride ``2·H·D·N`` on both
    sides (E1, PR #43660); ``kv_first``: dense planes, block stride ``H·D·N``.
    """
    outer = {"blocks_first": ("B", "2"), "kv_first": ("2", "B")}[_check_choice(placement, ("blocks_first", "kv_first"))]
    container = blocks_first("NHD", block_pad=block_pad) if outer[0] == "B" else kv_first("NHD")
    if block_pad and outer[0] != "B":
        raise ValueError("Layout shuffle-kv_first: block_pad needs blocks_first placement")
    return Layout(
        era="AITER", alias=f"shuffle-{placement}", k_dims=outer + KEY_X_TILE,
        v_dims=outer + VALUE_X_TILE, container=container, block_pad=block_pad,
    )


# KVCacheLayout member value = permutation of (L, B, H, N, C) (SPEC LAYOUT-E3).
E3_PERMUTATIONS = {
    "LBHNC": (0, 1, 2, 3, 4),
    "LBNHC": (0, 1, 3, 2, 4),
    "LHBNC": (0, 2, 1, 3, 4),
    "BLHNC": (1, 0, 2, 3, 4),
    "BLNHC": (1, 0, 3, 2, 4),
    "BHLNC": (1, 2, 0, 3, 4),
}
E3_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


E3_TILES = {  # what a backend's kernels store inside one (block, slot) [N, H·D] region
    "shuffle": (KEY_X_TILE, VALUE_X_TILE),  # AITER FA shuffle writer (SPEC LAYOUT-SHUFFLE)
    "legacy": (KEY_X_TILE, VALUE_DN_TILE),  # ROCM_ATTN: PagedAttention.split_kv_cache views (SPEC LAYOUT-LEGACY)
}


def standardized(permutation: str, *, spec: str = "standard", tile: str | None = None, block_pad: int = 0) -> Layout:
    """E3 ``[L, B, H, N, C]`` in one of the six permutations (SPEC LAYOUT-E3).

    ``spec="standard"``: H = num_kv_heads, C = K‖V of one (head, token).
    ``spec="two_slot"`` (AITER FA shuffle, ROCM_ATTN): H = 2 slots (K, V), C = all heads of
    one token; with a ``tile`` (see ``E3_TILES``) each (block, slot) ``[N, H·D]`` region is
    re-viewed by the kernels and holds that tile instead.
    ``block_pad`` elements follow every page (``page_size_padded``).
    """
    permutation = E3_ALIASES.get(permutation, permutation)
    order = _lookup(E3_PERMUTATIONS, permutation)
    _check_choice(spec, ("standard", "two_slot"))
    if spec == "standard":
        if tile:
            raise ValueError(f"Layout E3: tile {tile!r} needs spec='two_slot'")
        return permuted("E3", permutation, _LOGICAL_E3_STANDARD, order, block_pad=block_pad)
    plain = permuted("E3", f"{permutation}-2slot", _LOGICAL_E3_TWO_SLOT, order, block_pad=block_pad, slot_coord="kv")
    if tile is None:
        return plain
    k_tile, v_tile = _lookup(E3_TILES, tile)
    if plain.k_dims[-3:] != ("N", "H", "D"):
        # The backend re-views each slot's [N, H·D] region as a tile; when N and C are not
        # the innermost pair that reshape copies instead of viewing (pitfall F.6).
        raise ValueError(f"Layout E3 {permutation}: a {tile} tile needs N, C innermost (reshape would copy)")
    outer = plain.k_dims[:-3]
    return Layout(
        era="E3", alias=f"{permutation}-2slot-{tile}", k_dims=outer + k_tile,
        v_dims=outer + v_tile, container=plain, block_pad=block_pad, slot_coord="kv",
    )


def _lookup(table: dict, key: str):
    if key not in table:
        raise ValueError(f"unknown layout order {key!r}; expected one of {sorted(table)}")
    return table[key]


def _check_choice(value: str, choices) -> str:
    if value not in choices:
        raise ValueError(f"unknown choice {value!r}; expected one of {list(choices)}")
    return value


def named_layouts() -> dict[str, Layout]:
    """Every layout kvconform knows, keyed by ``alias`` + era (the layout test table)."""
    layouts = [
        blocks_first("NHD"), blocks_first("HND"),
        *(blocks_first_cross_layer(o) for o in E1_CROSS_LAYER_ORDERS),
        kv_first("NHD"), kv_first("HND"),
        legacy_paged(), legacy_paged(interleaved_v=True),
        aiter_shuffle("blocks_first"), aiter_shuffle("kv_first"),
        packed_content("NHD"), packed_content("HND"),
        packed_content("NHD", cross_layer=True), packed_content("HND", cross_layer=True),
        *(standardized(p) for p in E3_PERMUTATIONS),
        *(standardized(p, spec="two_slot") for p in E3_PERMUTATIONS),
        *(standardized(p, spec="two_slot", tile=t) for t in E3_TILES for p in ("LBHNC", "LHBNC", "BLHNC", "BHLNC")),
    ]
    return {f"{layout.era}:{layout.alias}": layout for layout in layouts}
