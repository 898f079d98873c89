"""The real server (`gridbid up`, uvicorn) against a client that forges X-Forwarded-For:
without TRUSTED_PROXIES the forged address is ignored, so the anonymous limit holds."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.e2e.conftest import running_server

ANON_PER_MINUTE = 600  # gridbid.settings DEFAULT_THROTTLE_RATES["anon"]


def test_a_forged_forwarded_address_per_request_still_hits_the_anonymous_limit(tmp_path: Path) -> None:
    with running_server(tmp_path, demo=False) as (base, _env), httpx.Client(base_url=base, timeout=10) as http:
        statuses: list[int] = []
        deadline = time.monotonic() + 50  # well inside the throttle's minute
        for i in range(ANON_PER_MINUTE + 20):
            if time.monotonic() > deadline:
                break
            r = http.get("/api/v1/regions/", headers={"X-Forwarded-For": f"198.51.{i // 250}.{i % 250 + 1}"})
            statuses.append(r.status_code)
        assert len(statuses) == ANON_PER_MINUTE + 20, f"only {len(statuses)} requests in 50 s"
        assert statuses.count(200) == ANON_PER_MINUTE and statuses[-20:] == [429] * 20
        assert "Retry-After" in r.headers and r.json()["error"]["code"] == "throttled"
