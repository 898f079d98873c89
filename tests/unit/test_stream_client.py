from gridbid.stream import SequenceTracker


def test_sequence_tracker_flags_gaps_and_skips_stale_updates():
    t = SequenceTracker()
    assert t.accept({"type": "snapshot", "channel": "rounds", "seq": 5}) is True
    assert t.accept({"type": "update", "channel": "rounds", "seq": 4}) is None
    assert t.accept({"type": "update", "channel": "rounds", "seq": 6}) is True
    assert t.accept({"type": "update", "channel": "rounds", "seq": 8}) is False
