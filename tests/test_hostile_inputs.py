"""A green verdict is never a lie and nothing a user wrote is lost: interrupted runs, filtered
runs, bad options, unwritable paths, tampered files and odd names (issue #17, docs/RELIABILITY.md).

To extend: add a case to the table that fits (BAD_OPTIONS for a usage error, HOSTILE_NAMES
for a string that must print as itself), or a test named for the promise it checks.
"""

import copy
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import pytest
import torch

from kvconform.conformance.harness import digests, equivalence
from kvconform.conformance.plugin.collection import suite_command
from kvconform.errors import InputError
from kvconform.reports import cli, expectations, junit, matrix
from kvconform.reports import svg as svg_builder
from kvconform.reports.equivalence import compare_entries
from kvconform.reports.html import render_runs
from kvconform.reports.mutation import kill_rates
from kvconform.reports.terminal import printable, render

from .suite_runs import ROOT, run_suite

PADDING = ("-m", "write", "-k", "padding_slots")  # three quick checks per backend


def record(backend="reference", family="write", outcome="passed", check="test_x", **extra):
    return {"nodeid": f"conformance/test_{family}.py::{check}[{backend}]", "backend": backend, "platform": "cpu", "arch": "",
            "family": family, "check": check, "outcome": outcome, "message": "", "failure": None, **extra}


def document(*records, complete=True, backends=None):
    return {"schema": "kvconform-results/1", "environment": {"device": "cpu", "device_name": "cpu", "backends": backends or {}},
            "completion": {"complete": complete, "reasons": [] if complete else [{"kind": "interrupted", "what": "SIGINT"}]},
            "tests": list(records)}


# ----------------------------------------------------------------------------- interrupted runs
def test_an_interrupted_run_says_so_everywhere_and_keeps_the_complete_result_it_would_replace(tmp_path):
    out = tmp_path / "results.json"
    earlier = document(record(), complete=True)
    out.write_text(json.dumps(earlier))
    baseline = tmp_path / "exp.txt"
    baseline.write_text("bug-1 [ ] conformance/test_write.py::test_padding_slots_leave_cache_untouched[fault:hang_on_write-*] [ Fail ]\n")
    cmd = suite_command("-v", "--kvc-json", str(out), "--junitxml", str(tmp_path / "junit.xml"), "--kvc-backend", "reference,fault:hang_on_write",
                        "--kvc-expectations", str(baseline), "--kvc-update-expectations", str(baseline), *PADDING)
    # Ctrl-C as a terminal sends it: a job started in the background (`cmd &` in a script) runs with
    # SIGINT ignored, and a Python started so installs no KeyboardInterrupt handler at all.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: proc.stdout.read(1), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while "[fault:hang_on_write-" not in "".join(seen) and time.monotonic() < deadline:  # the hanging test has started
        time.sleep(0.2)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    output = "".join(seen)
    written = json.loads(out.read_text())
    assert proc.returncode == 2, output[-3000:]
    assert written["completion"]["complete"] is False
    assert {r["kind"] for r in written["completion"]["reasons"]} >= {"interrupted", "no-verdict", "filtered"}
    assert written["completion"]["selected"] > written["completion"]["recorded"] == len(written["tests"]) > 0
    assert json.loads((tmp_path / "results.complete.json").read_text()) == earlier  # the complete run was kept, and said so
    assert "held a complete run; kept it as" in output and "PARTIAL RUN (interrupted" in output
    assert 'id="partial"' in (tmp_path / "results.html").read_text()
    completion_case = ET.parse(tmp_path / "junit.xml").find(".//testcase[@name='completion']")
    assert completion_case.find("error").get("type") == "kvconform.partial-run"
    assert "REFUSED to update" in output and baseline.read_text().startswith("bug-1 [ ]")  # the vendor file is untouched


