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


CONFORMS, DOES_NOT_CONFORM, PARTIAL = "CONFORMS", "DOES NOT CONFORM", "PARTIAL RUN"


def verdict(documents: list[dict]) -> tuple[str, str]:
    """The run's verdict as a vendor's CI states it, and what decided it: ``(word, why)``.

    PARTIAL RUN when a run did not complete (its checks are not all in); otherwise DOES NOT
    CONFORM when any test failed, errored, crashed or timed out (a new failure: not in the
    expectations), else CONFORMS — known failures, unexpected passes and stale entries named."""
    from collections import Counter

    from .results import EXPECTED_FAILURE, FAILING, UNEXPECTED_PASS

    counts = Counter(r["outcome"] for d in documents for r in d["tests"])
    stale = sum(len(d.get("stale_expectations") or []) for d in documents)
    statuses = sorted({of(d).get("exit_status") for d in documents if of(d).get("exit_status") is not None})
    new = sum(counts[o] for o in FAILING)
    why = [f"{new} new failure{'s' if new != 1 else ''}", f"{counts[EXPECTED_FAILURE]} known", f"{counts[UNEXPECTED_PASS]} unexpected pass{'es' if counts[UNEXPECTED_PASS] != 1 else ''}",
           f"{stale} stale expectation{'s' if stale != 1 else ''}"]
    if statuses:
        why.append(f"exit status {', '.join(map(str, statuses))}")
    together = documents[0] if len(documents) == 1 else {"completion": merged(documents)}
    if not is_complete(together):
        word = PARTIAL
        why.insert(0, reasons_text(together))
    elif new or any(r["kind"] == "nothing-compared" for d in documents for r in of(d).get("reasons", [])):
        word = DOES_NOT_CONFORM
    else:
        word = CONFORMS
    return word, "; ".join(why)


def counts_text(records) -> str:
    """Every outcome that occurs, counted, in one order; the counts add up to the records."""
    from collections import Counter

    from .results import SEVERITY, WORDS

    counts = Counter(r["outcome"] for r in records)
    order = ("passed", *[o for o in SEVERITY if o != "passed"])
    return " · ".join(f"{counts[o]} {WORDS[o]}" for o in order if counts[o]) or "no results"
