"""The API's anonymous and per-user throttles: keyed by the real client address, counted
with one atomic increment per request.

DRF's own `get_ident` believes any `X-Forwarded-For`; these ask
`gridbid.proxies.client_address`, which believes it only from TRUSTED_PROXIES.

DRF's `SimpleRateThrottle` keeps every request's timestamp in the window as one cached
list, read and written back whole on each request: its cost grows with the rate (at
10,000/second the list was pickled to and from Redis every time), and two requests that
read at once both see room. Here each (client, window) has one integer that
`cache.incr` raises atomically, and the window slides: the previous window's count,
weighted by how much of it still overlaps the last `duration` seconds, is added to this
one's (the sliding-window counter). A request costs three small cache calls at any
rate; a refused one is taken back out, so waiting as told is enough to get in again.
"""

from __future__ import annotations

import math
from typing import Any

from django.core.cache import DEFAULT_CACHE_ALIAS, cache, caches
from django.core.cache.backends.redis import RedisCache
from django.core.exceptions import ImproperlyConfigured
from rest_framework import throttling
from rest_framework.settings import api_settings

from gridbid.proxies import client_address
from market.cache_counters import cache_count_up


class _WindowCounter(throttling.SimpleRateThrottle):
    scope: str

    def get_ident(self, request: Any) -> str:
        return client_address(request.META)

    def get_rate(self) -> str | None:
        # read at call time (DRF reads it at import), so a settings override takes effect
        try:
            return api_settings.DEFAULT_THROTTLE_RATES[self.scope]
        except KeyError:
            raise ImproperlyConfigured(f"No throttle rate for scope {self.scope!r} in DEFAULT_THROTTLE_RATES.") from None

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        now = self.timer()
        window, into = divmod(now, self.duration)
        current, previous = f"{key}:{int(window)}", f"{key}:{int(window) - 1}"
        count, before = self._count(current, previous)
        overlap = 1.0 - into / self.duration
        used = before * overlap + count
        if used <= self.num_requests:
            self._tell(request, remaining=int(self.num_requests - used), reset_s=self.duration - into)
            return True
        self.cache.decr(current)  # a refused request does not use up the allowance
        # when will the next request fit? the previous window's weight falls as time passes
        room = self.num_requests - count
        if room >= 0 and before:
            self.wait_s = (1.0 - room / before) * self.duration - into
        else:  # this window alone is full: wait until it is the previous one and has faded enough
            carried = count - 1
            self.wait_s = self.duration - into + (1.0 - (self.num_requests - 1) / carried) * self.duration if carried else self.duration - into
        self._tell(request, remaining=0, reset_s=self.wait())
        return False

    def _tell(self, request: Any, *, remaining: int, reset_s: float) -> None:
        """What the response's RateLimit-* headers say (gridbid.middleware.RateLimitHeadersMiddleware
        writes them): the allowance, what is left of it, and in how many seconds the window
        moves on (when refused: when the next request fits)."""
        http_request = getattr(request, "_request", request)
        http_request.rate_limit = (self.num_requests, max(0, remaining), max(1, math.ceil(reset_s)), int(self.duration), self.scope)

    def _count(self, current: str, previous: str) -> tuple[int, int]:
        """Raise this window's counter; (its new value, the previous window's count)."""
        ttl = 2 * int(self.duration) + 1
        backend = caches[DEFAULT_CACHE_ALIAS] if self.cache is cache else self.cache  # the proxy's backend
        if isinstance(backend, RedisCache):
            # one round trip instead of Django's four (add, exists + incr, get): on Redis this
            # was half of what an anonymous /markets/ request cost. Django stores an int as a
            # plain Redis integer, so INCR and the cache's own get/incr read the same value.
            keys = [backend.make_and_validate_key(k) for k in (current, previous)]
            pipe = backend._cache.get_client(keys[0], write=True).pipeline(transaction=False)
            pipe.incr(keys[0])
            pipe.expire(keys[0], ttl)
            pipe.get(keys[1])
            count, _, before = pipe.execute()
            return int(count), int(before or 0)
        return cache_count_up(current, timeout=ttl), int(self.cache.get(previous) or 0)

    def wait(self) -> float | None:
        return max(1.0, getattr(self, "wait_s", float(self.duration)))


class AnonRateThrottle(_WindowCounter):
    scope = "anon"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None  # the user throttle counts them
        return f"throttle:anon:{self.get_ident(request)}"


class UserRateThrottle(_WindowCounter):
    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        if not (request.user and request.user.is_authenticated):
            return None  # the anonymous throttle counts them, at its own, lower rate
        return f"throttle:user:{request.user.pk}"