# ----------------------------------------------------------------------------- vendor files
def test_update_expectations_on_a_filtered_run_keeps_every_entry_outside_the_selection(tmp_path):
    swap = "conformance/test_swap.py::test_swap_out_places_each_block_at_its_host_slot[mutant:swap_indexes_dim1-E1:NHD]"
    vendor = [
        "# ACME baseline, triaged by hand",
        "https://bugs.acme/1 [ rocm gfx942 ] conformance/test_write.py::* [ Fail ]",
        f"https://bugs.acme/2 [ ] {swap} [ Fail ]",
        "https://bugs.acme/3 [ ] conformance/test_gating.py::test_connector_support_matches_the_layouts[reference] [ Fail ]",
        "https://bugs.acme/4 [ ] conformance/test_read.py::*[mutant:swap_indexes_dim1-*] [ Skip ]",
    ]
    baseline = tmp_path / "exp.txt"
    baseline.write_text("\n".join(vendor) + "\n")
    run = run_suite(tmp_path, "-m", "gating", "--backend", "reference,mutant:swap_indexes_dim1",
                    "--expectations", str(baseline), "--update-expectations", str(baseline))
    lines = baseline.read_text().splitlines()
    assert run.returncode == 0, run.output
    assert lines == [line for line in vendor if "bugs.acme/3" not in line]  # only the fixed gating entry went
    assert "1 fixed entry removed" in run.proc.stdout and "3 outside this run's selection kept" in run.proc.stdout


def test_update_expectations_refuses_to_merge_into_another_existing_file(tmp_path):
    (tmp_path / "a.txt").write_text("# gate\n")
    (tmp_path / "b.txt").write_text("bug [ ] conformance/test_write.py::x [ Fail ]\n")
    run = run_suite(tmp_path, "--backend", "reference", "--expectations", str(tmp_path / "a.txt"), "--update-expectations", str(tmp_path / "b.txt"))
    assert run.returncode == 4 and "exists and is not the --kvc-expectations file" in run.proc.stderr
    assert run.document is None and (tmp_path / "b.txt").read_text().startswith("bug [ ]")


# ----------------------------------------------------------------------------- options, before any test runs
BAD_OPTIONS = [  # (RunOptions fields, or "xmlpath" for --junitxml; what the usage error says)
    (dict(json_path="{file}/results.json"), "--kvc-json {file}/results.json: cannot write there"),
    (dict(html_path="{file}/report.html"), "--kvc-html {file}/report.html: cannot write there"),
    (dict(update_expectations="{file}/exp.txt"), "--kvc-update-expectations {file}/exp.txt: cannot write there"),
    (dict(export_digests="{file}/d.json"), "--kvc-export-digests {file}/d.json: cannot write there"),
    (dict(xmlpath="{file}/junit.xml"), "--junitxml {file}/junit.xml: cannot write there"),
    (dict(json_path="{dir}"), "is a directory, expected a file path"),
    (dict(device="foo"), "--kvc-device 'foo': not a device name"),
    (dict(device="meta"), "--kvc-device meta: a meta tensor holds no bytes"),
    (dict(seed=-1), "--kvc-seed -1: expected an integer from 0 to 4294967295"),
    (dict(seed=2**64), "expected an integer from 0 to 4294967295"),
    (dict(backends=("pkg.module:",)), "malformed backend spec(s) 'pkg.module:'"),
    (dict(backends=("vllm:",)), "malformed backend spec(s) 'vllm:'"),
    (dict(timeout=0.0), "--kvc-timeout 0.0: expected a positive number"),
]


def usage_error(tmp_path, fields: dict) -> str:
    """What the suite says at start-up for these options (the checks its plugin runs before collection)."""
    from kvconform.conformance.plugin import options
    from kvconform.conformance.plugin.outputs import check_outputs
    from kvconform.conformance.plugin.run_plan import outputs_and_inputs

    blocker = tmp_path / "a-file"  # a path under a regular file cannot be created, even by root
    blocker.write_text("")
    fields = {k: v.format(file=blocker, dir=tmp_path) if isinstance(v, str) else v for k, v in fields.items()}
    xmlpath = fields.pop("xmlpath", None)
    defaults = dict(backends=("reference",), device="cpu", seed=0, profile="quick", standard="e1", json_path=str(tmp_path / "r.json"),
                    html_path=None, huge=False, timeout=None, export_digests=None, compare_digests=None, expectations=None,
                    update_expectations=None)
    opts = options.RunOptions(**{**defaults, **fields})
    try:
        options.validate(opts)
        options.check_device(opts.device)
        check_outputs(*outputs_and_inputs(opts, xmlpath))
    except InputError as exc:
        return str(exc)
    return ""


@pytest.mark.parametrize("fields, complaint", BAD_OPTIONS, ids=lambda v: ",".join(f"{k}={v}" for k, v in v.items()) if isinstance(v, dict) else None)
def test_a_bad_option_is_refused_naming_it(tmp_path, fields, complaint):
    blocker = tmp_path / "a-file"
    assert complaint.format(file=blocker, dir=tmp_path) in usage_error(tmp_path, fields)


