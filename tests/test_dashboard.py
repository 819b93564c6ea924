"""``kvconform dashboard``: a static site of many runs, from synthetic runs of one vLLM backend across
three releases (the fp8 e5m2 check starts failing in 0.33.0, the padding check is fixed there, the
decode check is not applicable in 0.34.0), the same backend on an H200 and the reference backend.
The site's counts, diffs, history and clauses are read from index.json and the pages; every link
must reach a file of the site; URLs depend on content, not on input order; bad inputs are refused
naming the file; the index and the diff picker are opened in headless Chromium."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from kvconform.conformance.plugin.collection import FAMILIES
from kvconform.reports import dashboard, dashboard_model, submission

from kvconform.cli import main as kvconform_main
from kvconform.errors import InputError

from .dashboard_runs import document, record, write

V = "vllm:TRITON_ATTN"
FP8, PAD, DECODE = "test_fp8_e5m2_cache_holds_e5m2_codes", "test_padding_slots_leave_cache_untouched", "test_decode_reads_what_was_written"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000"]
needs_chromium = pytest.mark.skipif(not CHROMIUM and os.environ.get("KVCONFORM_REQUIRE_CHROMIUM") != "1",
                                    reason="Debian chromium not installed (CI installs it)")


def vllm_run(version: str, fp8: str, pad: str, decode: str, created: int, platform: str = "cpu") -> dict:
    records = [record(V, FP8, f"NHD-{dtype}", fp8 if dtype == "e5m2" else "passed", clauses=("FP8-FORMAT-1",), run_platform=platform)
               for dtype in ("e5m2", "e4m3")]
    records += [record(V, PAD, f"NHD-{n}", pad if n == 2 else "passed", clauses=("WRITE-PAD-1",), fault="padding-written", run_platform=platform)
                for n in range(3)]
    records += [record(V, DECODE, "NHD", decode, family="read", clauses=("READ-1",), run_platform=platform),
                record(V, "test_block_shapes", "NHD", "passed", family="shape", clauses=("SHAPE-1",), run_platform=platform)]
    return document(records, created=created, libraries={V: {"vllm": version}}, run_platform=platform)


def make_inputs(directory: Path) -> list[Path]:
    reference = [record("reference", FP8, "NHD-e5m2", "passed", clauses=("FP8-FORMAT-1",)),
                 record("reference", DECODE, "NHD", "passed", family="read", clauses=("READ-1",))]
    return [write(directory / "vllm-0.34.0-h200.json", vllm_run("0.34.0", "failed", "passed", "passed", 1_792_000_100, "cuda-sm90")),
            write(directory / "vllm-0.33.0.json", vllm_run("0.33.0", "failed", "passed", "passed", 1_791_000_000)),
            write(directory / "reference.json", document(reference, created=1_792_000_200)),
            write(directory / "vllm-0.32.0.json", vllm_run("0.32.0", "passed", "failed", "passed", 1_790_000_000)),
            write(directory / "vllm-0.34.0.json", vllm_run("0.34.0", "failed", "passed", "not-applicable", 1_792_000_000))]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[Path]:
    return make_inputs(tmp_path_factory.mktemp("runs"))


@pytest.fixture(scope="module")
def site(inputs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site") / "dashboard"
    assert kvconform_main(["dashboard", *map(str, inputs), "-o", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def index(site) -> dict:
    return json.loads((site / "index.json").read_text())


def entry(index: dict, backend: str, platform: str, version: str) -> dict:
    return next(e for e in index["entries"] if (e["backend"], e["platform"], e["version"]) == (backend, platform, version))


def series(index: dict, backend: str, platform: str) -> dict:
    return next(s for s in index["series"] if (s["backend"], s["platform"]) == (backend, platform))


def nodeid(check: str, params: str, family: str = "write") -> str:
    return f"conformance/test_{family}.py::{check}[{V}-{params}]"


class Page(HTMLParser):
    """Ids, links (href and src) and text of one HTML file."""

    def __init__(self, path: Path):
        super().__init__()
        self.ids, self.links, self.text = set(), [], []
        self.feed(path.read_text())

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.ids.add(attrs.get("id"))
        self.links += [attrs[name] for name in ("href", "src") if attrs.get(name)]

    def handle_data(self, data):
        self.text.append(data)


def test_the_grid_counts_each_family_of_each_backend_version(site, index):
    latest = entry(index, V, "cpu", "0.34.0")
    assert latest["families"] == {"write": {"passed": 4, "failed": 1}, "read": {"not-applicable": 1}, "shape": {"passed": 1}}
    assert entry(index, V, "cuda-sm90", "0.34.0")["families"]["read"] == {"passed": 1}
    assert [entry_id.split("-")[0] for entry_id in index["grid"]["cpu"]] == [entry(index, b, "cpu", v)["run"] for b, v in
                                                                            (("reference", "0.2.0"), (V, "0.32.0"), (V, "0.33.0"), (V, "0.34.0"))]
    row = (site / "index.html").read_text().split(f'data-entry="{latest["id"]}"')[1].split("</tr>")[0]
    assert re.findall(r'<span class="word">([^<]*)</span><span class="counts">([^<]*)</span>', row) == [
        ("✗ FAIL", "5 pass · 1 fail · 1 n/a"), ("✓ pass", "1 pass"), ("✗ FAIL", "4 pass · 1 fail"), ("– n/a", "1 n/a")]


def test_the_diff_of_two_releases_shows_the_regression_and_the_fix_with_diagnosis_and_repro(site, index):
    first, second = series(index, V, "cpu")["changes"]
    assert [c["test"] for c in first["newly_failing"]] == [nodeid(FP8, "NHD-e5m2")]
    assert [c["test"] for c in first["fixed"]] == [nodeid(PAD, "NHD-2")]
    assert [c["test"] for c in second["newly_not_applicable"]] == [nodeid(DECODE, "NHD", "read")]
    assert not first["newly_not_applicable"] and not second["newly_failing"] and not second["fixed"]
    page = " ".join(Page(site / first["page"]).text)
    newly, fixed = page.split("Newly failing (1)")[1].split("Fixed (1)")
    assert "holds e4m3 codes: fp8-format" in newly and f"--kvc-backend {V}" in newly
    assert "padding-written" in fixed.split("Newly not applicable")[0]
    assert "does not declare op 'decode'" in " ".join(Page(site / second["page"]).text)


def test_history_names_the_release_where_each_failing_check_started_to_fail(index):
    s = series(index, V, "cpu")
    checks = {c["check"]: c for c in s["checks"]}
    assert set(checks) == {FP8, PAD}
    assert checks[FP8]["marks"] == ["", "regression", ""]
    assert checks[FP8]["failing_since"] == entry(index, V, "cpu", "0.33.0")["id"]
    assert checks[PAD]["marks"] == ["", "fixed", ""] and checks[PAD]["failing_since"] is None


def test_the_clause_view_says_which_backends_hold_each_clause(site, index):
    fp8 = index["clauses"]["FP8-FORMAT-1"]
    assert fp8[entry(index, "reference", "cpu", "0.2.0")["id"]]["verdict"] == "holds"
    violated = fp8[entry(index, V, "cpu", "0.34.0")["id"]]
    assert violated["verdict"] == "violated" and (site / violated["first_failure"]).is_file()
    assert index["clauses"]["READ-1"][entry(index, V, "cpu", "0.34.0")["id"]]["verdict"] == "not run"
    row = (site / "clauses.html").read_text().split('data-clause="FP8-FORMAT-1"')[1].split("</tr>")[0]
    assert re.findall(r'data-verdict="([^"]+)"', row) == ["holds", "violated", "violated"]  # reference, vLLM on cpu, on cuda-sm90


def test_urls_come_from_the_runs_content_not_from_the_input_order(inputs, site, index, tmp_path):
    again = tmp_path / "again"
    dashboard.build([str(p) for p in reversed(inputs)], str(again))
    files = sorted(str(p.relative_to(site)) for p in site.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(again)) for p in again.rglob("*") if p.is_file())
    assert all((site / f).read_bytes() == (again / f).read_bytes() for f in files)
    source = next(p for p in inputs if p.name == "vllm-0.33.0.json")
    run_id = "r" + hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    failure = entry(index, V, "cpu", "0.33.0")["failures"][0]
    assert failure["detail"].startswith(f"detail/{run_id}-") and failure["detail"].endswith(f"/{hashlib.sha256(failure['test'].encode()).hexdigest()[:16]}.html")


def test_every_link_reaches_a_file_of_the_site_and_every_fragment_an_element(site):
    pages = {path: Page(path) for path in site.rglob("*.html")}
    checked = 0
    for path, page in pages.items():
        for link in page.links:
            parts = urlsplit(link)
            assert not parts.scheme and not parts.netloc, f"{path.name}: external link {link}"
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            assert target.is_file() and site.resolve() in target.parents, f"{path.relative_to(site)}: {link} reaches no file of the site"
            if parts.fragment:
                assert parts.fragment in pages[target].ids, f"{path.relative_to(site)}: {link}: no element #{parts.fragment}"
            checked += 1
    assert checked > 100


def test_every_failure_has_its_detail_page_rendered_as_in_the_html_report(site, index):
    failures = [f for e in index["entries"] for f in e["failures"]]
    assert len(failures) == 4  # padding in 0.32.0, fp8 e5m2 in 0.33.0 and in 0.34.0 on both platforms
    for failure in failures:
        page = (site / failure["detail"]).read_text()
        assert f'data-nodeid="{failure["test"]}"' in page and 'class="mismatches"' in page and 'class="repro"' in page
    since = (site / entry(index, V, "cpu", "0.34.0")["failures"][0]["detail"]).read_text()
    assert re.search(r"Failing since <b>vllm 0.33.0</b> \(2026-10-03\); it did not fail in vllm 0.32.0", since)


def test_the_dashboard_orders_families_as_the_suite_does(index):
    assert list(dashboard_model.FAMILY_ORDER) == [f for f in FAMILIES if f in dashboard_model.FAMILY_ORDER]  # a new family sorts after them
    assert index["families"] == ["shape", "write", "read"]


def test_a_certified_bundle_is_read_as_its_run_and_a_changed_one_is_refused(tmp_path):
    doc = vllm_run("0.34.0", "failed", "passed", "passed", 1_792_000_000)
    bundle = tmp_path / "bundle"
    submission.write_bundle(str(bundle), doc, collected=[r["nodeid"] for r in doc["tests"]], must_pass=[],
                            command={"line": "kvconform certify --backend vllm:TRITON_ATTN"}, digests_header={"schema": submission.DIGEST_SCHEMA},
                            canary={})
    d = dashboard.build([str(bundle)], str(tmp_path / "site"))
    assert d.runs[0].bundle_sha256 == hashlib.sha256((bundle / "SHA256SUMS").read_bytes()).hexdigest()
    assert "certified" in (tmp_path / "site" / d.entries[0].page).read_text()
    (bundle / "results.json").write_text((bundle / "results.json").read_text().replace('"failed"', '"passed"'))
    with pytest.raises(InputError, match=f"{re.escape(str(bundle))}: not an intact certified bundle: checksum mismatch: results.json"):
        dashboard.build([str(bundle)], str(tmp_path / "site"))


@pytest.mark.parametrize("name, text, says", [
    ("garbled.json", "{not json", "not a readable"),
    ("other-schema.json", json.dumps({"schema": "kvconform-results/0", "tests": []}), "results schema 'kvconform-results/0'"),
    ("no-outcome.json", None, "tests[0].outcome"),
])
def test_a_malformed_input_is_refused_naming_the_file_and_nothing_is_written(tmp_path, capsys, name, text, says):
    if text is None:
        doc = vllm_run("0.34.0", "failed", "passed", "passed", 1)
        del doc["tests"][0]["outcome"]
        text = json.dumps(doc)
    bad = tmp_path / name
    bad.write_text(text)
    good = make_inputs(tmp_path / "good")[0]
    assert kvconform_main(["dashboard", str(good), str(bad), "-o", str(tmp_path / "site")]) == 2
    assert f"{bad}: " in capsys.readouterr().err and says
    with pytest.raises(InputError, match=re.escape(says)):
        dashboard.build([str(bad)], str(tmp_path / "site"))
    assert not (tmp_path / "site").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".site")]


def test_the_same_run_given_twice_and_a_plain_directory_are_refused(tmp_path):
    run = make_inputs(tmp_path / "runs")[0]
    with pytest.raises(InputError, match=f"{re.escape(str(run))}: the same run as {re.escape(str(run))}"):
        dashboard.build([str(run), str(run)], str(tmp_path / "site"))
    with pytest.raises(InputError, match=f"{re.escape(str(tmp_path / 'runs'))}: a directory without manifest.json"):
        dashboard.build([str(tmp_path / "runs")], str(tmp_path / "site"))


def test_a_rebuild_replaces_the_whole_site_and_a_directory_of_other_files_is_left_alone(tmp_path):
    runs = make_inputs(tmp_path / "runs")
    out = tmp_path / "site"
    dashboard.build([str(p) for p in runs], str(out))
    dashboard.build([str(runs[1])], str(out))
    assert len(json.loads((out / "index.json").read_text())["runs"]) == 1
    assert len(list((out / "runs").iterdir())) == 1  # the other runs' pages went with the old site
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    with pytest.raises(InputError, match="not a kvconform dashboard"):
        dashboard.build([str(runs[1])], str(tmp_path / "mine"))
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"


def chromium(url: str) -> tuple[str, str]:
    """(the DOM after the page's scripts ran, what Chromium logged)."""
    assert CHROMIUM, "KVCONFORM_REQUIRE_CHROMIUM=1 but no chromium on PATH (apt-get install chromium)"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url], check=False, capture_output=True, text=True, timeout=120)
    return proc.stdout, proc.stderr


