"""The self-contained HTML compatibility report (Jinja2, autoescaped; no network, no scripts)."""

from __future__ import annotations

import time

from jinja2 import Environment, PackageLoader, select_autoescape

from .coverage import SIZE_CLASSES, VALUE_CLASSES, is_fp8_label
from .coverage import build as build_coverage
from . import interop, results
from .draws import summary as draw_summary
from .equivalence import equivalence_matrix
from .matrix import build
from .mutation import kill_rates
from .results import FAILING
from .svg import byte_map_svg
from .terminal import cell_text

_ENV = Environment(loader=PackageLoader("kvconform.reports", "templates"), autoescape=select_autoescape(["html", "j2"]))


def render_runs(documents: list[dict]) -> str:
    """One HTML page for one or more result documents (columns: backend@platform)."""
    stale = [entry for document in documents for entry in document.get("stale_expectations", [])]
    records = [r for d in documents for r in d["tests"]]
    # Sections of some runs only: built when their records are there.
    mutants, families = kill_rates(documents) if results.any_mutant(documents) else ([], {})
    eq_columns, eq_cells = equivalence_matrix(documents) if any(r.get("digest") for r in records) else ([], {})
    table = interop.build(documents) if any(r.get("interop") for r in records) else None
    together = documents[0] if len(documents) == 1 else {"completion": results.merged(documents)}
    coverage = build_coverage(documents)
    left_out = {name: why for d in documents for name, why in (results.of(d).get("backends_left_out") or {}).items()}
    return _ENV.get_template("report.html.j2").render(
        partial=results.headline(together), left_out=left_out, draw_summary=draw_summary,
        eq_columns=eq_columns if len(eq_columns) > 1 else [], eq_cells=eq_cells, interop=table,
        mutants=mutants, kill_families=families,
        runs=documents, matrix=build(documents), cell_text=cell_text, byte_map_svg=byte_map_svg,
        verdict=results.verdict(documents, holes=len(coverage.holes)), counts_text=results.counts_text, all_records=records,
        failing=FAILING, stale=stale, total=len(records),
        coverage=coverage, size_classes=SIZE_CLASSES, value_classes=VALUE_CLASSES, is_fp8_label=is_fp8_label,
        generated=time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    )
