"""A counter in Django's cache: one atomic increment, created on first use, expiring with
its timeout. Stream sequence numbers, failed log-ins and (off Redis) the throttles count
with it."""

from __future__ import annotations

from django.core.cache import cache


def cache_count_up(key: str, *, timeout: float, start: int = 0) -> int:
    """Add one to the counter at `key` (`start` when absent); its new value."""
    cache.add(key, start, timeout)
    try:
        return int(cache.incr(key))
    except ValueError:  # the key expired, or was evicted, between the add and the incr
        cache.set(key, start + 1, timeout)
        return start + 1
