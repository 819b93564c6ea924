"""The committed field runs (docs/field/) say what docs/field/CHANGES.md says changed between vLLM
releases: the dashboard's diff of each backend from one release to the next finds exactly the known
regressions, fixes and dropped tests, and CHANGES.md names each of them. Re-measuring a release that
changes the diff fails here until CHANGES.md (and KNOWN below) say what changed."""

from __future__ import annotations

from pathlib import Path

from kvconform.reports import dashboard_inputs, dashboard_model

FIELD = Path(__file__).resolve().parents[1] / "docs" / "field"
# Per simulated arch, the releases run (docs/field/README.md): every member of the arch's run, full suite.
RELEASES = {"gfx942": ("0.30.0", "0.31.0", "0.32.0", "0.33.0", "0.34.0"), "gfx1201": ("0.32.0", "0.33.0", "0.34.0")}
# (backend, from, to) -> (newly failing, fixed); every other step of every backend changes no verdict.
KNOWN: dict[tuple[str, str, str], tuple[set, set]] = {}
# (backend, from, to) -> the layout whose tests the later release no longer runs (a layout it stopped declaring).
DROPPED = {("vllm:FLASHINFER", "0.33.0", "0.34.0"): "LHBNC"}


def release_steps(arch: str):
    releases = RELEASES[arch]
    runs = dashboard_inputs.load_runs([str(FIELD / f"vllm-{v}-cpu-{arch}.json") for v in releases])
    entries = {(e.backend, e.version): e for e in dashboard_model.build(runs).entries}
    for backend in sorted({b for b, _ in entries}):
        for before, after in zip(releases, releases[1:]):
            if (backend, before) in entries and (backend, after) in entries:
                yield (backend, before, after), entries[backend, before], entries[backend, after]


def test_each_release_step_changes_exactly_the_known_verdicts():
    seen = {}
    for arch in RELEASES:
        for step, a, b in release_steps(arch):
            d = dashboard_model.diff(a, b)
            seen[step] = ({c.key for c in d.newly_failing}, {c.key for c in d.fixed})
    unknown = {step: change for step, change in seen.items() if change != KNOWN.get(step, (set(), set()))}
    assert not unknown, f"the field runs changed differently from docs/field/CHANGES.md: {unknown}"
    assert set(KNOWN) <= set(seen), "a known step is no longer in the committed runs"


def test_tests_a_release_stopped_running_are_those_of_a_layout_it_stopped_declaring():
    for arch in RELEASES:
        for step, a, b in release_steps(arch):
            gone = [a.by_key[key] for key in a.by_key.keys() - b.by_key.keys()]
            layouts = {(r.get("layout") or "").split()[0] for r in gone}
            assert layouts <= ({DROPPED[step]} if step in DROPPED else set()), f"{arch} {step}: {len(gone)} tests gone, layouts {layouts}"
            assert step not in DROPPED or gone, f"{arch} {step}: CHANGES.md says {DROPPED[step]} was dropped; the runs still hold it"


def test_changes_md_has_a_bullet_for_every_known_change():
    """A bullet ("- **RELEASE, ...**") of that step names the mode or layout the changed checks ran in."""
    bullets = ["- **" + b for b in (FIELD / "CHANGES.md").read_text().split("\n- **")[1:]]
    named = {step: {key.rsplit("-", 1)[1].rstrip("]") for key in failing | fixed} for step, (failing, fixed) in KNOWN.items()}
    named |= {step: {layout} for step, layout in DROPPED.items()}
    for (backend, before, after), words in named.items():
        for word in words:
            headers = [b for b in bullets if b.split("**")[1].startswith((before, after)) and word in b]
            assert headers, f"docs/field/CHANGES.md: no bullet of {before} or {after} names {word} ({backend})"
