"""Every input file format, malformed — wrong encoding, wrong types, truncated, huge — gives an
:class:`InputError` naming the file, never a traceback (issue #26, "Bounded work on bad input";
docs/RELIABILITY.md). Expectations, digest, results and layout descriptor files here; submission
bundles in tests/test_certify.py (they need a certified run).

Hypothesis runs each with a fixed budget (BUDGET: derandomized, so CI sees the same examples).
To extend: a new format is one ``load`` function and one valid sample below.
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvconform.conformance.harness import digests
from kvconform.errors import InputError
from kvconform.reports import cli, expectations, junit, results
from kvconform.reports.html import render_runs
from kvconform.reports.terminal import render

BUDGET = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

EXPECTATIONS = (
    "# ACME\n"
    "https://bugs.acme/1 [ rocm gfx942 ] conformance/test_write.py::* [ Fail ]\n"
    "bug-2 [ ] conformance/test_swap.py::test_swap_out[reference-E1:NHD] [ Crash ]\n"
    "bug-3 [ cpu ] conformance/test_read.py::*[*-E1:?HD] [ Skip ]\n"
)


def record(**extra):
    return {"nodeid": "conformance/test_write.py::test_x[reference-E1:NHD]", "backend": "reference", "platform": "cpu", "arch": "",
            "run_platform": "cpu", "family": "write", "check": "test_x", "outcome": "failed", "message": "m", "seed": 0,
            "layout": "NHD E1[B,2,N,H,D]", "geometry": "L1-B6-N16-H2-D64-bfloat16", "kv_cache_dtype": "auto",
            "exercised": [{"kv_cache_dtype": "auto", "dtype": "bfloat16", "model_dtype": "bfloat16", "layout": "NHD E1[B,2,N,H,D]",
                           "geometry": "L1-B6-N16-H2-D64-bfloat16", "sizes": ["h=2"], "values": []}],
            "failure": {"property": "write", "differing_elements": 1, "mismatches": [{"where": "layer=0", "expected": "00", "actual": "01"}],
                        "byte_map": {"layer": 0, "block": 1, "cells": [{"offset": 0, "row": [0, 0, 0], "ok": False, "actual": [1, 0, 0]}]}},
            "not_applicable": None, **extra}


RESULTS = {"schema": results.SCHEMA, "environment": {"device": "cpu", "device_name": "cpu", "backends": {"reference": {"platform": "cpu"}}},
           "completion": {"complete": False, "reasons": [{"kind": "interrupted", "what": "SIGINT"}], "selected": 2, "recorded": 2},
           "stale_expectations": [{"file": "e.txt", "line": 1, "pattern": "p", "reason": "r"}],
           "tests": [record(), record(nodeid="conformance/test_read.py::test_y[reference]", check="test_y", family="read", outcome="passed",
                                      failure=None)]}


@functools.cache
def digest_file_text() -> str:
    from .test_hostile_inputs import reference_entries

    return json.dumps({**digests.header(), "entries": reference_entries()})


# ----------------------------------------------------------------------------- malformed bytes
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
                           max_leaves=12)


def malformed(valid: str):
    """Bytes of a file that was ``valid``: truncated, a byte changed, re-encoded, or anything."""
    data = valid.encode("utf-8")
    return st.one_of(
        st.integers(0, len(data)).map(lambda n: data[:n]),  # truncated
        st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)).map(lambda p: data[:p[0]] + bytes([p[1]]) + data[p[0] + 1:]),
        st.sampled_from(["utf-16", "latin-1", "utf-32"]).map(lambda enc: valid.replace("a", "ä").encode(enc)),  # wrong encoding
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),  # JSON of the wrong shape
    )


def refused_naming_it_or_read(load, data: bytes, suffix: str):
    """``load`` a file holding ``data``: an InputError naming the file, or a value; nothing else."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / f"input{suffix}")
        Path(path).write_bytes(data)
        try:
            return load(path)
        except InputError as exc:
            assert path in str(exc), f"the error does not name the file: {exc}"
            return None


