"""Whether a run reached a verdict on everything it was asked for — the results document's
``completion`` object (docs/RESULTS_SCHEMA.md) — and the one wording every output uses for it.

A run is complete when every check it selected for its backends has a verdict and nothing
narrowed that selection: no ``-m``/``-k``/``--deselect``/test-id arguments, no interruption,
``-x``/``--maxfail`` stop, internal or collection error, and a requested ``--kvc-compare-digests``
that compared something. Which backends a run covers is its *scope*, not a filter: a vendor
run of ``--backend acme`` that ran every check for acme is complete for acme.
"""

from __future__ import annotations

UNKNOWN = {"complete": False, "reasons": [{"kind": "unknown", "what": "the results file does not say whether its run completed"}]}


def of(document: dict) -> dict:
    """The document's completion; a document that does not say is never taken as complete."""
    return document.get("completion") or UNKNOWN


def is_complete(document: dict) -> bool:
    return of(document).get("complete") is True


def reasons_text(document: dict) -> str:
    """``interrupted (…); filtered (…)`` — why the run is partial ('' when complete)."""
    return "; ".join(f"{r['kind']}: {r['what']}" for r in of(document).get("reasons", []))


def headline(document: dict) -> str | None:
    """The warning a partial run carries at the top of every output; None when complete."""
    if is_complete(document):
        return None
    c = of(document)
    counted = ""
    if c.get("selected") is not None:
        counted = f" — {c.get('recorded', 0)} of {c['selected']} selected tests have a verdict"
    return f"PARTIAL RUN ({reasons_text(document)}){counted}; the checks it did not run are not in this report"


def merged(documents: list[dict]) -> dict:
    """Completion of several runs shown together: complete only when every run is."""
    reasons = []
    for number, document in enumerate(documents, start=1):
        reasons += [{**reason, "what": f"run {number}: {reason['what']}"} for reason in of(document).get("reasons", [])]
    return {"complete": all(is_complete(d) for d in documents), "reasons": reasons}
