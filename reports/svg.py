"""SVG picture of one block: where each (kv, slot, head) row should be vs what the backend put there."""

from __future__ import annotations

from html import escape

from markupsafe import Markup

KV_COLOR = ("#4e79a7", "#f28e2b")  # K blue, V orange
FOREIGN = "#bab0ac"  # bytes that belong to no logical row (garbage, sentinel, a lost write)
CELL, GAP, PER_LINE = 14, 2, 32


def _label(row, block=None) -> str:
    if row is None:
        return "no logical row"
    return f"{'KV'[row[0]]} slot {row[1]} head {row[2]}" + (f" of layer {block[0]} block {block[1]}" if block else "")


def byte_map_svg(data: dict) -> Markup:
    """Two strips of cells in physical order: expected owner (top) and actual owner (bottom)."""
    cells = data["cells"]
    lines = -(-len(cells) // PER_LINE)
    panel_h = lines * (CELL + GAP)
    width = PER_LINE * (CELL + GAP) + 10
    height = 2 * panel_h + 80
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="byte-map" width="{width}" height="{height}" role="img" '
        f'aria-label="byte map of layer {data["layer"]} block {data["block"]}">',
        f'<text x="0" y="12" font-size="12">expected: each row where the spec puts it (layer {data["layer"]}, block {data["block"]})</text>',
        f'<text x="0" y="{panel_h + 42}" font-size="12">actual: whose bytes the backend left there (red outline = differs)</text>',
    ]
    for i, cell in enumerate(cells):
        x = (i % PER_LINE) * (CELL + GAP)
        y = (i // PER_LINE) * (CELL + GAP)
        expected_row, actual_row = cell["row"], (cell["row"] if cell["ok"] else cell["actual"])
        moved_from = None if cell["ok"] else cell.get("actual_block")
        tip = escape(f"element offset {cell['offset']}: expected {_label(expected_row)}; actual {_label(actual_row, moved_from)}")
        parts.append(f'<rect x="{x}" y="{y + 18}" width="{CELL}" height="{CELL}" fill="{KV_COLOR[expected_row[0]]}"><title>{tip}</title></rect>')
        fill = FOREIGN if actual_row is None else KV_COLOR[actual_row[0]]
        stroke = "" if cell["ok"] else ' stroke="#d62728" stroke-width="2.5"'
        parts.append(f'<rect x="{x}" y="{y + panel_h + 48}" width="{CELL}" height="{CELL}" fill="{fill}"{stroke}><title>{tip}</title></rect>')
    legend_y = 2 * panel_h + 66
    for i, (name, color) in enumerate((("K row", KV_COLOR[0]), ("V row", KV_COLOR[1]), ("no logical row", FOREIGN))):
        parts.append(f'<rect x="{i * 130}" y="{legend_y}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{i * 130 + 16}" y="{legend_y + 11}" font-size="12">{name}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