@BUDGET
@given(malformed(EXPECTATIONS))
def test_a_malformed_expectations_file_is_refused_naming_it(data):
    entries = refused_naming_it_or_read(expectations.parse, data, ".txt")
    if entries is not None:  # what parses can be matched and updated
        expectations.first_match(entries, "conformance/test_write.py::test_x[reference]", {"cpu", "reference"})
        expectations.update(data.decode("utf-8"), entries, [record()], entries)


@BUDGET
@given(st.data())
def test_a_malformed_digest_file_is_refused_naming_it(data):
    refused_naming_it_or_read(digests.load, data.draw(malformed(digest_file_text())), ".json")


DIGEST_FIELDS = ["backend", "platform", "arch", "case", "layout", "layout_shape", "era", "dtype", "kv_cache_dtype", "fp8_format",
                 "geometry", "k_scale", "v_scale", "page", "canonical", "canonical_b64"]


@BUDGET
@given(st.sampled_from(DIGEST_FIELDS), json_values)
def test_a_digest_entry_with_a_field_of_the_wrong_type_is_refused_naming_the_file(field, value):
    document = json.loads(digest_file_text())
    document["entries"][0][field] = value
    refused_naming_it_or_read(digests.load, json.dumps(document).encode(), ".json")


def test_a_digest_entry_whose_case_is_a_list_is_refused_naming_the_file(tmp_path):
    """``"case": []`` was a TypeError (unhashable), an INTERNALERROR under --kvc-compare-digests."""
    document = json.loads(digest_file_text())
    document["entries"][0]["case"] = []
    path = tmp_path / "digests.json"
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match=rf"{path}: entry 0 .*case \[\] is not a golden case"):
        digests.load(str(path))


def render_everywhere(document: dict) -> None:
    """What a results file is read by: the terminal matrix, the HTML report, the JUnit annotation."""
    render([document], color=True, width=100)
    render_runs([document])
    suite = ET.Element("testsuite", name="pytest")
    ET.SubElement(ET.SubElement(ET.SubElement(suite, "testcase", classname="c", name="n"), "properties"), "property",
                  name="test_id", value=record()["nodeid"])
    ET.fromstring(junit.annotate(ET.tostring(suite, encoding="unicode"), document))


@BUDGET
@given(malformed(json.dumps(RESULTS)))
def test_a_malformed_results_file_is_refused_naming_it(data):
    document = refused_naming_it_or_read(cli.load, data, ".json")
    if document is not None:
        render_everywhere(document)


def replace_field(document: dict, where: list, value):
    changed = json.loads(json.dumps(document))
    target = changed
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    return changed


FIELDS = [["environment"], ["environment", "backends"], ["completion"], ["completion", "reasons"], ["stale_expectations"], ["tests"],
          *(["tests", 0, field] for field in record() if field != "nodeid"), ["tests", 0, "nodeid"], ["tests", 0],
          ["tests", 0, "exercised", 0], ["tests", 0, "failure", "byte_map"], ["tests", 0, "failure", "mismatches"],
          ["tests", 0, "interop"], ["tests", 0, "digest"], ["environment", "backends", "reference"],
          ["environment", "backends", "reference", "declared"], ["completion", "exit_status"], ["completion", "backends_left_out"],
          *(["tests", 0, "failure", field] for field in ("property", "differing_elements", "diagnosis"))]


@BUDGET
@given(st.sampled_from(FIELDS), json_values)
def test_a_results_file_with_a_field_of_the_wrong_type_is_refused_or_rendered(where, value):
    data = json.dumps(replace_field(RESULTS, where, value)).encode()
    document = refused_naming_it_or_read(cli.load, data, ".json")
    if document is not None:
        render_everywhere(document)


@pytest.mark.parametrize("where, value", [(["tests", 0, "failure", "diagnosis"], True), (["completion", "exit_status"], []),
                                          (["completion", "backends_left_out"], 5)], ids=["diagnosis", "exit_status", "backends_left_out"])
