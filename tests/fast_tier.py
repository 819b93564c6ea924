"""The fast tier of kvconform's own tests: ``./kvc test --fast`` runs only the tests listed in
``tests/fast_tier.txt``, a list generated from measured durations, so that a developer can run a
tier that touches every test module in a few minutes before committing. The full tier (no
``--fast``) is what CI runs.

Why a generated list rather than a ``slow`` marker: what is slow is a measurement (a test that
starts a suite run in a subprocess, Chromium or the vLLM venv, or waits on a fixture that does),
not something a test's author knows when writing it, and it changes as the suite grows; a list
regenerated from a run's durations stays true without editing test files. A new test of a module
the list knows (or one renamed since the list was made) runs in the full tier only until the list
is regenerated; a module the list does not know runs whole; ``tests/test_fast_tier.py`` fails when
a module drops out of the tier (every listed test of it renamed or removed).

Regenerate (a full run, ~15 min on two cores, then the selection; see docs/PERFORMANCE.md)::

    ./kvc test -n 0 --record-durations /tmp/durations.jsonl
    .venv/bin/python -m tests.fast_tier /tmp/durations.jsonl

The selection keeps each module's cheapest measured test, then adds the cheapest remaining tests
while the sum of their measured durations stays within the budget.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
from pathlib import Path

import pytest

LIST = Path(__file__).with_name("fast_tier.txt")
# Measured seconds the tier may hold, in the units of the run that measured them: the list's were
# measured by a clean clone's full `./kvc test` on an idle two-core machine (1 474 s for 1 638 tests,
# 2026-12-05: 120 s of them made a 3 min 02 s tier that day, 115 s one of 1 min 50 s: a few tests'
# module fixtures cost more in the tier than their records say); the tier's wall time, which must
# stay within 3 minutes, is in docs/PERFORMANCE.md.
BUDGET_S = 115.0
# Modules with no test in the tier, and why (each is in the full tier, which CI runs).
NOT_IN_TIER = {
    "tests/test_report_in_chromium.py": "each test renders a suite run's HTML report in headless Chromium "
                                        "(the cheapest took 58 s, as much as a fifth of the tier)",
    "tests/test_fault_isolation.py": "its one test is a whole suite run of faulty backends (81 s in the tier's first timing)",
    "tests/test_lmcache_adapter.py": "every test needs the LMCache sdist fetched and built from the package registry (45 s)",
    "tests/test_interop_report.py": "every test reads suite runs of two machines made by a module fixture (24 s)",
    "tests/test_plugin_matrix.py": "a module fixture pip-installs four pytest plugins and makes ten suite runs (75-86 s)",
    "tests/test_triton_latent_kernels_interpreted.py": "its one test is a pytest of 31 latent-kernel tests under the interpreter (34 s)",
}


def add_options(parser: pytest.Parser) -> None:
    group = parser.getgroup("kvconform own tests")
    group.addoption("--fast", action="store_true",
                    help="run only the fast tier: the tests listed in tests/fast_tier.txt (a few minutes)")
    group.addoption("--record-durations", metavar="PATH",
                    help="append each test's seconds (set-up + call + tear-down; the set-up and the shared fixtures it "
                         "requests apart) to PATH as JSON lines, "
                         "the input of `python -m tests.fast_tier`")


def configure(config: pytest.Config) -> None:
    # Under xdist the controller sees every worker's reports: it alone records.
    record = None if hasattr(config, "workerinput") else config.getoption("record_durations")
    if record and getattr(config.option, "numprocesses", None):  # -n N, or KVCONFORM_TEST_WORKERS
        raise pytest.UsageError("--record-durations needs one process (add -n 0): the fixtures a test shares are seen where it runs, "
                                "and an xdist controller runs none")
    if config.getoption("fast") or record:
        config.pluginmanager.register(FastTier(config.getoption("fast"), record), "kvc-fast-tier")


def listed_node_ids(path: Path = LIST) -> list[str]:
    lines = path.read_text().splitlines()
    return [line.split("\t", 1)[1] for line in lines if line and not line.startswith("#")]


def module_of(node_id: str) -> str:
    return node_id.split("::", 1)[0]


class FastTier:
    """Deselects what the list does not name (``--fast``) and records durations (``--record-durations``)."""

    def __init__(self, fast: bool, record_path: str | None):
        self.fast = fast
        self.record_path = record_path
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.setup: dict[str, float] = {}
        self.shared: dict[str, list[str]] = {}
        self.skipped: set[str] = set()
        self.kept = self.collected = 0
        self.stale: list[str] = []
        self.unknown: list[str] = []

    @pytest.hookimpl(trylast=True)  # after other hooks have deselected by -k/-m
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        if not self.fast:
            return
        listed = set(listed_node_ids())
        known = {module_of(i) for i in listed}
        # A module the list does not know is newer than the list: it runs whole, being most likely what is being worked on.
        in_tier = {item.nodeid for item in items
                   if item.nodeid in listed or module_of(item.nodeid) not in known | set(NOT_IN_TIER)}
        kept = [item for item in items if item.nodeid in in_tier]
        dropped = [item for item in items if item.nodeid not in in_tier]
        collected_modules = {module_of(item.nodeid) for item in items}
        collected_ids = {item.nodeid for item in items}
        # Only ids of modules this run collected can be called stale: a run of one module is not a verdict on the rest.
        self.stale = sorted(i for i in listed if module_of(i) in collected_modules and i not in collected_ids)
        self.unknown = sorted(collected_modules - known - set(NOT_IN_TIER))
        self.kept, self.collected = len(kept), len(items)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = kept

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if self.record_path:
            self.shared[item.nodeid] = shared_fixtures(item)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not self.record_path:
            return
        self.seconds[report.nodeid] += report.duration
        if report.when == "setup":
            self.setup[report.nodeid] = report.duration
        if report.skipped:
            self.skipped.add(report.nodeid)
        if report.when == "teardown":  # written as each test ends: a run stopped early keeps what it measured
            record = {"nodeid": report.nodeid, "seconds": round(self.seconds.pop(report.nodeid), 3),
                      "setup": round(self.setup.pop(report.nodeid, 0.0), 3), "shared": self.shared.pop(report.nodeid, []),
                      "skipped": report.nodeid in self.skipped}
            with open(self.record_path, "a") as out:
                out.write(json.dumps(record) + "\n")

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.fast or not self.collected:  # an xdist controller collects nothing
            return
        line = f"fast tier: {self.kept} of {self.collected} collected tests (tests/fast_tier.txt)"
        if self.unknown:
            line += f"; {len(self.unknown)} modules newer than the list run whole ({', '.join(self.unknown)})"
        if self.stale:
            line += f"; {len(self.stale)} listed tests no longer exist (renamed or removed), e.g. {self.stale[0]}"
        if self.unknown or self.stale:
            line += "; regenerate the list (tests/fast_tier.py says how)"
        terminalreporter.write_line(line)


def shared_fixtures(item: pytest.Item) -> list[str]:
    """The fixtures of wider than function scope ``item`` requests, set up once for many tests: a
    session fixture by its name, a narrower one by its module and name (each module sets up its own)."""
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}) or {}
    scopes = {name: chain[-1].scope for name, chain in defs.items() if chain}
    return sorted(name if scope in ("session", "package") else f"{module_of(item.nodeid)}::{name}"
                  for name, scope in scopes.items() if scope != "function")


@dataclasses.dataclass(frozen=True)
class Measured:
    """A test's recorded seconds: all of them, its set-up, the shared fixtures it requests."""

    seconds: float
    setup: float = 0.0
    shared: tuple[str, ...] = ()

    @property
    def own(self) -> float:
        """What the test costs once its shared fixtures exist: the set-up counts only without any
        (with one, the recorded set-up is that fixture's when this test paid for it, ~0 when not)."""
        return self.seconds - self.setup if self.shared else self.seconds


