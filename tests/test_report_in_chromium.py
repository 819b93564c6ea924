"""The HTML report in real headless Chromium: the matrix renders, a failing cell's drill-down
is reachable, a backend called ``<script>…`` stays text. The screenshot is kept as a CI artifact
(kvconform-results/report-screenshot.png)."""

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser

import pytest

from kvconform.reports.html import render_runs

from .suite_runs import ROOT, run_suite
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--hide-scrollbars"]

if not CHROMIUM:
    if os.environ.get("KVCONFORM_REQUIRE_CHROMIUM") == "1":
        raise RuntimeError("KVCONFORM_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)")
    pytestmark = pytest.mark.skip(reason="Debian chromium not installed (CI installs it)")


class Dom(HTMLParser):
    """Element ids, link targets, open <details> ids and text of the rendered DOM."""

    def __init__(self):
        super().__init__()
        self.ids, self.links, self.tags, self.text, self.open_in = {}, [], [], [], {}
        self.section = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append(tag)
        if "id" in attrs:
            self.ids[attrs["id"]] = tag
            if tag == "section":
                self.section = attrs["id"]
        if tag == "a" and attrs.get("href", "").startswith("#"):
            self.links.append((attrs["href"][1:], attrs))
        if tag == "details" and "open" in attrs and self.section:
            self.open_in.setdefault(self.section, 0)
            self.open_in[self.section] += 1

    def handle_data(self, data):
        self.text.append(data)


def chromium(url: str, *args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args, url], capture_output=True, text=True, timeout=120)
    return proc.stdout


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    run = run_suite(tmp, "-m", "write or split", "--backend", "reference,mutant:kv_first_reported_as_blocks_first")
    hostile = {"schema": "kvconform-results/1", "environment": {"device": "cpu", "device_name": "x", "backends": {}},
               "tests": [{"nodeid": "t::x[<script>alert(1)</script>]", "backend": "<script>alert(1)</script>", "platform": "cpu",
                          "arch": "", "family": "write", "check": "test_written_elements_land_at_reference_offsets_and_nothing_else_changes",
                          "outcome": "passed", "message": ""}]}
    html = tmp / "report.html"
    html.write_text(render_runs([run.document, hostile]))
    return html


def test_report_renders_the_matrix_and_a_reachable_failing_drill_down(report):
    dom = Dom()
    dom.feed(chromium(report.as_uri(), "--dump-dom"))
    assert dom.ids.get("matrix") == "table"
    failing = [target for target, attrs in dom.links if "kv-first-reported-as-blocks-first" in target]
    assert failing, "no link from a failing mutant cell"
    assert all(dom.ids.get(target) == "section" for target in failing)
    assert any(dom.open_in.get(target) for target in failing), "failing details are not expanded"
    assert "svg" in dom.tags


def test_a_script_backend_name_is_text_not_code(report):
    dom = Dom()
    dom.feed(chromium(report.as_uri(), "--dump-dom"))
    assert "script" not in dom.tags
    assert any("<script>alert(1)</script>" in t for t in dom.text)


def test_screenshot_is_saved_as_an_artifact(report):
    shot = ROOT / "kvconform-results" / "report-screenshot.png"
    shot.parent.mkdir(exist_ok=True)
    chromium(report.as_uri(), f"--screenshot={shot}", "--window-size=1400,1200")
    assert shot.exists() and shot.stat().st_size > 10_000
