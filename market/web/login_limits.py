"""Failed log-ins counted per account and per client address, with a cool-down.

Each password check costs about a second of CPU (PBKDF2), and nothing stopped a
guesser: 40 wrong passwords, then the right one, all went through. Now the log-in
pages (`/login/`, `/admin/login/`) refuse with 429 once an account, or an address,
has failed too often, and they refuse *before* the password is hashed. Counts live
in Django's cache (Redis in production, shared by every server process; in-memory
when embedded) and expire with the cool-down. A success clears the account's count
but not the address's, so one real account cannot launder guesses at others.
"""

from __future__ import annotations

import functools
import hashlib
import math
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from gridbid.proxies import client_address
from market.cache_counters import cache_count_up

ACCOUNT, ADDRESS = "account", "address"
REFUSAL = {
    ACCOUNT: "Too many failed log-ins for this account; try again in {wait}.",
    ADDRESS: "Too many failed log-ins from your address; try again in {wait}.",
}


def _limits() -> dict[str, int]:
    return {ACCOUNT: settings.LOGIN_FAILURES_PER_ACCOUNT, ADDRESS: settings.LOGIN_FAILURES_PER_ADDRESS}


def _key(kind: str, what: str, value: str) -> str:
    # hashed: a username may hold any character, and the cache key should not echo it
    return f"login-{what}:{kind}:{hashlib.sha256(value.encode()).hexdigest()[:40]}"


def _subjects(username: str, address: str | None) -> list[tuple[str, str]]:
    out = [(ACCOUNT, username.strip().casefold())]
    if address:
        out.append((ADDRESS, address))
    return out


def login_refusal(*, username: str, address: str | None) -> tuple[str, int] | None:
    """(message, seconds to wait) while the account or the address is cooling down."""
    now = time.time()
    for kind, value in _subjects(username, address):
        until = cache.get(_key(kind, "lock", value))
        if until is not None and until > now:
            seconds = math.ceil(until - now)
            minutes = math.ceil(seconds / 60)
            return REFUSAL[kind].format(wait=f"{minutes} minute{'s' if minutes != 1 else ''}"), seconds
    return None


def login_failure_record(*, username: str, address: str | None) -> None:
    cooldown = settings.LOGIN_COOLDOWN_SECONDS
    limits = _limits()
    for kind, value in _subjects(username, address):
        key = _key(kind, "fail", value)
        failures = cache_count_up(key, timeout=cooldown)
        if failures >= limits[kind]:
            cache.set(_key(kind, "lock", value), time.time() + cooldown, timeout=cooldown)
            cache.delete(key)


def login_success_record(*, username: str) -> None:
    cache.delete(_key(ACCOUNT, "fail", username.strip().casefold()))


def on_login_failed(sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any) -> None:
    address = client_address(request.META) if request is not None else None
    login_failure_record(username=str(credentials.get("username") or ""), address=address)


def on_logged_in(sender: Any, request: HttpRequest | None, user: Any, **kwargs: Any) -> None:
    login_success_record(username=user.get_username())


def login_guarded(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """A log-in view that answers 429 while the account or the address cools down,
    without calling the view (so without hashing the password)."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method == "POST":
            refusal = login_refusal(username=str(request.POST.get("username", "")), address=client_address(request.META))
            if refusal is not None:
                message, seconds = refusal
                response = render(request, "market/login_locked.html", {"message": message}, status=429)
                response["Retry-After"] = str(seconds)
                return response
        return view(request, *args, **kwargs)

    return guarded
