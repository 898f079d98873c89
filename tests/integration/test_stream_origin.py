"""The WebSocket Origin check compares the whole origin - scheme, host and port - with the
server's own, as Django's CSRF check does for forms: another port on the same host is
another site (another app, or an attacker's page on a dev box), and so is https against
http. CSRF_TRUSTED_ORIGINS lists the exceptions, wildcards included."""

from __future__ import annotations

import pytest
from channels.testing import WebsocketCommunicator
from django.test import override_settings

from gridbid.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

HOST = "127.0.0.1:8000"


async def connects(origin: str | None, *, host: str = HOST, scheme: str = "ws") -> bool:
    headers = [(b"host", host.encode())] + ([(b"origin", origin.encode())] if origin is not None else [])
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=headers)
    comm.scope["scheme"] = scheme
    connected, _ = await comm.connect(timeout=5)
    await comm.disconnect()
    return connected


async def test_the_servers_own_origin_is_accepted():
    assert await connects(f"http://{HOST}")


async def test_a_client_without_an_origin_is_accepted():  # bots authenticate with tokens, not cookies
    assert await connects(None)


@pytest.mark.parametrize("origin", [
    "http://127.0.0.1:9999",  # same host, another port
    "https://127.0.0.1:8000",  # same host and port, another scheme
    "http://127.0.0.1",  # port left out
    "http://localhost:8000",  # another host name, allowed in ALLOWED_HOSTS though
    "null",  # a sandboxed frame or a file: page
])
async def test_another_origin_on_an_allowed_host_is_refused(origin):
    assert not await connects(origin)


async def test_https_is_the_servers_origin_behind_tls():
    assert await connects(f"https://{HOST}", scheme="wss")
    assert not await connects(f"http://{HOST}", scheme="wss")


async def test_a_host_outside_allowed_hosts_is_refused_even_when_origin_matches_it():
    assert not await connects("http://evil.example:8000", host="evil.example:8000")


@override_settings(CSRF_TRUSTED_ORIGINS=["http://127.0.0.1:9999", "https://*.example.com"])
async def test_origins_listed_in_csrf_trusted_origins_are_accepted():
    assert await connects("http://127.0.0.1:9999")
    assert await connects("https://app.example.com")
    assert not await connects("http://app.example.com")  # the scheme of a wildcard entry still counts
    assert not await connects("https://example.org")
