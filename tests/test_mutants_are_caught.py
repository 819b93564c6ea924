"""Every seeded fault is caught by the check family it is aimed at, and every correct
backend passes: the suite's own proof that its checks can fail."""

from collections import defaultdict
from types import SimpleNamespace

import pytest

from kvconform.backends_under_test.mutants import MUTANTS

from .suite_runs import run_suite as run_suite_process

CORRECT = {
    "reference": "e1", "reference_kv_first": "e1", "reference_e3": "e3",
    "triton_flash": "e1", "triton_aiter": "e1", "triton_unified": "e1", "triton_rocm_attn": "e1",
    "reference_mla": "e1", "reference_quant": "e1",
}


def run_focused(tmp_path_factory, backends, standard, *extra, fresh=False):
    """The suite under xdist; mutants run only the checks they name in kills (tests/mutant_focus.py).
    Failures are told in one line each (``--tb=line``): the records carry what failed and why."""
    return run_suite_process(tmp_path_factory.mktemp("suite"), "-n", "2", "-p", "tests.mutant_focus", "--tb=line", "--backend", ",".join(backends),
                             "--standard", standard, *extra, fresh=fresh)


def run_suite(tmp_path_factory, backends, standard, *extra, fresh=False):
    return outcomes_of(run_focused(tmp_path_factory, backends, standard, *extra, fresh=fresh))


def outcomes_of(result):
    """Outcomes per backend and family."""
    outcomes = defaultdict(lambda: defaultdict(list))
    for record in result.records:
        outcomes[record["backend"]][record["family"]].append((record["outcome"], record["nodeid"], record["message"]))
    return {backend: dict(families) for backend, families in outcomes.items()}


PLAIN = sorted(m for m, cls in MUTANTS.items() if not cls.suite_args)
NEEDS_OPTIONS = sorted(m for m, cls in MUTANTS.items() if cls.suite_args)


# One run: every mutant on the families it is aimed at, and the reference on every family (the
# same-seed test reruns it). The other correct built-ins' verdicts come from the session's
# built-in runs (tests/conftest.py `builtin_documents`, seed 0, every family): running the
# interpreted Triton backends a second time here cost ~2 of CI's minutes. (All mutants on all
# families take several times as long; one run per group of families paid start-up thrice.)
IN_MUTANT_RUN = ("reference",)


@pytest.fixture(scope="module")
def e1_results(tmp_path_factory, builtin_documents):
    results = run_suite(tmp_path_factory, [f"mutant:{m}" for m in PLAIN] + list(IN_MUTANT_RUN), "e1")
    builtin = outcomes_of(SimpleNamespace(records=builtin_documents[0]["tests"]))
    return {**{b: builtin[b] for b, s in CORRECT.items() if s == "e1" and b not in IN_MUTANT_RUN}, **results}


@pytest.fixture(scope="module")
def e3_run(tmp_path_factory):
    return run_focused(tmp_path_factory, [b for b, s in CORRECT.items() if s == "e3"], "e3")


@pytest.fixture(scope="module")
def e3_results(e3_run):
    return outcomes_of(e3_run)


def test_a_whole_suite_run_under_xdist_is_complete(e3_run):
    completion, run = e3_run.document["completion"], e3_run
    assert completion["complete"] is True, completion
    assert completion["selected"] == completion["recorded"] == len(run.records) > 0


def assert_caught(results, mutant):
    families = results.get(f"mutant:{mutant}")
    assert families, f"mutant:{mutant} produced no results"
    for family in MUTANTS[mutant].catches:
        assert family in families, f"mutant:{mutant} names in kills no check of the '{family}' family (tests/mutant_focus.py runs only those)"
        failed = [r for r in families[family] if r[0] in ("failed", "error")]
        assert failed, f"mutant:{mutant} survived the '{family}' checks: {families[family]}"


@pytest.mark.parametrize("mutant", PLAIN)
def test_mutant_is_caught_by_its_check_family(e1_results, mutant):
    assert_caught(e1_results, mutant)


@pytest.mark.parametrize("mutant", NEEDS_OPTIONS)
def test_mutant_is_caught_when_its_check_runs(tmp_path_factory, mutant):
    assert_caught(run_suite(tmp_path_factory, [f"mutant:{mutant}"], "e1", *MUTANTS[mutant].suite_args), mutant)


# Mutants that name the checks they must fail (``kills``): each of those checks, not just the family.
NAMED_KILLS = sorted((m, check) for m, cls in MUTANTS.items() if not cls.suite_args for check in cls.kills)


@pytest.mark.parametrize("mutant, check", NAMED_KILLS, ids=[f"{m}-{c}" for m, c in NAMED_KILLS])
def test_mutant_fails_each_check_it_names(e1_results, mutant, check):
    records = [r for family in e1_results.get(f"mutant:{mutant}", {}).values() for r in family if f"::{check}[" in r[1]]
    assert any(outcome in ("failed", "error") for outcome, _, _ in records), f"mutant:{mutant} passed every {check}: {records}"


@pytest.mark.parametrize("backend", sorted(CORRECT))
def test_correct_backends_pass_every_applicable_check(e1_results, e3_results, backend):
    results = (e3_results if CORRECT[backend] == "e3" else e1_results).get(backend, {})
    bad = [r for family in results.values() for r in family if r[0] not in ("passed", "not-applicable")]
    assert results and not bad, f"{backend}: {bad[:3]}"
    assert any(r[0] == "passed" for family in results.values() for r in family)


def test_kv_first_backend_is_gated_not_failed(e1_results):
    gating = e1_results["reference_kv_first"]["gating"]
    assert gating and all(outcome == "passed" for outcome, _, _ in gating)
    shape = e1_results["reference_kv_first"]["shape"]
    assert shape and all(outcome == "not-applicable" for outcome, _, _ in shape)


def test_same_seed_gives_identical_results(e1_results, tmp_path_factory):
    backends = ["reference", "mutant:write_padding_slots", "mutant:split_copies"]
    # alone, in a new Python (its own hash seed): no state shared with the big run
    again = run_suite(tmp_path_factory, backends, "e1", fresh=True)
    assert again == {backend: e1_results[backend] for backend in backends}


def test_duplicated_regions_fail_cells_that_name_the_duplication(e1_results):
    """A region reported twice is a failure naming the duplication (issue #27), never an error of the check's own bookkeeping."""
    records = [r for family in e1_results["mutant:connector_regions_repeat_a_run"].values() for r in family
               if "::test_blocks_shipped_to_every_peer" in r[1] or ("::test_resharding_gives" in r[1] and "-regions]" in r[1])]
    assert records and all(outcome == "failed" and "twice" in message for outcome, _, message in records), records
