"""Live KV transfer between two processes over gloo on localhost: same backend, NHD → HND,
blocks-first → shuffled, e4m3fn → e4m3fnuz pass; a sender that ships the wrong plane fails."""

import dataclasses

import pytest

from kvconform.conformance.transfer import PAIRS, run_pair


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_received_blocks_decode_like_the_sent_kv(pair):
    verdict = run_pair(pair)
    assert verdict["ok"], verdict
    assert verdict["wall_s"] < 120


def test_a_sender_that_ships_the_wrong_plane_is_caught():
    verdict = run_pair(dataclasses.replace(PAIRS[0], name="wrong-plane", wrong_plane=True))
    assert not verdict["ok"] and verdict.get("max_abs_err", 0) > 2e-2, verdict
