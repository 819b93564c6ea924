"""Mutation kill rate: how many seeded faults each check family catches (issue: self-test).

A mutant is *killed* by a family when at least one of that family's checks fails or errors on it.
"""

from __future__ import annotations

from collections import defaultdict

from backends_under_test.mutants import MUTANTS
from backends_under_test.registry import MUTANT_PREFIX

from .results import FAILING


def kill_rates(documents: list[dict]) -> tuple[list[dict], dict[str, tuple[int, int]]]:
    """Per mutant (name, aimed families, killed families) and per family (killed, aimed at it)."""
    failing = defaultdict(set)
    present = set()
    for document in documents:
        for record in document["tests"]:
            backend = record["backend"]
            if backend.startswith(MUTANT_PREFIX) and backend[len(MUTANT_PREFIX):] in MUTANTS:
                present.add(backend[len(MUTANT_PREFIX):])
                if record["outcome"] in FAILING:
                    failing[backend[len(MUTANT_PREFIX):]].add(record["family"])
    rows, families = [], defaultdict(lambda: [0, 0])
    for name in sorted(present):
        aimed = MUTANTS[name].catches
        killed = [f for f in aimed if f in failing[name]]
        rows.append({"mutant": name, "doc": " ".join((MUTANTS[name].__doc__ or "").split()), "aimed": list(aimed), "killed": killed})
        for family in aimed:
            families[family][1] += 1
            families[family][0] += family in killed
    return rows, {f: tuple(v) for f, v in sorted(families.items())}
