"""Redis gone at runtime (the cache behind the throttles, the markets list and the log-in
limits): requests answer 503 with Retry-After, in the API's error shape or as a page, not
500 server_error. Redis here is a redis-server of the test's own, stopped mid-test."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils.module_loading import import_string
from rest_framework.views import APIView

from gridbid import settings as production
from tests.integration.helpers import own_redis

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_stops(settings: Any, monkeypatch: Any, tmp_path: Any) -> Iterator[Any]:
    """The cache on a Redis of this test's own, used as production uses it (the API's
    throttles on, the markets list cached); calling the fixture's value stops that Redis."""
    classes = production.REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": classes}
    # APIView copied the test settings' classes (none) when first imported
    monkeypatch.setattr(APIView, "throttle_classes", [import_string(c) for c in classes])
    settings.GRIDBID = {**settings.GRIDBID, "MARKETS_CACHE_SECONDS": production.GRIDBID["MARKETS_CACHE_SECONDS"]}
    with own_redis(tmp_path) as (proc, url):
        settings.CACHES = {"default": {"BACKEND": "gridbid.cache.RedisCache", "LOCATION": url}}

        def stop() -> None:
            proc.terminate()
            proc.wait(timeout=10)

        yield stop


def _says_retry(r: Any) -> None:
    assert r.status_code == 503, r.content[:300]
    assert r["Retry-After"].isdigit() and int(r["Retry-After"]) > 0


def test_api_requests_answer_503_with_retry_after_while_redis_is_down(redis_stops, anon, client_for, buyer):
    api = client_for(buyer)
    assert anon.get("/api/v1/markets/").status_code == 200
    assert api.get("/api/v1/me/").status_code == 200
    redis_stops()
    for r in (anon.get("/api/v1/markets/"), api.get("/api/v1/me/"), api.post("/api/v1/bids/", {"gpus": 1}, format="json")):
        _says_retry(r)
        error = r.json()["error"]
        assert error["code"] == "unavailable" and "retry" in error["message"].lower(), error
        assert set(error) >= {"code", "message", "fields"}


def test_pages_answer_a_503_page_while_redis_is_down(redis_stops, client):
    assert client.get("/").status_code == 200
    redis_stops()
    r = client.get("/")
    _says_retry(r)
    assert r["Content-Type"].startswith("text/html")
    assert b"503" in r.content and b"try again" in r.content.lower()