@needs_chromium
def test_in_chromium_the_grid_loads_without_console_messages_and_its_cells_link_to_pages_that_exist(site):
    dom, log = chromium((site / "index.html").as_uri())
    assert [line for line in log.splitlines() if "CONSOLE" in line] == []
    cells = re.findall(r'<td class="v [^"]*" data-outcome="[^"]*"><a href="([^"]+)"', dom)
    assert len(cells) == 4 * 4 + 3  # the vLLM rows: all and three families; the reference: all, write, read
    for href in cells:
        path, _, fragment = href.partition("#")
        assert (site / path).is_file() and (not fragment or fragment in Page(site / path).ids), href


@needs_chromium
def test_in_chromium_the_diff_picker_compares_two_runs_from_the_embedded_data(site, index):
    older, newer = entry(index, V, "cpu", "0.32.0")["id"], entry(index, V, "cpu", "0.33.0")["id"]
    dom, log = chromium((site / "diff.html").as_uri() + f"?a={older}&b={newer}")
    assert [line for line in log.splitlines() if "CONSOLE" in line] == []
    assert re.search(r'id="diff-summary"[^>]*>1 newly failing · 1 fixed · 0 newly not applicable', dom)
    failing = dom.split("Newly failing (1)")[1].split("Fixed (1)")[0]
    assert "test_fp8_e5m2_cache_holds_e5m2_codes[{backend}-NHD-e5m2]" in failing and "fp8-format" in failing


