"""`gridbid up --demo` on the embedded defaults (SQLite, in-process Celery) serves
the market over a real socket: pages, API docs and a populated market."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]


def test_demo_market_is_populated(embedded_server):
    markets = httpx.get(f"{embedded_server}/api/v1/markets/").json()
    assert len(markets) >= 10
    assert sum(m["gpus_free"] for m in markets) > 50
    assert len({m["region"] for m in markets}) >= 6


def test_markets_page_and_api_docs_are_served(embedded_server):
    page = httpx.get(embedded_server + "/")
    assert page.status_code == 200 and "GPU markets" in page.text
    docs = httpx.get(embedded_server + "/api/docs/")
    assert docs.status_code == 200
    css = httpx.get(embedded_server + "/static/gridbid/app.css")
    assert css.status_code == 200 and "--accent" in css.text


def test_stream_client_sees_a_snapshot_and_a_live_round_update(embedded_server):
    url = embedded_server.replace("http://", "ws://") + "/ws/v1/stream"
    proc = subprocess.run(
        [sys.executable, "-m", "gridbid.stream", "--url", url, "--count", "3", "--timeout", "60", "rounds"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    messages = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [m["type"] for m in messages] == ["welcome", "snapshot", "update"]
    assert messages[2]["seq"] > messages[1]["seq"] and messages[2]["data"]["round"]["number"] >= 1


def test_stream_refuses_a_foreign_origin_at_the_handshake(embedded_server):
    import asyncio

    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    async def attempt() -> int:
        try:
            async with connect(embedded_server.replace("http://", "ws://") + "/ws/v1/stream", origin="https://evil.example"):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    assert asyncio.run(attempt()) == 403


def _manage_json(env: dict[str, str], code: str) -> object:
    import json

    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_demo_trades_are_recorded_and_settled_on_the_dev_chain(embedded):
    """The whole money path under `gridbid up --demo`, untouched: rounds match demo bids,
    trades are recorded on the dev chain, demo jobs finish, the simulated agents sign and
    co-sign, the batch settles, and `gridbid ledger verify` agrees with the chain."""
    import time

    _base, env = embedded
    states = "import json; from market.models import Trade; print(json.dumps(sorted(Trade.objects.values_list('state', flat=True))))"
    deadline = time.monotonic() + 240
    seen: object = []
    while time.monotonic() < deadline:
        seen = _manage_json(env, states)
        if "settled" in seen:  # type: ignore[operator]
            break
        time.sleep(3)
    assert "settled" in seen, f"no demo trade settled in 4 minutes: {seen}"  # type: ignore[operator]
    verify = subprocess.run([sys.executable, "-m", "gridbid.cli", "ledger", "verify"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert "balances match the chain" in verify.stdout