def fixture_costs(measured: dict[str, Measured]) -> dict[str, float]:
    """A shared fixture's cost: the set-up of the test that requested it first (the records are in
    run order), shared evenly when that test was the first to request several."""
    costs: dict[str, float] = {}
    for m in measured.values():
        new = [name for name in m.shared if name not in costs]
        for name in new:
            costs[name] = m.setup / len(new)
    return costs


def select(measured: dict[str, Measured], budget_s: float = BUDGET_S, skipped: frozenset[str] = frozenset()) -> dict[str, float]:
    """Each module's cheapest test (but those of NOT_IN_TIER), then the cheapest others that ran
    while the sum stays within the budget. A test costs its own seconds plus the shared fixtures it
    requests that no chosen test set up yet: in a full run a module fixture's minutes are recorded
    against one test only, and every other test of the module looked free. A skipped test's seconds
    say nothing of what it costs where it runs (the vLLM modules with $KVCONFORM_VLLM_PYTHON): one
    represents its module at most. Returns node id -> the seconds it adds."""
    fixtures = fixture_costs(measured)
    paid: set[str] = set()

    def cost(node_id: str) -> float:
        m = measured[node_id]
        return m.own + sum(fixtures[name] for name in m.shared if name not in paid)

    candidates = sorted(n for n in measured if module_of(n) not in NOT_IN_TIER)
    chosen: dict[str, float] = {}
    for module in sorted({module_of(n) for n in candidates}):
        node_id = min((n for n in candidates if module_of(n) == module), key=lambda n: (cost(n), n))
        chosen[node_id] = cost(node_id)
        paid.update(measured[node_id].shared)
    total = sum(chosen.values())
    while True:
        left = [(cost(n), n) for n in candidates if n not in chosen and n not in skipped]
        if not left:
            return chosen
        seconds, node_id = min(left)
        if total + seconds > budget_s:
            return chosen
        chosen[node_id] = seconds
        total += seconds
        paid.update(measured[node_id].shared)