@pytest.mark.parametrize("args, complaint", [
    (("--kvc-json", "{file}/results.json"), "--kvc-json {file}/results.json: cannot write there"),
    (("--kvc-device", "cuda"), "--kvc-device cuda: not available on this machine"),
    (("--kvc-backend", "evil[/]:x"), "malformed backend spec(s) 'evil[/]:x'"),
])
def test_a_bad_option_is_a_usage_error_before_any_test_runs(tmp_path, args, complaint):
    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    args = tuple(a.format(file=blocker) for a in args)
    run = run_suite(tmp_path / "out", "--kvc-backend", "reference", *args, *PADDING)
    assert run.returncode == 4, run.output
    assert complaint.format(file=blocker) in run.proc.stderr
    assert run.document is None and "passed" not in run.proc.stdout and "INTERNALERROR" not in run.output


def test_a_second_run_on_the_same_results_file_is_refused_while_the_first_runs(tmp_path):
    out = tmp_path / "results.json"
    (tmp_path / "results.json.lock").write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started_unix": 0}))
    run = run_suite(tmp_path, "--backend", "reference", *PADDING)
    assert run.returncode == 4 and f"another kvconform run is writing it (pid {os.getpid()}" in run.proc.stderr
    assert not out.exists()


def test_a_lock_left_by_a_dead_run_is_taken_over_and_reported(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "results.json.lock").write_text(json.dumps({"pid": int(dead), "host": socket.gethostname(), "started_unix": 0}))
    run = run_suite(tmp_path, "--backend", "reference", *PADDING)
    assert run.returncode == 0 and f"an earlier run (pid {dead})" in run.proc.stdout
    assert not (tmp_path / "results.json.lock").exists()


# ----------------------------------------------------------------------------- digest files
def reference_entries(case_name="bf16-N16-H2-D64"):
    case = next(c for c in equivalence.CASES if c.name == case_name)
    layout = equivalence.R.blocks_first("NHD")
    g = case.geometry(case.model_dtype)
    storage = torch.zeros(layout.nbytes(g), dtype=torch.uint8)
    key, value, slots = equivalence.inputs(case)
    k_scale, v_scale = equivalence.scales(None)
    equivalence.R.reshape_and_cache(key, value, storage, layout, g, slots, k_scale=k_scale, v_scale=v_scale)
    return [{"backend": "reference", "platform": "cpu", "arch": "", **equivalence.digest_record(storage, layout, case, g, None)}]


def digest_file(tmp_path, entries):
    path = tmp_path / "digests.json"
    path.write_text(json.dumps({**digests.header(), "entries": entries}))
    return str(path)


def test_compare_digests_reads_the_canonical_digest_of_a_same_format_entry():
    ours = reference_entries()[0]
    tampered = dict(ours, canonical="0" * 64)
    assert compare_entries(ours, ours) is None
    assert compare_entries(ours, tampered).startswith("canonical digest 0000000000000000… there")


@pytest.mark.parametrize("field, value, complaint", [
    ("page", "not-a-digest", "page must be a SHA-256 hex digest"),
    ("case", "made-up", "is not a golden case"),
    ("k_scale", -1, "k_scale must be a positive number"),
    ("fp8_format", "float8_e9m9", "fp8_format must be null or one of"),
    ("canonical_b64", "AAAA", "does not hash to canonical"),
])
def test_a_digest_file_with_a_malformed_entry_is_refused(tmp_path, field, value, complaint):
    entries = reference_entries()
    entries.append(dict(entries[0], **{field: value}))
    with pytest.raises(digests.DigestFileError, match=f"entry 1 .*{complaint}"):
        digests.load(digest_file(tmp_path, entries))


def test_a_digest_file_without_entries_is_refused(tmp_path):
    with pytest.raises(digests.DigestFileError, match="no entries"):
        digests.load(digest_file(tmp_path, []))


def test_compare_digests_that_compared_nothing_fails_the_run(tmp_path):
    exported = digest_file(tmp_path, reference_entries())  # E1:NHD only; reference_e3 writes E3 layouts
    run = run_suite(tmp_path / "run", "-m", "equivalence", "--backend", "reference_e3", "--standard", "e3", "--compare-digests", exported)
    compared = [r for r in run.records if r["check"] == "test_digests_equal_the_exported_run"]
    assert compared and all(r["outcome"] == "not-applicable" for r in compared)
    assert run.returncode == 1, run.output
    assert any(r["kind"] == "nothing-compared" for r in run.document["completion"]["reasons"])


