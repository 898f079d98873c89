from gridbid.stream import SequenceTracker


def test_sequence_tracker_flags_gaps_and_skips_stale_updates():
    t = SequenceTracker()
    assert t.accept({"type": "snapshot", "channel": "rounds", "seq": 5}) is True
    assert t.accept({"type": "update", "channel": "rounds", "seq": 4}) is None
    assert t.accept({"type": "update", "channel": "rounds", "seq": 6}) is True
    assert t.accept({"type": "update", "channel": "rounds", "seq": 8}) is False
    assert t.last["rounds"] == 6  # resume from the last one held: 7 comes in the replay
    assert t.accept({"type": "update", "channel": "rounds", "seq": 7}) is True
    assert t.accept({"type": "update", "channel": "rounds", "seq": 8}) is True


def test_the_client_skips_an_update_older_than_its_snapshot_and_does_not_count_it(capsys) -> None:
    # a clean-clone CI run: an update sent while the snapshot was being taken (its seq equal
    # to the snapshot's) was printed and counted as the live update the caller waited for
    import asyncio
    import json

    from websockets.asyncio.server import serve

    from gridbid.stream import run

    async def market(ws) -> None:  # type: ignore[no-untyped-def]
        await ws.recv()  # the subscription
        for msg in ({"type": "welcome"}, {"type": "snapshot", "channel": "rounds", "seq": 141, "data": {}},
                    {"type": "update", "channel": "rounds", "seq": 141, "data": {"round": {"number": 7}}},
                    {"type": "update", "channel": "rounds", "seq": 142, "data": {"round": {"number": 8}}}):
            await ws.send(json.dumps(msg))
        await ws.wait_closed()

    async def scenario() -> int:
        async with serve(market, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            return await run(f"ws://127.0.0.1:{port}", None, ["rounds"], None, 3, 10)

    assert asyncio.run(scenario()) == 0
    out, err = capsys.readouterr()
    seqs = [json.loads(line).get("seq") for line in out.splitlines()]
    assert seqs == [None, 141, 142], out
    assert "skipped rounds update 141: older than the snapshot" in err
