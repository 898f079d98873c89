"""The example bot in docs/stream.md, run as written against a real `gridbid up` server
(issue 34): a bot built from the document alone connects, keeps a book, resumes with
since_seq, is covered by cancel-on-disconnect, and places and cancels bids."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.funds import funded_buyer

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "stream.md"


def bot_source() -> str:
    found = re.search(r"<!-- bot\.py: begin -->\n```python\n(.*?)```\n<!-- bot\.py: end -->", DOC.read_text(), re.S)
    assert found, "docs/stream.md has no bot.py block between its markers"
    return found.group(1)


def test_the_example_bot_is_at_most_150_lines() -> None:
    assert len(bot_source().splitlines()) <= 150


def test_the_bot_in_docs_stream_md_trades_against_a_real_server(embedded: tuple[str, dict[str, str]], tmp_path: Path) -> None:
    server, env = embedded
    auth = funded_buyer(server, env, "docbot")
    token = auth["Authorization"].removeprefix("Bearer ")
    rows = httpx.get(f"{server}/api/v1/markets/", timeout=30).json()
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    market = next(r for r in rows if r["best_ask"] is not None)
    bot = tmp_path / "bot.py"
    bot.write_text(bot_source())
    out = subprocess.run([sys.executable, str(bot), "--url", server.replace("http://", "ws://") + "/ws/v1/stream", "--token", token,
                          "--book", f"book.{market['gpu_model']}.{market['region']}"], capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert out.returncode == 0, f"stdout: {out.stdout}\nstderr: {out.stderr}"
    said: dict[str, Any] = {}
    for line in out.stdout.splitlines():
        said.update(json.loads(line))
    assert said["cancelled_on_disconnect"] == said["placed"]
    # the server's own record agrees: both bids cancelled, by the switch and by the bot
    for bid in (said["placed"], said["placed_and_cancelled"]):
        row = httpx.get(f"{server}/api/v1/bids/{bid}/", headers=auth, timeout=30).json()
        assert row["state"] == "cancelled", row
    assert set(said["seq"]) == {f"book.{market['gpu_model']}.{market['region']}", "orders"}
