"""How `gridbid up` serves HTTP: the uvicorn settings it is started with."""

from __future__ import annotations

from django.conf import settings

from gridbid.runner import uvicorn_config
from market.streams.consumers import MAX_MESSAGE_BYTES


def test_the_server_keeps_idle_connections_longer_than_clients_and_proxies_do() -> None:
    # uvicorn's own 5 s equals httpx's pool expiry and is under nginx's and an ALB's 60 s:
    # the server closed idle connections as clients reused them (a clean-clone run's
    # 64-client test read httpx.ReadError)
    config = uvicorn_config(host="127.0.0.1", port=8000)
    assert config.timeout_keep_alive == settings.CONFIG.http_keepalive_seconds >= 61
    assert config.ws_max_size == MAX_MESSAGE_BYTES
