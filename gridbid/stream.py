"""A small stream client: subscribe, print, optionally place a bid, and watch sequence gaps.

    python -m gridbid.stream --token $T book.H100-SXM-80GB.us-east orders
    python -m gridbid.stream --token $T --bid bid.json --count 5 orders

Uses only the `websockets` package and docs/stream.md.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click


class SequenceTracker:
    """Per-channel sequence check: True when an update follows the last one."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}

    def accept(self, msg: dict[str, Any]) -> bool | None:
        """None: stale (older than the snapshot), True: in order, False: a gap (the last
        number held stays where it was: resubscribe with it as since_seq)."""
        channel, seq = msg["channel"], msg["seq"]
        if msg["type"] == "snapshot":
            self.last[channel] = seq
            return True
        prev = self.last.get(channel)
        if prev is not None and seq <= prev:
            return None
        if prev is not None and seq != prev + 1:
            return False
        self.last[channel] = seq
        return True


async def run(url: str, token: str | None, channels: list[str], bid: dict[str, Any] | None, count: int, timeout: float) -> int:
    from websockets.asyncio.client import connect

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    tracker = SequenceTracker()
    async with connect(url, additional_headers=headers, open_timeout=timeout) as ws:
        for channel in channels:
            await ws.send(json.dumps({"type": "subscribe", "channel": channel}))
        if bid is not None:
            await ws.send(json.dumps({"type": "place_bid", "client_order_id": bid.pop("client_order_id", None), "bid": bid}))
        seen = 0
        while count <= 0 or seen < count:
            try:
                msg = json.loads(await asyncio.wait_for(ws.recv(), timeout))
            except TimeoutError:
                click.echo(f"no message for {timeout:g} s", err=True)
                return 1
            if msg.get("type") in ("snapshot", "update"):
                ok = tracker.accept(msg)
                if ok is None:  # sent before the snapshot was taken, and already in it
                    click.echo(f"skipped {msg['channel']} update {msg['seq']}: older than the snapshot", err=True)
                    continue
                if ok is False:  # the server replays what is missing (or resyncs with a snapshot)
                    since = tracker.last[msg["channel"]]
                    click.echo(f"gap on {msg['channel']} after {since}: resuming", err=True)
                    await ws.send(json.dumps({"type": "subscribe", "channel": msg["channel"], "since_seq": since}))
                    continue
            seen += 1
            click.echo(json.dumps(msg))
            if msg.get("type") == "error" and msg.get("code") == "not_authenticated":
                return 2
    return 0


@click.command()
@click.option("--url", default="ws://127.0.0.1:8000/ws/v1/stream", show_default=True, envvar="GRIDBID_STREAM_URL")
@click.option("--token", envvar="GRIDBID_TOKEN", help="API token (gb_...) for your own channels and orders.")
@click.option("--bid", "bid_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="JSON file with a bid body to place.")
@click.option("--count", default=0, type=click.IntRange(0), help="Stop after this many messages (0: run until Ctrl-C).")
@click.option("--timeout", default=30.0, type=click.FloatRange(0.1), help="Seconds to wait for each message.")
@click.argument("channels", nargs=-1)
def main(url: str, token: str | None, bid_file: Path | None, count: int, timeout: float, channels: tuple[str, ...]) -> None:
    """Subscribe to CHANNELS and print every message as a JSON line."""
    bid = None
    if bid_file is not None:
        try:
            bid = json.loads(bid_file.read_text())
        except ValueError as exc:
            raise click.BadParameter(f"{bid_file} is not JSON: {exc}", param_hint="--bid") from None
        if not isinstance(bid, dict):
            raise click.BadParameter("the bid file must hold a JSON object", param_hint="--bid")
    try:
        sys.exit(asyncio.run(run(url, token, list(channels), bid, count, timeout)))
    except OSError as exc:
        raise click.ClickException(f"cannot connect to {url}: {exc}") from None
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