# ----------------------------------------------------------------------------- names are data
HOSTILE_NAMES = ["evil[/]:x", "[bold red]not markup[/]", "<script>alert(1)</script>", "a&b \"quoted\" 'x'", "[link=http://x]y[/link]"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_backend_names_print_as_themselves_in_every_renderer(name):
    doc = document(record(backend=name, outcome="failed", message=f"{name} failed"))
    assert name in render([doc], color=False, width=200)
    assert name in render([doc], color=True, width=200)
    html = render_runs([doc])
    assert "<script>alert" not in html
    pytest_xml = ET.Element("testsuites")
    case = ET.SubElement(ET.SubElement(pytest_xml, "testsuite", name="pytest"), "testcase", classname="c", name="n")
    ET.SubElement(ET.SubElement(case, "properties"), "property", name="test_id", value=doc["tests"][0]["nodeid"])
    ET.SubElement(case, "failure", message="m")
    annotated = ET.fromstring(junit.annotate(ET.tostring(pytest_xml, encoding="unicode"), doc))
    assert annotated.find(".//property[@name='backend']").get("value") == name


# ----------------------------------------------------------------------------- hostile content (#26 items 10-12)
BREAKOUT = '"><script>alert(1)</script><x a="'


def test_the_byte_map_svg_escapes_every_field():
    byte_map = {"layer": BREAKOUT, "block": "<script>alert(2)</script>", "cells": [
        {"offset": BREAKOUT, "row": [0, "<b>", 0], "ok": False, "actual": [1, 0, "<i>"], "actual_block": [BREAKOUT, 1]},
        {"offset": 1, "row": ["x", 0, 0], "ok": "yes", "actual": None},  # wrong types draw as "no logical row"
    ]}
    svg = str(svg_builder.byte_map_svg(byte_map))
    root = ET.fromstring(svg)  # well-formed: no attribute breakout
    assert root.find(".//{http://www.w3.org/2000/svg}script") is None and "<script>" not in svg
    assert f"byte map of layer {BREAKOUT} block" in root.get("aria-label")  # the field, shown as itself
    doc = document(record(outcome="failed", failure={"property": "write", "byte_map": byte_map}))
    html = render_runs([doc])
    assert "<script>" not in html and "alert(1)</script><x" not in html


def test_junit_holds_every_character_xml_forbids_escaped():
    esc = "backend raised \x1b[31mred\x1b[0m \x00 \ufffe \ud800"
    doc = document(record(backend="b\x1b", outcome="failed", message=esc), complete=False)
    doc["completion"]["reasons"][0]["what"] = "stopped \x1b[2J"
    pytest_xml = ET.Element("testsuites")
    case = ET.SubElement(ET.SubElement(pytest_xml, "testsuite", name="pytest"), "testcase", classname="c", name="n")
    test_id = doc["tests"][0]["nodeid"].replace("\x1b", "#x1B")  # as pytest's writer escaped it
    ET.SubElement(ET.SubElement(case, "properties"), "property", name="test_id", value=test_id)
    ET.SubElement(case, "failure", message="m")
    annotated = junit.annotate(ET.tostring(pytest_xml, encoding="unicode"), doc)
    root = ET.fromstring(annotated.encode("utf-8"))  # well-formed XML 1.0
    assert root.find(".//property[@name='message']").get("value") == "backend raised #x1B[31mred#x1B[0m #x00 #xFFFE #xD800"
    assert root.find(".//property[@name='backend']").get("value") == "b#x1B"
    assert "#x1B[2J" in root.find(".//testcase[@name='completion']/error").text


def test_the_terminal_never_receives_a_control_sequence_from_a_results_file():
    doc = document(record(backend="evil\x1b]0;pwned\x07\x1b[2J", check="test_\x1b[8mhidden", outcome="failed"), complete=False)
    doc["completion"]["reasons"][0]["what"] = "SIGINT \x1b[1A\x1b[2K\u202egnissap"
    for color in (False, True):
        text = render([doc], color=color, width=200)
        assert "\x1b]" not in text and "\x1b[2J" not in text and "\x1b[8m" not in text and "\x1b[1A" not in text and "\u202e" not in text
        assert "evil\\x1b]0;pwned\\x07\\x1b[2J" in text and "\\u202egnissap" in text
    assert printable("a\tb\nc\x1b[0m\x9b") == "a\tb\nc\\x1b[0m\\x9b"


def test_an_expectations_entry_with_a_control_character_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "exp.txt"
    path.write_text("# ok\nbug [ ] conformance/test_write.py::*\x1b[2J* [ Fail ]\n")
    with pytest.raises(expectations.ExpectationsError, match=f"{path}:2: control character '\\\\x1b'"):
        expectations.parse(str(path))


def test_two_backends_whose_names_fold_alike_get_distinct_anchors():
    doc = document(*(record(backend=name, outcome="failed") for name in ("acme.v2", "acme-v2", "acme v2", "acme_v2", "acmé-v2")))
    cells = matrix.build([doc]).cells.values()
    assert len({cell.anchor for cell in cells}) == len(cells) == 5
    html = render_runs([doc])
    ids = re.findall(r'id="([^"]+)"', html)
    assert len(ids) == len(set(ids))
    for cell in cells:  # each link opens its own backend's details
        assert html.count(f'id="{cell.anchor}"') == 1 and f'href="#{cell.anchor}"' in html


# ----------------------------------------------------------------------------- merging and labels
def test_merge_refuses_two_runs_of_the_same_column(tmp_path, capsys):
    path = tmp_path / "run.json"
    path.write_text(json.dumps(document(record())))
    assert cli.main(["merge", str(path), str(path), "-o", str(tmp_path / "m.html")]) == 2
    assert "both hold column reference@cpu" in capsys.readouterr().err
    assert not (tmp_path / "m.html").exists()


def test_a_model_of_a_platform_is_labelled_as_a_model_not_as_that_platform():
    model = record(backend="reference_gfx942", run_platform="cpu", platform="rocm", arch="gfx942")
    real = record(backend="reference_gfx942", run_platform="rocm-gfx942", platform="rocm", arch="gfx942")
    assert matrix.column_of(model) == "reference_gfx942@cpu (models rocm-gfx942)"
    assert matrix.column_of(real) == "reference_gfx942@rocm-gfx942"
    cli.check_distinct_columns([document(model), document(real)], ["cpu.json", "mi300.json"])  # two columns: no refusal


# ----------------------------------------------------------------------------- kill rate and repro
def test_kill_rate_counts_only_the_families_that_ran():
    facts = {"mutant:m": {"mutant": {"catches": ["write", "swap"], "doc": "d"}}}
    doc = document(record(backend="mutant:m", family="write", outcome="failed"), backends=facts)  # run with -m write
    mutants, families = kill_rates([doc])
    assert families == {"write": (1, 1)}
    assert mutants[0]["not_run"] == ["swap"] and mutants[0]["killed"] == ["write"]
    assert "SURVIVED" not in render([doc], color=False, width=100)


def test_the_repro_line_reruns_the_failure_with_the_runs_profile_seed_standard_and_device(tmp_path):
    args = ("--backend", "mutant:write_padding_slots", "--profile", "full", "--seed", "5", "-m", "write", "-k", "padding_slots and HND")
    first = run_suite(tmp_path / "a", *args)
    failed = [r for r in first.records if r["outcome"] == "failed"]
    assert failed, first.output
    repro = failed[0]["repro"]
    for option in ("--kvc-profile full", "--kvc-seed 5", "--kvc-standard e1", "--kvc-device cpu"):
        assert option in repro
    argv = shlex.split(repro)
    assert argv[:2] == ["pytest", "--pyargs"]
    again = run_suite(tmp_path / "b", *argv[3:], target=argv[2])
    same = [r for r in again.records if r["nodeid"] == failed[0]["nodeid"]]
    assert same and same[0]["outcome"] == "failed" and same[0]["message"] == failed[0]["message"]


def test_terminal_report_of_a_partial_run_is_never_all_green():
    doc = document(record(), complete=False)
    text = render([doc], color=False, width=80)
    assert text.startswith("kvconform verdict: PARTIAL RUN — interrupted: SIGINT;")
    assert "PARTIAL RUN (interrupted: SIGINT)" in " ".join(text.split("\n")[:5])
    legacy = copy.deepcopy(doc)
    del legacy["completion"]  # a file that does not say is not taken as complete
    assert "PARTIAL RUN (unknown" in render([legacy], color=False, width=80)
