"""Cross-platform byte equivalence — the same logical KV gives the same bytes: canonical block
bytes equal the committed reference digests (any layout, per fp8 format), page bytes equal the
reference layout's, and with ``--compare-digests`` equal another machine's run (SPEC §12 EQUIV-*)."""

import pytest
import torch

from kvconform import reference as R
from kvconform.reports.equivalence import compare_entries

from .harness.applicability import no_digest_for
from .harness.assertions import ConformanceFailure, assert_bytes_equal, describe
from .harness.diagnosis import WriteInputs
from .harness.equivalence import CASES, digest_record, golden_key, inputs, load_golden, scales, written_blocks
from .harness.ops import synchronize

pytestmark = [pytest.mark.equivalence, pytest.mark.kvc_op("write")]


def written(case, golden_case):
    """The backend's digest record for one golden case (zero-filled cache, CPU-made inputs)."""
    g = golden_case.geometry(case.backend.cache_dtype(golden_case.kv_cache_dtype, golden_case.model_dtype))
    spec = case.spec(g, golden_case.kv_cache_dtype, golden_case.model_dtype)
    arena = case.allocate(spec, zero=True)
    key, value, slots = inputs(golden_case)
    if not case.backend.capabilities.padding_slots:  # padding writes nothing: the same canonical bytes without those rows
        key, value, slots = key[slots >= 0], value[slots >= 0], slots[slots >= 0]
    dev = case.device
    fmt = str(g.dtype).removeprefix("torch.") if g.dtype in R.fp8.FP8_DTYPES else None
    k_scale, v_scale = scales(fmt)
    case.backend.write(arena.cache, key.to(dev), value.to(dev), slots.to(dev), spec, k_scale=k_scale.to(dev), v_scale=v_scale.to(dev))
    synchronize(case)
    record = digest_record(arena.region, spec.layout, golden_case, g, fmt)
    case.facts.digest = record
    return record, arena, spec


def first_canonical_difference(spec, golden_case, ours: torch.Tensor, theirs: torch.Tensor) -> str:
    """Logical coordinates of the first differing canonical element."""
    g = spec.geometry
    e = g.element_size
    at = int((ours != theirs).nonzero()[0]) // e
    per_block = 2 * g.block_size * g.num_kv_heads * g.head_size
    block = written_blocks(golden_case)[at // per_block]
    kv, n, h, d = R.unravel(at % per_block, (2, g.block_size, g.num_kv_heads, g.head_size))
    return describe({"layer": 0, "block": block, "kv": int(kv), "slot": int(n), "head": int(h), "dim": int(d)})


@pytest.mark.kvc_clause("EQUIV-CANONICAL", "EQUIV-PAGE")
@pytest.mark.parametrize("golden_case", CASES, ids=[c.name for c in CASES])
def test_canonical_bytes_equal_the_committed_reference_digests(case, golden_case):
    record, arena, spec = written(case, golden_case)
    golden = load_golden()["cases"][golden_key(golden_case, record["fp8_format"])]
    if record["canonical"] != golden["canonical"]:
        # The reference's write of the same inputs into the same zero-filled arena: the bytes the
        # digest stands for, compared element by element so the failure says where the wrong bytes
        # came from (diagnosis, byte map, first rows) like every other byte comparison (#23).
        initial = arena.snapshot()
        initial.region.zero_()
        expected = initial.snapshot()
        key, value, slots = inputs(golden_case)
        if not case.backend.capabilities.padding_slots:  # what written() gave the backend
            key, value, slots = key[slots >= 0], value[slots >= 0], slots[slots >= 0]
        k_scale, v_scale = scales(record["fp8_format"])
        R.reshape_and_cache(key, value, expected.region, spec.layout, spec.geometry, slots, k_scale=k_scale, v_scale=v_scale)
        digests = f"canonical digest {record['canonical'][:16]}… is not the reference's {golden['canonical'][:16]}…"
        assert_bytes_equal("equivalence", case, expected, arena, digests, initial=initial, zero_fill=True,
                           writes=WriteInputs(key, value, slots, k_scale, v_scale))
        blocks = written_blocks(golden_case)  # equal arenas with differing digests: the committed digest is not the reference's
        ours = R.canonical_block_bytes(arena.region.cpu(), spec.layout, spec.geometry, blocks).flatten()
        theirs = R.canonical_block_bytes(expected.region, spec.layout, spec.geometry, blocks).flatten()
        where = first_canonical_difference(spec, golden_case, ours, theirs) if bool((ours != theirs).any()) else "nowhere (the bytes equal the reference's)"
        raise ConformanceFailure(
            f"equivalence: {digests}; {int((ours != theirs).sum())} bytes differ, first at {where}\n  repro: {case.repro}",
            {"property": "equivalence", "mismatches": [{"where": where, "expected": golden["canonical"], "actual": record["canonical"]}]},
        )
    page = golden["pages"].get(record["layout"])
    if page is not None and page != record["page"]:
        raise ConformanceFailure(
            f"equivalence: page bytes of layout {record['layout']} differ from the reference layout's although the "
            f"canonical bytes agree (padding or unwritten slots were touched)\n  repro: {case.repro}",
            {"property": "equivalence", "mismatches": [{"where": "page digest", "expected": page, "actual": record["page"]}]},
        )


@pytest.mark.kvc_clause("EQUIV-CROSS-MACHINE")
@pytest.mark.kvc_needs("compare_digests")
@pytest.mark.parametrize("golden_case", CASES, ids=[c.name for c in CASES])
def test_digests_equal_the_exported_run(case, golden_case, exported_digests):
    record, _, _ = written(case, golden_case)
    exported = exported_digests
    theirs = [e for e in exported["entries"] if e["case"] == golden_case.name and e["layout"] == record["layout"]]
    if not theirs:
        raise no_digest_for(exported["path"], record["layout"], golden_case.name)
    for entry in theirs:
        verdict = compare_entries(record, entry)
        if verdict is not None:
            raise ConformanceFailure(f"equivalence: vs {entry['backend']}@{entry['platform']} in {exported['path']}: {verdict}\n  repro: {case.repro}",
                                     {"property": "equivalence", "mismatches": [{"where": entry["backend"], "expected": entry["page"], "actual": record["page"]}]})