def test_report_html_refuses_a_field_its_pages_cannot_read_naming_file_and_field(tmp_path, capsys, where, value):
    """Each was a traceback from ``kvconform report html`` (a Jinja loop over ``true``, a set of a list, ``.items()`` of 5)."""
    from kvconform.cli import main

    path = tmp_path / "results.json"
    path.write_text(json.dumps(replace_field(RESULTS, where, value)))
    assert main(["report", "html", str(path), "-o", str(tmp_path / "report.html")]) == 2
    assert f"{path}: {where[0]}" in capsys.readouterr().err and not (tmp_path / "report.html").exists()


@functools.cache
def descriptor_file_text() -> str:
    """Two TP ranks of an fp8 producer: a file ``kvconform compat`` reads."""
    import torch

    from kvconform import reference as R
    from kvconform.reference import compat

    g = R.Geometry(num_blocks=8, block_size=16, num_kv_heads=1, head_size=64, dtype=torch.float8_e4m3fn)
    return json.dumps([compat.describe(R.blocks_first("HND"), g, tp_rank=r, tp_size=2, total_kv_heads=2, k_scale=0.5, v_scale=0.5,
                                       kv_cache_dtype="fp8") for r in range(2)])


@BUDGET
@given(st.data())
def test_a_malformed_descriptor_file_is_refused_naming_it(data):
    from kvconform.reference import compat

    descriptors = refused_naming_it_or_read(lambda path: compat.load(path, role="producer"), data.draw(malformed(descriptor_file_text())), ".json")
    if descriptors is not None:  # what loads can be checked against itself
        for producer in descriptors:
            compat.check(producer, descriptors[0])


@pytest.mark.parametrize("path", ["/dev/zero", "fifo"])
def test_a_descriptor_path_that_is_not_a_regular_file_is_refused_unread(tmp_path, path):
    from kvconform.reference import compat

    from .test_hostile_outputs import finishes

    if path == "fifo":
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    with pytest.raises(compat.DescriptorError, match=f"{path}: not a regular file"):
        finishes(lambda: compat.load(path))


# ----------------------------------------------------------------------------- huge
@pytest.mark.parametrize("load, limit", [(expectations.parse, "SIZE_LIMIT"), (cli.load, "READ_LIMIT")], ids=["expectations", "results"])
def test_a_file_past_the_size_limit_is_refused_unread(tmp_path, monkeypatch, load, limit):
    monkeypatch.setattr(expectations if load is expectations.parse else results, limit, 1000)
    path = tmp_path / "big"
    path.write_text("# " + "x" * 5000 + "\n")
    with pytest.raises(InputError, match=f"{path}: larger than 1000 bytes"):
        load(str(path))


def test_a_13_mb_expectations_file_of_150k_entries_against_27_tests_is_matched_in_seconds(tmp_path):
    """Matching indexes exact ids and compiles each pattern once: before, this took ~30 min."""
    script = textwrap.dedent(f"""
        from kvconform.reports import expectations as E
        path = {str(tmp_path / 'exp.txt')!r}
        with open(path, "w") as fh:
            for i in range(150_000):
                pattern = f"conformance/test_write.py::test_check_{{i % 500}}[backend_{{i}}-" + ("E1:NHD]" if i % 3 else "*]")
                fh.write(f"https://bugs.example.org/{{i}} [ {{'cuda sm90' if i % 2 else ''}} ] {{pattern}} [ Fail ]\\n")
        records = [dict(nodeid=f"conformance/test_write.py::test_check_{{j}}[reference-E1:NHD]", backend="reference", platform="cpu",
                        arch="", outcome="failed" if j % 2 else "passed") for j in range(27)]
        entries = E.parse(path)
        for r in records:
            E.first_match(entries, r["nodeid"], E.record_tags(r))
        E.stale(entries, records)
        E.update(open(path).read(), entries, records, entries)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)  # ~4 s on a loaded 2-core machine


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.text("ab*?[.", max_size=8), st.text("ab[.", max_size=10))
def test_a_pattern_matches_exactly_what_its_regular_expression_would(pattern, text):
    """The backtracking-free glob agrees with ``*`` = ``.*``, ``?`` = ``.``, the rest literal."""
    import re

    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern) + r"\Z"
    assert expectations.Glob(pattern).matches(text) == (re.match(regex, text, re.DOTALL) is not None)
