"""LOG_FORMAT=json on the real server: its log lines are JSON objects, and a request's
lines carry the id it sent (and got back) in X-Request-ID."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

PLAIN_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING|ERROR|CRITICAL) ")


def test_the_servers_log_lines_are_json_and_carry_the_request_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.chain.anvil import AnvilNotFound, find_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(f"anvil is not installed ({exc})")
    monkeypatch.setenv("LOG_FORMAT", "json")
    log_path = tmp_path / "server.log"
    with running_server(tmp_path, demo=False) as (base, _):
        r = httpx.get(f"{base}/api/v1/no-such-thing/", headers={"X-Request-ID": "e2e-json-1"}, timeout=10)
        assert r.status_code == 404 and r.headers["X-Request-ID"] == "e2e-json-1"
        bad = httpx.get(f"{base}/api/v1/markets/", headers={"X-Request-ID": "no spaces allowed"}, timeout=10)
        assert bad.headers["X-Request-ID"] != "no spaces allowed" and len(bad.headers["X-Request-ID"]) == 32
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and "e2e-json-1" not in log_path.read_text():
            time.sleep(0.2)
        text = log_path.read_text()
    mine = [json.loads(line) for line in text.splitlines() if "e2e-json-1" in line]
    assert mine, text[-3000:]
    assert all(m["request_id"] == "e2e-json-1" and {"time", "level", "logger", "message"} <= set(m) for m in mine)
    assert any(m["logger"] == "django.request" and "/api/v1/no-such-thing/" in m["message"] for m in mine)
    for line in text.splitlines():
        assert not PLAIN_LINE.match(line), f"a log line escaped the JSON format: {line}"
        if line.startswith("{"):
            json.loads(line)
