"""The API's throttles key on the real client: X-Forwarded-For counts only from a proxy
in TRUSTED_PROXIES. tests/settings.py turns throttles off; these turn on the production
classes with a small anonymous rate."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from django.core.cache import cache
from django.test import override_settings
from django.utils.module_loading import import_string
from rest_framework.views import APIView

import gridbid.settings as production

pytestmark = pytest.mark.django_db

LIMIT = 5


@pytest.fixture
def throttled(settings, monkeypatch) -> Iterator[None]:
    classes = production.REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"]
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_CLASSES": classes,
                               "DEFAULT_THROTTLE_RATES": {"anon": f"{LIMIT}/minute", "user": "1000/minute"}}
    # APIView copies DEFAULT_THROTTLE_CLASSES when first imported (here: throttles off);
    # give it the production classes, as a server started with gridbid.settings has them
    monkeypatch.setattr(APIView, "throttle_classes", [import_string(c) for c in classes])
    cache.clear()
    yield
    cache.clear()


def statuses(anon, *, peer: str, forwarded: list[str]) -> list[int]:
    return [anon.get("/api/v1/markets/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR=f).status_code for f in forwarded]


def test_a_fresh_forwarded_address_per_request_does_not_escape_the_anonymous_limit(throttled, anon):
    got = statuses(anon, peer="203.0.113.9", forwarded=[f"198.51.100.{i}" for i in range(LIMIT + 3)])
    assert got == [200] * LIMIT + [429] * 3
    r = anon.get("/api/v1/markets/", REMOTE_ADDR="203.0.113.9", HTTP_X_FORWARDED_FOR="198.51.100.250")
    assert r.status_code == 429 and r.json()["error"]["code"] == "throttled"


def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_limit(throttled, anon):
    with override_settings(TRUSTED_PROXIES=("10.0.0.0/8",)):
        # two clients behind one proxy: each gets the whole limit
        assert statuses(anon, peer="10.1.2.3", forwarded=["198.51.100.1"] * LIMIT) == [200] * LIMIT
        assert statuses(anon, peer="10.1.2.3", forwarded=["198.51.100.2"] * LIMIT) == [200] * LIMIT
        assert statuses(anon, peer="10.1.2.3", forwarded=["198.51.100.1"]) == [429]
        # a client's own forged hop left of the proxy's is not believed
        forged = [f"192.0.2.{i}, 198.51.100.3" for i in range(LIMIT + 1)]
        assert statuses(anon, peer="10.1.2.3", forwarded=forged) == [200] * LIMIT + [429]


def test_the_client_address_peels_only_trusted_hops(settings):
    from gridbid.proxies import client_address

    settings.TRUSTED_PROXIES = ("10.0.0.0/8", "2001:db8::/32")
    assert client_address({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "1.2.3.4, 10.9.9.9"}) == "1.2.3.4"
    assert client_address({"REMOTE_ADDR": "2001:db8::1", "HTTP_X_FORWARDED_FOR": "5.6.7.8"}) == "5.6.7.8"
    assert client_address({"REMOTE_ADDR": "8.8.8.8", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}) == "8.8.8.8"
    assert client_address({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "not-an-ip"}) == "10.0.0.1"
    assert client_address({"REMOTE_ADDR": "10.0.0.1"}) == "10.0.0.1"
    settings.TRUSTED_PROXIES = ()
    assert client_address({"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": "1.2.3.4"}) == "10.0.0.1"


def test_a_bad_trusted_proxies_value_stops_start_up_with_its_name(tmp_path):
    from gridbid.config import ConfigError, load

    with pytest.raises(ConfigError, match="TRUSTED_PROXIES: 'proxy.local' is not an IP address or CIDR"):
        load({"GRIDBID_DATA_DIR": str(tmp_path), "TRUSTED_PROXIES": "10.0.0.1, proxy.local"})
    assert load({"GRIDBID_DATA_DIR": str(tmp_path), "TRUSTED_PROXIES": "10.0.0.1,192.168.0.0/16"}).trusted_proxies == ("10.0.0.1", "192.168.0.0/16")


def test_concurrent_requests_cannot_slip_past_the_limit_together(throttled, db):
    """DRF's throttle reads the history, then writes it back: requests that read at once all
    see room and all pass. The counter here is one atomic increment, so exactly LIMIT pass."""
    import threading

    from rest_framework.test import APIClient

    start = threading.Barrier(4 * LIMIT)
    got: list[int] = []

    def one() -> None:
        client = APIClient()
        start.wait(10)
        got.append(client.get("/api/v1/regions/", REMOTE_ADDR="203.0.113.77").status_code)

    threads = [threading.Thread(target=one) for _ in range(4 * LIMIT)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got) == [200] * LIMIT + [429] * (3 * LIMIT)


def test_a_throttle_keeps_one_small_counter_however_high_its_rate(throttled, anon, settings):
    """The history-list throttle kept one timestamp per request in the window: at the bench's
    10,000/second that list was pickled to and from Redis on every request."""
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"anon": "10000/second", "user": "10000/second"}}
    for _ in range(50):
        assert anon.get("/api/v1/regions/", REMOTE_ADDR="203.0.113.78").status_code == 200
    import pickle

    values = [pickle.loads(v) for v in cache._cache.values()]  # locmem: every entry this test wrote
    assert values and all(isinstance(v, int) for v in values), values


def test_the_limit_slides_across_a_window_boundary_and_retry_after_is_honest(throttled, anon, monkeypatch):
    """A client that spends its allowance at the end of one window does not get a fresh one
    the moment the next begins; after the Retry-After it was given, it gets in again."""
    from market.api import throttles

    clock = {"now": 6_000.0 * 60 + 50}  # 50 s into a minute window
    monkeypatch.setattr(throttles._WindowCounter, "timer", lambda self: clock["now"])
    ask = lambda: anon.get("/api/v1/regions/", REMOTE_ADDR="203.0.113.79")  # noqa: E731
    assert [ask().status_code for _ in range(LIMIT)] == [200] * LIMIT
    clock["now"] += 15  # 5 s into the next window: most of the last one still counts
    refused = ask()
    assert refused.status_code == 429
    wait = int(refused["Retry-After"])
    assert 1 <= wait <= 60
    clock["now"] += wait - 1
    assert ask().status_code == 429, "not before the time it was told"
    clock["now"] += 1.5
    assert ask().status_code == 200, "and in again once it has waited"


@pytest.mark.redis
def test_on_redis_the_counter_is_one_round_trip_and_holds_the_limit(throttled, anon, settings):
    """Production caches on Redis: the throttle pipelines its three commands, and what it
    writes is a plain integer that Django's own cache calls read back."""
    import redis as redis_lib

    from tests.conftest import service_missing

    client = redis_lib.Redis.from_url(settings.TEST_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis_lib.ConnectionError as exc:
        service_missing(f"Redis at {settings.TEST_REDIS_URL} is unreachable ({exc})")
    settings.CACHES = {"default": {"BACKEND": "gridbid.cache.RedisCache", "LOCATION": settings.TEST_REDIS_URL}}
    from django.core.cache import cache as redis_cache

    redis_cache.clear()
    before = client.info("commandstats")
    got = [anon.get("/api/v1/regions/", REMOTE_ADDR="203.0.113.80").status_code for _ in range(LIMIT + 2)]
    after = client.info("commandstats")
    assert got == [200] * LIMIT + [429] * 2
    calls = lambda name: after.get(f"cmdstat_{name}", {}).get("calls", 0) - before.get(f"cmdstat_{name}", {}).get("calls", 0)  # noqa: E731
    # each request: INCRBY + EXPIRE + GET in one pipeline; a refusal takes itself back out
    # with the cache's decr (EXISTS + INCRBY -1)
    assert (calls("incrby"), calls("expire")) == (LIMIT + 2 + 2, LIMIT + 2)
    assert calls("set") == 0 and calls("exists") == 2, "no read-modify-write of a history list"
    counters = [k for k in client.keys("*throttle:anon:203.0.113.80:*")]
    assert len(counters) == 1 and int(client.get(counters[0])) == LIMIT, "the refused requests were taken back out"
    redis_cache.clear()


def test_every_throttled_answer_says_the_limit_what_is_left_and_when_it_resets(throttled, anon, buyer, client_for):
    """RateLimit-* headers (IETF draft httpapi-ratelimit-headers) on every API answer a
    throttle counted, the 429 included; a bot paces itself on them instead of on refusals."""
    answers = [anon.get("/api/v1/markets/", REMOTE_ADDR="203.0.113.77") for _ in range(LIMIT + 1)]
    assert [r.status_code for r in answers] == [200] * LIMIT + [429]
    assert [r["RateLimit-Remaining"] for r in answers] == [str(LIMIT - 1 - i) for i in range(LIMIT)] + ["0"]
    for r in answers:
        assert r["RateLimit-Limit"] == str(LIMIT) and r["RateLimit-Policy"] == f"{LIMIT};w=60"
    assert all(1 <= int(r["RateLimit-Reset"]) <= 60 for r in answers[:-1]), "when the window moves on"
    # the refusal's wait: this window's full count must fade out of the sliding window too, so
    # refused in a window's first 60/LIMIT s it is past 60 s (the clean-clone run saw 64)
    assert 1 <= int(answers[-1]["RateLimit-Reset"]) <= 60 + math.ceil(60 / LIMIT)
    assert answers[-1]["RateLimit-Reset"] == answers[-1]["Retry-After"]
    mine = client_for(buyer).get("/api/v1/bids/")  # a token's own allowance: the user rate
    assert mine.status_code == 200 and mine["RateLimit-Limit"] == "1000" and mine["RateLimit-Remaining"] == "999"
