"""Synthetic results documents for the dashboard's tests and benchmark: records made as the plugin
makes them (``TestRecord(...).as_json()``), documents that the loader's schema check accepts."""

from __future__ import annotations

import json
from pathlib import Path

from kvconform.reports.results import NOT_APPLICABLE, SCHEMA, TestRecord, document_text

FAILS = ("failed", "error", "crashed", "timeout", "expected-failure", "unexpected-pass")


def record(backend: str, check: str, params: str, outcome: str, *, family: str = "write", run_platform: str = "cpu",
           clauses: tuple[str, ...] = ("WRITE-PAD-1",), fault: str = "fp8-format") -> dict:
    nodeid = f"conformance/test_{family}.py::{check}[{backend}-{params}]"
    failure = None
    message = ""
    if outcome in FAILS and outcome != "unexpected-pass":
        sentence = f"K[b=1, s=3, h=0..1] holds e4m3 codes: {fault} ({check})"
        message = f"write: 4 elements differ\n{sentence}"
        failure = {"property": "write", "differing_elements": 4,
                   "mismatches": [{"where": "layer=0 block=1 kv=K slot=3 head=0 dim=0", "expected": "3c 00", "actual": "38 00"}],
                   "byte_map": None,
                   "diagnosis": [{"fault": fault, "elements": 4, "where": None, "source": None, "sentence": sentence}]}
    reason = {"kind": "declaration", "who": f"backend {backend}", "what": "does not declare op 'decode'"} if outcome == NOT_APPLICABLE else None
    return TestRecord(
        nodeid=nodeid, backend=backend, platform=run_platform.split("-")[0], arch=run_platform.partition("-")[2], family=family, check=check,
        repro=f"pytest --pyargs 'kvconform.{nodeid.replace('/', '.').replace('.py::', '::')}' --kvc-backend {backend} --kvc-seed 0",
        clauses=list(clauses), seed=0, run_platform=run_platform, outcome=outcome, message=message, failure=failure, not_applicable=reason,
        layout="NHD E1[B,2,N,H,D]", geometry="L1-B6-N16-H2-D64-bfloat16", kv_cache_dtype="auto", model_dtype="torch.bfloat16",
    ).as_json()


def document(records: list[dict], *, created: int, suite_version: str = "0.2.0", libraries: dict[str, dict] | None = None,
             run_platform: str = "cpu") -> dict:
    """A complete run of the records' backends; ``libraries``: backend -> version facts ({"vllm": "0.34.0"})."""
    backends = {r["backend"]: {"platform": r["platform"], "arch": r["arch"], "standards": ["e1"], "torch": "2.13.0+cpu",
                               **(libraries or {}).get(r["backend"], {})} for r in records}
    return {"schema": SCHEMA, "created_unix": created,
            "environment": {"suite_version": suite_version, "python": "3.11.7", "torch": "2.13.0+cpu", "hip": None, "cuda": None,
                            "triton": "3.9.0", "vllm": None, "device": "cpu", "device_name": "synthetic", "run_platform": run_platform,
                            "seed": 0, "profile": "quick", "standard": "e1", "backends": backends},
            "completion": {"complete": True, "reasons": [], "selected": len(records), "recorded": len(records), "exit_status": 0},
            "stale_expectations": [], "tests": records}


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(document_text(doc))
    return path


def read(path: Path) -> dict:
    return json.loads(path.read_text())
