"""Mutation kill rate: how many seeded faults each check family catches (issue: self-test).

A mutant is *killed* by a family when at least one of that family's checks fails or errors on
it. Which families a mutant is aimed at comes from the run's environment (the recorder writes
each mutant's ``catches`` and description there), so this needs nothing but the results JSON.
"""

from __future__ import annotations

from collections import defaultdict

from .results import FAILING


def mutant_facts(documents: list[dict]) -> dict[str, dict]:
    """Backend name → its ``mutant`` facts, for every backend of these runs that is a mutant."""
    facts = {}
    for document in documents:
        for env in [document["environment"], *document.get("merged_from", [])]:
            for name, info in env.get("backends", {}).items():
                if isinstance(info, dict) and info.get("mutant"):
                    facts[name] = info["mutant"]
    return facts


def kill_rates(documents: list[dict]) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Per mutant (name, aimed families, killed families) and per family (killed, aimed at it)."""
    facts = mutant_facts(documents)
    failing = defaultdict(set)
    present = set()
    for document in documents:
        for record in document["tests"]:
            if record["backend"] in facts:
                present.add(record["backend"])
                if record["outcome"] in FAILING:
                    failing[record["backend"]].add(record["family"])
    rows, families = [], defaultdict(lambda: [0, 0])
    for name in sorted(present):
        aimed = facts[name]["catches"]
        killed = [f for f in aimed if f in failing[name]]
        rows.append({"mutant": name.removeprefix("mutant:"), "doc": facts[name]["doc"], "aimed": list(aimed), "killed": killed})
        for family in aimed:
            families[family][1] += 1
            families[family][0] += family in killed
    return rows, {f: tuple(v) for f, v in sorted(families.items())}
