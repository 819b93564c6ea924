"""JUnit XML a CI dashboard reads honestly: pytest's ``--junitxml`` file, annotated from the
results document at the end of a suite run (docs/RESULTS_SCHEMA.md, "JUnit").

pytest writes not-applicable checks and known failures alike as ``<skipped>``, an unexpected
pass as a plain pass, and every property with ``str()`` (a Python repr). For each kvconform
test case this rewrites:

- ``classname`` to ``kvconform.<family>`` (dashboards group by it);
- the result element to the record's (``<failure>`` for a failed record even where another plugin
  made pytest's report a pass, e.g. a rerun: the counts follow the verdict);
- the result element's ``type`` to ``kvconform.<outcome>`` and its ``message`` to the verdict
  in words (``not applicable (declaration): …``, ``known failure: …``);
- an unexpected pass keeps passing (the run does not fail on it) and says so in ``system-out``;
- ``<properties>``: ``kvc_outcome`` and every record field, structured ones (``failure``,
  ``not_applicable``) as JSON;
- one test case per record: the cases of a rerun's earlier attempts (pytest-rerunfailures) are
  dropped and the kept one says ``kvc_attempts`` (a failure counted once, as the verdict counts it).

The test suite gets a ``kvc_verdict`` property (the run's verdict in the words of the terminal
and HTML banner: ``NO NEW FAILURES — 9 known failures (baseline FILE); …``), a
``kvc_completion`` property (JSON) and one test case
``kvconform.run / completion`` that passes only when the run completed: an interrupted or
crashed run makes it an ``<error>``, a filtered one a ``<skipped>`` — a partial run is never
all green on a dashboard.

Every attribute and text is XML 1.0 that any parser reads: a character XML forbids (ESC from a
backend's exception, NUL, a lone surrogate) is written as pytest writes it, ``#x1B``
(:func:`xml_safe_text`); pytest's test ids so escaped still find their records.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

from . import results
from .coverage import build as build_coverage

PROPERTIES = ("test_id", "backend", "family", "check", "platform", "arch", "run_platform", "layout", "geometry",
              "kv_cache_dtype", "model_dtype", "seed", "repro", "message", "not_applicable", "failure", "raised")
RESULT_TAGS = ("failure", "error", "skipped")
CARRIED = "kvconform"  # the record the plugin carries across xdist in each report: not a property of the JUnit file
FILTER_ONLY = {"filtered", "no-tests", "skipped"}  # a partial run by choice: the completion case is <skipped>, not <error>
RESULT_OF = {"failed": "failure", "error": "error", "crashed": "error", "timeout": "error",  # as pytest's writer tags them
             "not-applicable": "skipped", "expected-failure": "skipped", "skipped": "skipped"}
# Characters XML 1.0 cannot hold, not even as references (the W3C Char production), and DEL:
# the set pytest's own JUnit writer escapes, the way it escapes them (``#x1B``).
_NOT_XML = re.compile("[^\t\n\r\x20-\x7e\x80-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe_text(value: str) -> str:
    """``value`` with each character XML 1.0 forbids written visibly, as pytest writes them
    (ESC as ``#x1B``): a JUnit file any parser reads."""
    return _NOT_XML.sub(lambda m: f"#x{ord(m.group()):02X}" if ord(m.group()) <= 0xFF else f"#x{ord(m.group()):04X}", value)


def _xml_safe(root: ET.Element) -> None:
    """Every text, tail and attribute of the tree made XML 1.0 (see :func:`xml_safe_text`)."""
    for element in root.iter():
        if element.text:
            element.text = xml_safe_text(element.text)
        if element.tail:
            element.tail = xml_safe_text(element.tail)
        for name, value in element.attrib.items():
            element.set(name, xml_safe_text(value))


def _verdict_words(record: dict) -> str:
    outcome, message = record["outcome"], record.get("message") or ""
    if outcome == "not-applicable":
        reason = record.get("not_applicable") or {}
        return f"not applicable ({reason.get('kind', '?')}): {message}"
    if outcome == "expected-failure":
        return f"known failure (expectations): {message}"
    if outcome == "skipped":
        return f"skipped by expectations: {message}"
    if outcome == "unexpected-pass":
        return f"UNEXPECTED PASS: listed as a known failure ({message}) but passed; remove it from the expectations"
    return f"{outcome}: {message.splitlines()[0] if message else ''}"


def _properties(record: dict) -> ET.Element:
    properties = ET.Element("properties")
    ET.SubElement(properties, "property", name="kvc_outcome", value=record["outcome"])
    for name in PROPERTIES:
        value = record.get("nodeid") if name == "test_id" else record.get(name)
        if value is None:
            continue
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        ET.SubElement(properties, "property", name=name, value=text)
    return properties


def _annotate_case(case: ET.Element, record: dict) -> None:
    case.set("classname", f"kvconform.{record.get('family') or 'other'}")
    properties = _properties(record)
    for old in case.findall("properties"):  # pytest's str() copies of ours give way; others' properties stay
        properties.extend(p for p in old.findall("property") if p.get("name") not in (*PROPERTIES, CARRIED))
        case.remove(old)
    case.insert(0, properties)
    words = _verdict_words(record)
    result = next((child for child in case if child.tag in RESULT_TAGS), None)
    wanted = RESULT_OF.get(record["outcome"])
    if (result.tag if result is not None else None) != wanted:  # the record decides, whatever a plugin made of pytest's report
        if result is not None:
            case.remove(result)
        result = ET.SubElement(case, wanted) if wanted else None
        if result is not None:
            result.text = record.get("message") or ""
    if result is not None:
        result.set("type", f"kvconform.{record['outcome']}")
        result.set("message", words)
    if record["outcome"] == "unexpected-pass":
        out = case.find("system-out")
        if out is None:
            out = ET.SubElement(case, "system-out")
        out.text = f"kvconform: {words}\n" + (out.text or "")


def _completion_case(document: dict) -> ET.Element:
    case = ET.Element("testcase", classname="kvconform.run", name="completion", time="0")
    properties = ET.SubElement(case, "properties")
    ET.SubElement(properties, "property", name="kvc_completion", value=json.dumps(results.of(document), sort_keys=True))
    headline = results.headline(document)
    if headline:
        kinds = {r["kind"] for r in results.of(document).get("reasons", [])}
        tag = "skipped" if kinds <= FILTER_ONLY else "error"
        ET.SubElement(case, tag, type="kvconform.partial-run", message=headline).text = results.reasons_text(document)
    return case


def annotate(xml_text: str, document: dict) -> str:
    """pytest's JUnit XML with each kvconform test case's verdict made explicit (see above)."""
    root = ET.fromstring(xml_text)
    records = {r["nodeid"]: r for r in document["tests"]}
    records.update({xml_safe_text(nodeid): r for nodeid, r in records.items()})  # as pytest wrote a test id with ESC in it
    word, why = results.verdict([document], holes=len(build_coverage([document]).holes))
    for suite in root.iter("testsuite"):
        attempts: dict = {}  # test id -> its cases: a rerun plugin makes one per attempt, the record is the last's
        for case in suite.findall("testcase"):
            test_id = next((p.get("value") for p in case.iter("property") if p.get("name") == "test_id"), None)
            if test_id in records:
                attempts.setdefault(test_id, []).append(case)
        for test_id, cases in attempts.items():
            for earlier in cases[:-1]:
                suite.remove(earlier)
            _annotate_case(cases[-1], records[test_id])
            if len(cases) > 1:
                ET.SubElement(cases[-1].find("properties"), "property", name="kvc_attempts", value=str(len(cases)))
        properties = suite.find("properties")
        if properties is None:
            properties = ET.Element("properties")
            suite.insert(0, properties)
        ET.SubElement(properties, "property", name="kvc_verdict", value=f"{word} — {why}")
        ET.SubElement(properties, "property", name="kvc_completion", value=json.dumps(results.of(document), sort_keys=True))
        suite.append(_completion_case(document))
        cases = suite.findall("testcase")
        suite.set("tests", str(len(cases)))
        for tag, attribute in (("failure", "failures"), ("error", "errors"), ("skipped", "skipped")):
            suite.set(attribute, str(sum(1 for c in cases if c.find(tag) is not None)))
    _xml_safe(root)
    return '<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root, encoding="unicode")


def from_document(document: dict) -> str:
    """A JUnit file for a run whose pytest never wrote one (``--kvc-timeout`` without xdist: the
    watchdog ends the only process): one test case per record, then annotated like pytest's."""
    root = ET.Element("testsuites")
    suite = ET.SubElement(root, "testsuite", name="pytest")
    for record in document["tests"]:
        nodeid = xml_safe_text(record["nodeid"])
        path, _, name = nodeid.partition("::")
        case = ET.SubElement(suite, "testcase", classname=path.removesuffix(".py").replace("/", "."), name=name,
                             time=str(record.get("duration_s") or 0))
        ET.SubElement(ET.SubElement(case, "properties"), "property", name="test_id", value=nodeid)
        tag = RESULT_OF.get(record["outcome"])
        if tag is not None:
            ET.SubElement(case, tag, message="").text = xml_safe_text(record.get("message") or "")
    return annotate(ET.tostring(root, encoding="unicode"), document)
