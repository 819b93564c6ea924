"""kvconform's own plain lines (the report header, the start-up notes), folded to the
terminal's width so an 80-column CI log shows each one whole, continuation lines indented."""

from __future__ import annotations

import shutil
import textwrap


def fold(line: str, width: int | None = None, indent: str = "    ") -> list[str]:
    """``line`` as lines of at most ``width`` columns (default: the terminal's, ``COLUMNS``, else 80),
    broken at spaces only: a path or a version longer than the width stays whole on its line."""
    width = width or shutil.get_terminal_size().columns
    lead = line[: len(line) - len(line.lstrip(" "))]
    return textwrap.wrap(line, width, subsequent_indent=lead + indent, break_long_words=False, break_on_hyphens=False) or [line]
