"""The interop table: built from a run's connector records, readable at 80 columns, in the HTML
report, and merged across machines (cells between runs judged by descriptor, not executed)."""

import copy

import pytest
from rich.console import Console

from kvconform.reports import interop
from kvconform.reports.html import render_runs
from kvconform.reports.terminal import render

from .suite_runs import run_suite


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    result = run_suite(tmp_path_factory.mktemp("interop"), "-n", "2", "--backend", "reference,reference_gfx942,triton_flash", "-m", "connector", "-k", "shipped")
    assert result.returncode == 0, result.output
    return result.document


GFX942_MODEL = "reference_gfx942 E1:NHD@cpu (models rocm-gfx942)"  # a model of an MI300 run on a CPU is labelled as one


def test_the_table_says_what_compat_and_the_executed_plans_say(run):
    table = interop.build([run])
    assert "triton_flash E1:NHD@cpu" in table.rows and "reference_kv_first E0:NHD@cpu" in table.columns
    same = table.cell("triton_flash E1:NHD@cpu", "reference E1:NHD@cpu")
    assert same.summary == "identical" and same.scenarios["N16to32"] == {"outcome": "converted", "detail": "re-block", "executed": True}
    assert table.cell("triton_flash E1:NHD@cpu", "reference E1:HND@cpu").scenarios["tp1to2"]["detail"] == "layout"
    fnuz_to_fn = table.cell(GFX942_MODEL, "reference E1:NHD@cpu")
    assert fnuz_to_fn.summary == "mixed" and "0x7f" in fnuz_to_fn.scenarios["fp8"]["detail"]
    assert table.cell("reference E1:NHD@cpu", GFX942_MODEL).scenarios["fp8"]["outcome"] == "converted"
    assert table.cell("triton_flash E1:NHD@cpu", "reference_kv_first E0:NHD@cpu").summary == "incompatible"


def test_merged_machines_meet_by_descriptor(run):
    h200 = copy.deepcopy(run)  # the same run as an H200 would record it
    for record in h200["tests"]:
        record["run_platform"] = "cuda-sm90"
        if record.get("interop") and record["backend"] == "triton_flash":
            record["interop"]["endpoint"]["platform"] = "cuda-sm90"
    table = interop.build([run, h200])
    cross = table.cell("triton_flash E1:HND@cuda-sm90", "reference_gfx942 E1:NHD@cuda-sm90 (models rocm-gfx942)")
    local = table.cell("reference E1:HND@cpu", GFX942_MODEL)
    assert cross.executed and local.executed  # the H200 run executed its own peers
    by_descriptor = table.cell(GFX942_MODEL, "triton_flash E1:HND@cuda-sm90")
    assert not by_descriptor.executed
    assert {n: s["outcome"] for n, s in by_descriptor.scenarios.items()} == \
        {n: s["outcome"] for n, s in table.cell(GFX942_MODEL, "triton_flash E1:HND@cpu").scenarios.items()}
    assert "by descriptor" in by_descriptor.scenarios["fp8"]["detail"]


def test_terminal_table_fits_80_columns_and_the_html_report_has_it(run):
    console = Console(width=80, record=True, force_terminal=False)
    interop.render_terminal(interop.build([run]), console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80 and any(line.strip().startswith("1  reference") for line in lines)
    assert "interop: producers" in render([run], color=False, width=100)
    html = render_runs([run])
    assert 'id="interop"' in html and "triton_flash E1:NHD@cpu" in html
