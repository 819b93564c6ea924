"""The HTML report in real headless Chromium: the matrix renders, a failing cell's drill-down
is reachable, a backend called ``<script>…`` stays text. The screenshot is kept as a CI artifact
(kvconform-results/report-screenshot.png)."""

import os
import re
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


class Details(HTMLParser):
    """Per test <details> of the rendered DOM: its outcome, whether it is open, and what it holds
    (property line, mismatch table, byte-map picture, repro line) and the tooltips of its picture."""

    def __init__(self):
        super().__init__()
        self.tests, self.depth, self.current, self.counts = {}, 0, None, None
        self._in_counts = self._in_title = False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "details":
            self.depth += 1
            if "data-nodeid" in attrs:
                self.current = self.tests[attrs["data-nodeid"]] = {"outcome": attrs["data-outcome"], "open": "open" in attrs,
                                                                   "depth": self.depth, "holds": set(), "titles": []}
        elif self.current is not None:
            classes = set((attrs.get("class") or "").split())
            self.current["holds"] |= {name for name, hit in (("property", "property" in classes), ("mismatches", tag == "table" and "mismatches" in classes),
                                                             ("picture", tag == "svg"), ("repro", "repro" in classes)) if hit}
        self._in_title = tag == "title" and self.current is not None
        self._in_counts = attrs.get("id") == "counts"

    def handle_endtag(self, tag):
        if tag == "details":
            if self.current is not None and self.current["depth"] == self.depth:
                self.current = None
            self.depth -= 1

    def handle_data(self, data):
        if self._in_title:
            self.current["titles"].append(data)
            self._in_title = False
        if self._in_counts:
            self.counts = data
            self._in_counts = False


def test_a_default_run_of_a_failing_backend_shows_every_failure_whole(tmp_path):
    """All families (the connector family's interop table included) of a backend with one
    planted bug, and a known failure from an expectations file: every new failure's detail is
    open with its property line, mismatch table, picture and repro; known failures are closed."""
    known = "conformance/test_write.py::test_key_rows_beyond_slot_mapping_are_ignored[mutant:write_one_bit_flipped-*]"
    (tmp_path / "known.txt").write_text(f"https://bugs.example/1 [ ] {known} [ Fail ]\n")
    run = run_suite(tmp_path, "--kvc-backend", "mutant:write_one_bit_flipped", "--kvc-expectations", str(tmp_path / "known.txt"), "-n", "2")
    records = run.records
    html = tmp_path / "results.html"
    dom = Details()
    dom.feed(chromium(html.as_uri(), "--dump-dom"))
    failed = [r for r in records if r["outcome"] in ("failed", "error")]
    assert failed and {r["family"] for r in records} >= {"connector", "write"}
    for r in failed:
        shown = dom.tests[r["nodeid"]]
        wants = {"property", "repro"} | ({"mismatches"} if (r["failure"] or {}).get("mismatches") else set()) | \
                ({"picture"} if (r["failure"] or {}).get("byte_map") else set())
        assert shown["open"] and wants <= shown["holds"], (r["nodeid"], shown)
    pictured = [r for r in failed if (r["failure"] or {}).get("byte_map")
                and any(f["fault"] == "bit-flip" for f in r["failure"].get("diagnosis") or [])]
    assert pictured, "no failure of the bit-flip mutant has a picture"
    for r in pictured:  # a value fault's rows are drawn in place with wrong values, never as "no logical row" (#38 item 5)
        tips = dom.tests[r["nodeid"]]["titles"]
        assert any("with wrong values (bit-flip)" in t for t in tips), (r["nodeid"], tips[:4])
        assert not any("actual no logical row" in t for t in tips), (r["nodeid"], [t for t in tips if "no logical row" in t][:4])
    assert sum(1 for r in failed if (r["failure"] or {}).get("mismatches")) == sum(1 for r in failed if "mismatches" in dom.tests[r["nodeid"]]["holds"])
    expected = [r for r in records if r["outcome"] == "expected-failure"]
    assert expected and not any(dom.tests[r["nodeid"]]["open"] for r in expected)
    assert sum(int(n) for n in re.findall(r"(\d+) [a-z]", dom.counts)) == len(records)
