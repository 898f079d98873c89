"""A production `gridbid up` (PostgreSQL, Redis) whose Redis stops mid-run: the API and
the pages answer 503 with Retry-After, not 500, and /readyz names Redis."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.funds import make_tokens
from tests.e2e.test_production_mode import PG_ADMIN_URL, scratch_database
from tests.integration.helpers import own_redis

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


@pytest.fixture
def database() -> Iterator[str]:
    with scratch_database("gridbid_redisdown") as name:
        yield name


def test_a_server_whose_redis_stops_answers_503_with_retry_after(database, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with own_redis(tmp_path) as (redis_proc, redis_url):
        env = {"DATABASE_URL": f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{database}", "REDIS_URL": redis_url}
        proc, base, server_env = start_server(data, demo=False, extra_env=env, up_args=("--no-worker",))
        try:
            token = make_tokens(server_env, redisless=("buyer", ("read", "trade")))["redisless"]
            api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60)
            assert api.get("/api/v1/me/").status_code == 200
            assert httpx.get(f"{base}/", timeout=60).status_code == 200
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
            for r in (api.get("/api/v1/me/"), api.get("/api/v1/markets/"), httpx.get(f"{base}/api/v1/markets/", timeout=60)):
                assert r.status_code == 503, r.text[:300]
                assert r.headers["Retry-After"].isdigit()
                assert r.json()["error"]["code"] == "unavailable", r.text
            page = httpx.get(f"{base}/", timeout=60)
            assert page.status_code == 503 and page.headers["Retry-After"].isdigit(), page.text[:300]
            assert page.headers["content-type"].startswith("text/html")
            ready = httpx.get(f"{base}/readyz", timeout=60)
            assert ready.status_code == 503 and ready.json()["checks"]["redis"]["status"] == "failing", ready.text
        finally:
            stop_server(proc)
    log = (data / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]