def test_names_from_a_results_file_are_text_not_markup(tmp_path):
    evil = "<script>alert(1)</script>"
    doc = document([record(evil, FP8, "NHD", "failed", clauses=("<b>X</b>",))], created=1, libraries={evil: {"vllm": "<i>0.1</i>"}})
    d = dashboard.build([str(write(tmp_path / "evil.json", doc))], str(tmp_path / "site"))
    for page in (tmp_path / "site").rglob("*.html"):
        scripts = re.findall(r"<script[^>]*>", page.read_text())
        assert set(scripts) <= {'<script src="dashboard.js">', '<script src="data/tests.js">'}, page
        assert "<i>0.1</i>" not in page.read_text() and "<b>X</b>" not in page.read_text()
    assert evil in " ".join(Page(tmp_path / "site" / d.entries[0].page).text)


FIELD = Path(__file__).resolve().parents[1] / "docs" / "field"


def field_results() -> list[Path]:
    """The committed results of vLLM releases (issue 40): every results document under docs/field/."""
    return sorted(p for p in FIELD.rglob("*.json") if '"schema": "kvconform-results/1"' in p.read_text(errors="replace")[:200])


@needs_chromium
def test_the_field_dashboard_builds_and_in_chromium_every_cell_links_to_a_page_that_exists(tmp_path):
    results = field_results()
    if not results:
        pytest.skip("docs/field/ holds no results files yet")
    out = tmp_path / "field"
    assert kvconform_main(["dashboard", *map(str, results), "-o", str(out)]) == 0
    dom, log = chromium((out / "index.html").as_uri())
    assert [line for line in log.splitlines() if "CONSOLE" in line] == []
    cells = re.findall(r'<td class="v [^"]*" data-outcome="[^"]*"><a href="([^"]+)"', dom)
    assert cells
    for href in cells:
        path, _, fragment = href.partition("#")
        assert (out / path).is_file() and (not fragment or fragment in Page(out / path).ids), href


def test_a_partial_run_says_so_in_its_grid_row(tmp_path):
    doc = vllm_run("0.34.0", "failed", "passed", "passed", 1)
    doc["completion"] = {"complete": False, "reasons": [{"kind": "filtered", "what": "-m write selects part of the suite"}]}
    d = dashboard.build([str(write(tmp_path / "partial.json", doc))], str(tmp_path / "site"))
    row = (tmp_path / "site" / "index.html").read_text().split(f'data-entry="{d.entries[0].id}"')[1].split("</tr>")[0]
    assert re.search(r'class="partial-run" title="PARTIAL RUN \(filtered: -m write selects part of the suite\)[^"]*">partial run<', row)
    assert json.loads((tmp_path / "site" / "index.json").read_text())["runs"][0]["complete"] is False
