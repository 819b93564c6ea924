"""SVG picture of one block: where each (kv, slot, head) row should be vs what the backend put there.

Every value comes from a results file, which may come from anyone: each is escaped where it is
written (text and attributes alike), and a field of the wrong type draws as "no logical row"
rather than raising.
"""

from __future__ import annotations

from html import escape

from markupsafe import Markup

KV_COLOR = ("#4e79a7", "#f28e2b")  # K blue, V orange
FOREIGN = "#bab0ac"  # bytes that belong to no logical row (garbage, sentinel, a lost write)
WRONG_VALUES = "#e15759"  # the row's own place, its values wrong (a value fault of the diagnosis)
CELL, GAP, PER_LINE = 14, 2, 32
# The diagnosis's classes (conformance/harness/diagnosis.py FAULTS) of bytes in the right place with
# the wrong codes: such a row is drawn as itself, in WRONG_VALUES, never as "no logical row" (#38 item 5).
VALUE_FAULTS = frozenset({"fp8-format", "fp8-fnuz-vs-fn", "scale-inverted", "scale-swapped", "value-scaled", "fp8-rounding",
                          "fp8-nan", "value-cast", "byte-order", "bit-flip", "zeroed"})


def _text(value) -> str:
    """A field as SVG text or attribute value: escaped, quotes too."""
    return escape(str(value), quote=True)


def _row(value) -> tuple | None:
    """A [kv, slot, head] triple, or None when the field is not one."""
    if isinstance(value, (list, tuple)) and len(value) == 3 and value[0] in (0, 1) and type(value[0]) is int:
        return tuple(value)
    return None


def _label(row, block=None) -> str:
    if row is None:
        return "no logical row"
    block = block if isinstance(block, (list, tuple)) and len(block) == 2 else None
    return f"{'KV'[row[0]]} slot {row[1]} head {row[2]}" + (f" of layer {block[0]} block {block[1]}" if block else "")


def _within(where, name: str, value) -> bool:
    span = where.get(name)
    if name == "kv":
        return isinstance(span, str) and "KV"[value] in span.split("/")
    return isinstance(span, list) and len(span) == 2 and all(isinstance(v, int) for v in span) and span[0] <= value <= span[1]


def _value_fault(row, layer, block, diagnosis) -> str | None:
    """The value-fault class of a finding whose box holds this row of this block, if any."""
    for finding in diagnosis if isinstance(diagnosis, list) else ():
        where = finding.get("where") if isinstance(finding, dict) else None
        if finding.get("fault") in VALUE_FAULTS and isinstance(where, dict) and _within(where, "layer", layer) and _within(where, "block", block) \
                and all(_within(where, name, value) for name, value in zip(("kv", "slot", "head"), row)):
            return finding["fault"]
    return None


def byte_map_svg(data: dict, diagnosis: list | None = None) -> Markup:
    """Two strips of cells in physical order: expected owner (top) and actual owner (bottom).
    ``diagnosis`` (the failure's findings): a row a value fault covers is drawn as its own row
    with wrong values, not as bytes of no logical row."""
    cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(cells, list):
        return Markup("")
    cells = [cell for cell in cells if isinstance(cell, dict)]
    layer, block = _text(data.get("layer")), _text(data.get("block"))
    lines = -(-len(cells) // PER_LINE)
    panel_h = lines * (CELL + GAP)
    width = PER_LINE * (CELL + GAP) + 10
    height = 2 * panel_h + 96
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="byte-map" width="{width}" height="{height}" role="img" '
        f'aria-label="byte map of layer {layer} block {block}">',
        f'<text x="0" y="12" font-size="12">expected: each row where the spec puts it (layer {layer}, block {block})</text>',
        f'<text x="0" y="{panel_h + 42}" font-size="12">actual: whose bytes the backend left there (red outline = differs)</text>',
    ]
    for i, cell in enumerate(cells):
        x = (i % PER_LINE) * (CELL + GAP)
        y = (i // PER_LINE) * (CELL + GAP)
        ok = cell.get("ok") is True
        expected_row = _row(cell.get("row"))
        actual_row = expected_row if ok else _row(cell.get("actual"))
        moved_from = None if ok else cell.get("actual_block")
        fault = _value_fault(expected_row, data.get("layer"), data.get("block"), diagnosis) if actual_row is None and expected_row else None
        actual = f"{_label(expected_row)} with wrong values ({fault})" if fault else _label(actual_row, moved_from)
        tip = _text(f"element offset {cell.get('offset')}: expected {_label(expected_row)}; actual {actual}")
        expected_fill = FOREIGN if expected_row is None else KV_COLOR[expected_row[0]]
        parts.append(f'<rect x="{x}" y="{y + 18}" width="{CELL}" height="{CELL}" fill="{expected_fill}"><title>{tip}</title></rect>')
        fill = WRONG_VALUES if fault else FOREIGN if actual_row is None else KV_COLOR[actual_row[0]]
        stroke = "" if ok else ' stroke="#d62728" stroke-width="2.5"'
        parts.append(f'<rect x="{x}" y="{y + panel_h + 48}" width="{CELL}" height="{CELL}" fill="{fill}"{stroke}><title>{tip}</title></rect>')
    legend_y = 2 * panel_h + 66
    for i, (name, color) in enumerate((("K row", KV_COLOR[0]), ("V row", KV_COLOR[1]), ("no logical row", FOREIGN),
                                       ("its own row, wrong values", WRONG_VALUES))):
        x, y = (i % 3) * 130, legend_y + (i // 3) * 16
        parts.append(f'<rect x="{x}" y="{y}" width="12" height="12" fill="{color}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 11}" font-size="12">{name}</text>')
    parts.append("</svg>")
    return Markup("".join(parts))
