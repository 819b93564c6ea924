"""Live KV transfer between processes over gloo on localhost: same backend, NHD → HND,
blocks-first → shuffled, e4m3fn → e4m3fnuz pass; a sender that ships the wrong plane fails.
TP resharding 1 → 2 and 2 → 1 (and 1 → 2 across fp8 formats): after a descriptor handshake every
consumer rank's own decode over its own heads matches; a producer shipping the wrong heads fails."""

import dataclasses

import pytest

from kvconform.transfer import PAIRS, RESHARDS, run_pair, run_reshard


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_received_blocks_decode_like_the_sent_kv(pair):
    verdict = run_pair(pair)
    assert verdict["ok"], verdict
    assert verdict["wall_s"] < 120


def test_a_sender_that_ships_the_wrong_plane_is_caught():
    verdict = run_pair(dataclasses.replace(PAIRS[0], name="wrong-plane", wrong_plane=True))
    assert not verdict["ok"] and verdict.get("max_abs_err", 0) > 2e-2, verdict


@pytest.mark.parametrize("job", RESHARDS, ids=[j.name for j in RESHARDS])
def test_every_consumer_rank_decodes_its_own_heads_after_resharding(job):
    verdict = run_reshard(job)
    assert verdict["ok"], verdict
    assert len(verdict["consumers"]) == job.consumer_tp and all(c["bytes_received"] > 0 for c in verdict["consumers"])


def test_a_producer_that_ships_the_wrong_heads_is_caught():
    verdict = run_reshard(dataclasses.replace(RESHARDS[0], name="wrong-heads", wrong_heads=True))
    assert not verdict["ok"] and all(c.get("max_abs_err", 0) > 2e-2 for c in verdict["consumers"]), verdict
