"""The real server (`gridbid up`, uvicorn): a client that forges X-Forwarded-For still hits
the anonymous limit without TRUSTED_PROXIES; the API docs run under the Content-Security-Policy."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from tests.e2e import test_browser as ui
from tests.e2e.conftest import running_server, wait_for_js

browser, page = ui.browser, ui.page  # Chromium; the page fixture fails on any CSP console error

ANON_PER_MINUTE = 40  # API_RATE_ANON for this server: a burst of 60 takes a second or two, not 50


def test_a_forged_forwarded_address_per_request_still_hits_the_anonymous_limit(tmp_path: Path) -> None:
    with running_server(tmp_path, demo=False, extra_env={"API_RATE_ANON": str(ANON_PER_MINUTE)}) as (base, _env), \
            httpx.Client(base_url=base, timeout=10) as http:
        statuses: list[int] = []
        started = time.time()
        for i in range(ANON_PER_MINUTE + 20):
            r = http.get("/api/v1/regions/", headers={"X-Forwarded-For": f"198.51.{i // 250}.{i % 250 + 1}"})
            statuses.append(r.status_code)
        ended = time.time()
        # the throttle's windows are the clock's minutes, and the previous one counts by its
        # overlap (a sliding-window estimate): a burst inside one minute gets exactly the limit;
        # one that crosses into the next may get the share of the old minute that faded while it
        # ran. Both are checked, so where the minute falls does not decide the outcome.
        slack = 0 if int(started // 60) == int(ended // 60) else int(ANON_PER_MINUTE * (ended - started) / 60) + 1
        allowed = statuses.count(200)
        assert ANON_PER_MINUTE <= allowed <= ANON_PER_MINUTE + slack, f"{allowed} let through in {ended - started:.1f} s (slack {slack})"
        assert statuses[:ANON_PER_MINUTE] == [200] * ANON_PER_MINUTE and statuses[-10:] == [429] * 10, statuses
        assert "Retry-After" in r.headers and r.json()["error"]["code"] == "throttled"


def test_the_api_docs_and_the_admin_render_under_the_content_security_policy(tmp_path: Path, page: Any) -> None:
    with running_server(tmp_path, demo=False) as (base, _env):
        r = page.goto(base + "/api/docs/")
        assert "script-src 'self' 'nonce-" in r.headers["content-security-policy"]
        wait_for_js(page, "document.querySelectorAll('.swagger-ui .opblock').length > 10", timeout_ms=30_000)
        assert "GridBid API" in page.inner_text(".swagger-ui .info")
        page.goto(base + "/admin/login/")
        page.fill("#id_username", "nobody")
        page.fill("#id_password", "wrong-password")
        page.click("input[type=submit]")
        page.wait_for_selector(".errornote")