def read_records(paths: list[Path]) -> tuple[dict[str, Measured], frozenset[str]]:
    """node id -> what was measured, and the node ids that skipped; a test recorded by several runs
    keeps its last measurement (records written before set-up was kept apart have no shared fixtures)."""
    records: dict[str, dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            record = json.loads(line)
            records[record["nodeid"]] = record
    measured = {n: Measured(r["seconds"], r.get("setup", 0.0), tuple(r.get("shared", ()))) for n, r in records.items()}
    return measured, frozenset(n for n, r in records.items() if r.get("skipped"))


def write_list(chosen: dict[str, float], measured: dict[str, Measured], budget_s: float, path: Path = LIST) -> None:
    modules = {module_of(n) for n in chosen}
    header = [
        "# The fast tier: `./kvc test --fast` runs these tests. Generated by `python -m tests.fast_tier`",
        "# from measured durations (see tests/fast_tier.py); edit by hand only to drop a renamed test.",
        f"# {len(chosen)} of {len(measured)} measured tests, of {len(modules)} modules; measured seconds "
        f"{sum(chosen.values()):.1f} of the budget {budget_s:.0f} (the whole run took {sum(m.seconds for m in measured.values()):.0f}).",
        "# seconds<TAB>node id",
    ]
    path.write_text("\n".join(header + [f"{chosen[n]:.3f}\t{n}" for n in sorted(chosen)]) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate tests/fast_tier.txt from --record-durations files.")
    parser.add_argument("records", nargs="+", type=Path)
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="measured seconds the tier may hold (default %(default)s)")
    args = parser.parse_args(argv)
    measured, skipped = read_records(args.records)
    chosen = select(measured, args.budget, skipped)
    write_list(chosen, measured, args.budget)
    print(f"{LIST}: {len(chosen)} of {len(measured)} tests, {sum(chosen.values()):.1f} s measured", file=sys.stderr)


if __name__ == "__main__":
    main()
