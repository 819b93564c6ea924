"""The committed field runs (docs/field/) say what docs/field/CHANGES.md says changed between vLLM
releases: the dashboard's diff of each backend from one release to the next finds exactly the known
regressions and fixes, and CHANGES.md names each of them. Re-measuring a release that changes the
diff fails here until CHANGES.md (and KNOWN below) say what changed."""

from __future__ import annotations

from pathlib import Path

from kvconform.reports import dashboard_inputs, dashboard_model

FIELD = Path(__file__).resolve().parents[1] / "docs" / "field"
RELEASES = ("0.32.0", "0.33.0", "0.34.0")
COPY_INT8 = "conformance/test_quant_blocks.py::test_copied_blocks_carry_codes_and_scales_in_every_layer[{backend}-%s-int8_per_token_head]"
# (backend, from, to) -> (newly failing, fixed); every other step of every backend changes nothing.
KNOWN = {
    # 0.32.0 errors where the adapter's worker needs kv_cache_planning (absent before 0.33.0)
    ("vllm:TRITON_ATTN", "0.32.0", "0.33.0"): (set(), {COPY_INT8 % "HND", COPY_INT8 % "NHD"}),
    # 0.34.0 no longer fills unwritten per-token-head scales with 1.0; measured before PTH-SCALE-INIT
    # allowed that (re-measured, the step would change nothing: docs/field/CHANGES.md)
    ("vllm:TRITON_ATTN", "0.33.0", "0.34.0"): ({COPY_INT8 % "HND", COPY_INT8 % "NHD"}, set()),
}


def release_steps():
    runs = dashboard_inputs.load_runs([str(FIELD / f"vllm-{v}-cpu-gfx942.json") for v in RELEASES])
    entries = {(e.backend, e.version): e for e in dashboard_model.build(runs).entries}
    for backend in sorted({b for b, _ in entries}):
        for before, after in zip(RELEASES, RELEASES[1:]):
            yield (backend, before, after), dashboard_model.diff(entries[backend, before], entries[backend, after])


def test_each_release_step_changes_exactly_the_known_checks():
    seen = {step: ({c.key for c in d.newly_failing}, {c.key for c in d.fixed}) for step, d in release_steps()}
    unknown = {step: change for step, change in seen.items() if change != KNOWN.get(step, (set(), set()))}
    assert not unknown, f"the field runs changed differently from docs/field/CHANGES.md: {unknown}"
    assert set(KNOWN) <= set(seen), "a known step is no longer in the committed runs"


def test_changes_md_has_a_bullet_for_every_known_change():
    """A bullet ("- **RELEASE, ...**") of that step names the mode the changed checks ran in."""
    bullets = ["- **" + b for b in (FIELD / "CHANGES.md").read_text().split("\n- **")[1:]]
    for (backend, before, after), (failing, fixed) in KNOWN.items():
        for key in failing | fixed:
            mode = key.rsplit("-", 1)[1].rstrip("]")
            headers = [b for b in bullets if b.split("**")[1].startswith((before, after)) and mode in b]
            assert headers, f"docs/field/CHANGES.md: no bullet of {before} or {after} names {mode} ({backend}, {key})"
