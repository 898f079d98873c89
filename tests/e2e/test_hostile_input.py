"""Hostile input against a real `gridbid up` server over real sockets: bodies and frames
nested 100,000 deep, bodies and frames too big. Each must get a clear refusal, and the
server must answer the next request (in the embedded mode one crash takes HTTP,
WebSocket, the worker and beat down together)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.e2e.conftest import running_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

DEEP = "[" * 100_000 + "]" * 100_000  # 200 KB; segfaulted the server before the depth bound


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    with running_server(tmp_path_factory.mktemp("hostile"), demo=False) as (base, env):
        yield base, env


def assert_alive(base: str) -> None:
    """The server still answers, over HTTP and WebSocket."""
    assert httpx.get(f"{base}/healthz", timeout=10).status_code == 200
    with connect(base.replace("http://", "ws://") + "/ws/v1/stream", open_timeout=10, close_timeout=2) as ws:
        assert '"welcome"' in ws.recv(timeout=10)
        ws.send('{"type": "ping", "ref": 1}')
        assert '"pong"' in ws.recv(timeout=10)


def provider_token(env: dict[str, str]) -> str:
    code = ("from market import services\n"
            "u = services.user_signup(username='deep-provider', password='correct-horse-battery-staple', role='provider')\n"
            "print('TOKEN', services.token_create(user=u, name='e2e', scopes=['provide'])[1])\n")
    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("TOKEN "))


def assert_refused_by_the_protocol_layer(ws: ClientConnection) -> None:
    """Closed with 1009 by uvicorn as the frame arrived, not buffered whole and refused by
    the consumer (which says "message_too_big" first)."""
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value


def assert_too_deep(response: httpx.Response) -> None:
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "parse_error"
    assert "nested deeper than 64 levels" in error["message"]


def test_a_body_nested_100000_deep_on_signup_gets_a_400_and_the_server_lives_on(server):
    base, _env = server
    response = httpx.post(f"{base}/api/v1/accounts/signup/", content=DEEP, headers={"Content-Type": "application/json"}, timeout=30)
    assert_too_deep(response)
    assert_alive(base)


def test_a_body_nested_100000_deep_on_an_agent_endpoint_gets_a_400_and_the_server_lives_on(server):
    base, env = server
    token = provider_token(env)
    response = httpx.post(f"{base}/api/v1/agent/machines/1/heartbeat/", content=DEEP, timeout=30,
                          headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    assert_too_deep(response)
    assert_alive(base)


def test_a_frame_nested_100000_deep_closes_the_socket_and_the_server_lives_on(server):
    base, _env = server
    with connect(base.replace("http://", "ws://") + "/ws/v1/stream", open_timeout=10, close_timeout=2, max_size=None) as ws:
        ws.recv(timeout=10)
        ws.send(DEEP)
        assert_refused_by_the_protocol_layer(ws)
    assert_alive(base)


def test_a_frame_nested_30000_deep_under_the_size_limit_is_refused_in_words(server):
    base, _env = server
    with connect(base.replace("http://", "ws://") + "/ws/v1/stream", open_timeout=10, close_timeout=2) as ws:
        ws.recv(timeout=10)
        ws.send("[" * 30_000 + "]" * 30_000)
        reply = ws.recv(timeout=10)
        assert '"parse_error"' in reply and "nested deeper than 64 levels" in reply
        ws.send('{"type": "ping", "ref": 2}')  # the connection is still usable
        assert '"pong"' in ws.recv(timeout=10)
    assert_alive(base)


def test_a_10_mb_body_gets_a_413_in_the_error_shape_and_the_server_lives_on(server):
    base, _env = server
    body = b'{"username": "' + b"a" * (10 * 1024 * 1024) + b'"}'
    response = httpx.post(f"{base}/api/v1/accounts/signup/", content=body, headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "too_large" and "bytes" in error["message"]
    assert_alive(base)


def test_a_10_mb_chunked_body_without_a_length_gets_a_413_too(server):
    base, _env = server

    def chunks() -> Iterator[bytes]:
        for _ in range(10):
            yield b"a" * (1024 * 1024)

    response = httpx.post(f"{base}/api/v1/accounts/signup/", content=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text[:300]
    assert response.json()["error"]["code"] == "too_large"
    assert_alive(base)


def test_a_web_page_over_the_limit_gets_a_413_page(server):
    base, _env = server
    response = httpx.post(f"{base}/login/", content=b"a" * (10 * 1024 * 1024), headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=30)
    assert response.status_code == 413
    assert_alive(base)


def test_a_1_mib_frame_is_refused_by_the_protocol_layer_with_1009(server):
    base, _env = server
    with connect(base.replace("http://", "ws://") + "/ws/v1/stream", open_timeout=10, close_timeout=2, max_size=None) as ws:
        ws.recv(timeout=10)
        ws.send("x" * (1024 * 1024))
        assert_refused_by_the_protocol_layer(ws)
    assert_alive(base)


def handshake_status(base: str, origin: str) -> int:
    try:
        with connect(base.replace("http://", "ws://") + "/ws/v1/stream", origin=origin, open_timeout=10, close_timeout=2):
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


def test_a_page_on_another_port_of_the_same_host_cannot_open_the_stream(server):
    base, _env = server
    port = int(base.rsplit(":", 1)[1])
    assert handshake_status(base, f"http://127.0.0.1:{port + 1}") == 403
    assert handshake_status(base, f"https://127.0.0.1:{port}") == 403
    assert handshake_status(base, base) == 101
