"""The block picture agrees with the diagnosis (#38 item 5): rows in the right place with the wrong
codes (a value fault: a scale, a format, a bit) are drawn as their own rows with wrong values, not
grey as "no logical row"; bytes that belong to no row stay grey."""

import re

from kvconform.conformance.harness.diagnosis import FAULTS
from kvconform.reports.html import render_runs
from kvconform.reports.svg import FOREIGN, VALUE_FAULTS, WRONG_VALUES, byte_map_svg

# Block 2 of layer 0: K slot 0 and V slot 0 and 1 differ, none holding another row's bytes.
BYTE_MAP = {"layer": 0, "block": 2, "layout": "NHD E1[B,2,N,H,D]", "geometry": "g", "row_elements": 8, "cells": [
    {"offset": 0, "row": [0, 0, 0], "ok": False, "actual": None},
    {"offset": 8, "row": [1, 0, 0], "ok": False, "actual": None},
    {"offset": 16, "row": [1, 1, 0], "ok": False, "actual": None},
    {"offset": 24, "row": [1, 2, 0], "ok": True, "actual": None},
]}
# The diagnosis: V's rows 0..1 of block 2 quantised with k_scale; K slot 0's bytes are stray.
DIAGNOSIS = [{"fault": "scale-swapped", "elements": 16, "where": {"layer": [0, 0], "block": [2, 2], "kv": "V", "slot": [0, 1], "head": [0, 0],
                                                               "dim": [0, 7], "elements": 16, "text": "V[b=2, s=0..1, h=0]"}, "sentence": "…"},
             {"fault": "stray-write", "elements": 8, "where": {"layer": [0, 0], "block": [2, 2], "kv": "K", "slot": [0, 0], "head": [0, 0],
                                                             "dim": [0, 7], "elements": 8, "text": "K[b=2, s=0, h=0]"}, "sentence": "…"}]


def actual_fills(svg: str) -> list[str]:
    """The fill of each cell of the actual strip (the second of each cell's two rects)."""
    return re.findall(r'<rect x="\d+" y="\d+" width="14" height="14" fill="(#\w+)"', svg)[1::2]


def test_the_value_fault_classes_are_the_diagnosis_own():
    assert VALUE_FAULTS <= set(FAULTS)


def test_rows_with_wrong_codes_in_their_place_are_drawn_as_themselves():
    svg = str(byte_map_svg(BYTE_MAP, DIAGNOSIS))
    assert actual_fills(svg)[:3] == [FOREIGN, WRONG_VALUES, WRONG_VALUES]  # the stray K bytes stay grey
    assert "actual V slot 1 head 0 with wrong values (scale-swapped)" in svg and "its own row, wrong values" in svg


def test_without_a_diagnosis_such_rows_are_what_the_bytes_alone_say():
    assert actual_fills(str(byte_map_svg(BYTE_MAP)))[:3] == [FOREIGN] * 3


def test_the_html_report_draws_a_value_faults_picture_from_its_diagnosis():
    record = {"nodeid": "conformance/test_write.py::test_w[acme-E1:NHD]", "backend": "acme", "platform": "cpu", "arch": "", "family": "write",
              "check": "test_w", "outcome": "failed", "message": "write: 16 elements differ", "repro": "pytest …",
              "failure": {"property": "write", "differing_elements": 16, "mismatches": [], "byte_map": BYTE_MAP, "diagnosis": DIAGNOSIS}}
    html = render_runs([{"schema": "kvconform-results/1", "environment": {"device": "cpu", "device_name": "cpu", "backends": {}},
                         "completion": {"complete": True, "reasons": []}, "tests": [record]}])
    assert "actual V slot 0 head 0 with wrong values (scale-swapped)" in html
