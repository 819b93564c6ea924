"""Mutation kill rate: how many seeded faults each check family catches (issue: self-test).

A mutant is *killed* by a family when at least one of that family's checks fails or errors on
it. Which families a mutant is aimed at comes from the run's environment (the recorder writes
each mutant's ``catches`` and description there), so this needs nothing but the results JSON.
Only families that ran on the mutant count: a family deselected (``-m write``) or not
applicable to it is *not run*, never a survival.
"""

from __future__ import annotations

from collections import defaultdict

from .results import FAILING, NOT_RUN, backend_facts


def mutant_facts(documents: list[dict]) -> dict[str, dict]:
    """Backend name → its ``mutant`` facts, for every backend of these runs that is a mutant."""
    return {name: info["mutant"] for name, info in backend_facts(documents) if info.get("mutant")}


def kill_rates(documents: list[dict]) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Per mutant (name, aimed, ran, killed and not-run families) and per family (killed, aimed
    at it among the mutants it ran on)."""
    facts = mutant_facts(documents)
    failing, ran = defaultdict(set), defaultdict(set)
    present = set()
    for document in documents:
        for record in document["tests"]:
            if record["backend"] in facts:
                present.add(record["backend"])
                if record["outcome"] not in NOT_RUN:
                    ran[record["backend"]].add(record["family"])
                if record["outcome"] in FAILING:
                    failing[record["backend"]].add(record["family"])
    rows: list[dict] = []
    families: defaultdict[str, list[int]] = defaultdict(lambda: [0, 0])  # family -> [killed, aimed]
    for name in sorted(present):
        aimed = list(facts[name]["catches"])
        counted = [f for f in aimed if f in ran[name]]
        killed = [f for f in counted if f in failing[name]]
        rows.append({"mutant": name.removeprefix("mutant:"), "doc": facts[name]["doc"], "aimed": aimed, "ran": counted,
                     "killed": killed, "not_run": [f for f in aimed if f not in counted]})
        for family in counted:
            families[family][1] += 1
            families[family][0] += family in killed
    return rows, {f: (killed, aimed) for f, (killed, aimed) in sorted(families.items())}
