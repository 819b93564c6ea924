"""The equivalence matrix of a (merged) report: backend@platform × backend@platform.

For the golden cases both columns wrote, a cell says: identical page bytes (same layout and
format), equivalent (same canonical bytes: a layout conversion away), equivalent after the
exact fp8 conversion, or differs.
"""

from __future__ import annotations

from collections import defaultdict

from .matrix import column_of

RANK = ("differs", "fp8-conversion", "layout-conversion", "identical")


def _verdict(a: dict, b: dict) -> str:
    from conformance.equivalence import compare_entries  # the one definition of "equivalent"

    if a["layout"] == b["layout"] and a["fp8_format"] == b["fp8_format"]:
        return "identical" if a["page"] == b["page"] else "differs"
    if a["fp8_format"] == b["fp8_format"]:
        return "layout-conversion" if a["canonical"] == b["canonical"] else "differs"
    canon = dict(a, layout=b["layout"], layout_shape=b["layout_shape"], era=b["era"])  # compare content, not layout
    return "fp8-conversion" if compare_entries(canon, b) is None else "differs"


def equivalence_matrix(documents: list[dict]) -> tuple[list[str], dict[tuple[str, str], str]]:
    """Columns with digests and the worst verdict over their shared golden cases."""
    by_column = defaultdict(lambda: defaultdict(list))
    for document in documents:
        for record in document["tests"]:
            if record.get("digest") and record["check"] == "test_canonical_bytes_equal_the_committed_reference_digests":
                by_column[column_of(record)][record["digest"]["case"]].append(record["digest"])
    columns = list(by_column)
    cells = {}
    for x in columns:
        for y in columns:
            verdicts = [_verdict(a, b) for case in by_column[x].keys() & by_column[y].keys() for a in by_column[x][case] for b in by_column[y][case]]
            if verdicts:
                cells[(x, y)] = min(verdicts, key=RANK.index)
    return columns, cells
