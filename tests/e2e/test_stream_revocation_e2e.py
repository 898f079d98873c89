"""Revocation reaches an open WebSocket in the production mode: PostgreSQL, the Redis
channel layer, and two `gridbid up` processes. The socket is open on one server; the
token is revoked over REST on the other; the group message crosses Redis and the
socket closes with 4001 (docs/stream.md), over real TCP."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.test_production_mode import _manage_shell, production_env  # noqa: F401 - the module's fixture, shared

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _stream(base: str, token: str) -> ClientConnection:
    return connect(base.replace("http://", "ws://") + "/ws/v1/stream", additional_headers={"Authorization": f"Bearer {token}"},
                   open_timeout=10, close_timeout=2)


def _closed_with(ws: ClientConnection) -> tuple[dict[str, object], int | None]:
    """The socket's last message and its close code."""
    last = json.loads(ws.recv(timeout=30))
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(timeout=30)
    return last, closed.value.rcvd.code if closed.value.rcvd is not None else None


def test_a_token_revoked_on_one_server_closes_its_socket_on_another_with_4001(production_env, tmp_path):  # noqa: F811
    env = production_env
    data = Path(env["GRIDBID_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)
    logs_a, logs_b = tmp_path / "a", tmp_path / "b"
    logs_a.mkdir()
    logs_b.mkdir()
    code = (
        "from market import services\n"
        "u = services.user_signup(username='revoked-bot', password='correct-horse-battery-staple', role='buyer')\n"
        "t, raw = services.token_create(user=u, name='bot', scopes=['read', 'trade'])\n"
        "print('BOT', t.pk, raw)\n"
        "print('ADMIN', services.token_create(user=u, name='admin', scopes=['read', 'trade', 'tokens'])[1])\n"
    )
    out = _manage_shell(env, code).splitlines()
    bot_id, bot = next(line.split()[1:] for line in out if line.startswith("BOT "))
    admin = next(line.split()[1] for line in out if line.startswith("ADMIN "))
    # the log goes to its own folder; both servers share the data folder through GRIDBID_DATA_DIR
    proc_a, base_a, _ = start_server(logs_a, demo=False, extra_env=env, up_args=("--no-worker",))
    try:
        proc_b, base_b, _ = start_server(logs_b, demo=False, extra_env=env, up_args=("--no-worker",))
        try:
            with _stream(base_a, bot) as ws:
                assert json.loads(ws.recv(timeout=30))["user"] == "revoked-bot"
                ws.send(json.dumps({"type": "subscribe", "channel": "orders"}))
                assert json.loads(ws.recv(timeout=30))["type"] == "snapshot"
                revoke = httpx.post(f"{base_b}/api/v1/tokens/{bot_id}/revoke/", headers={"Authorization": f"Bearer {admin}"}, timeout=30)
                assert revoke.status_code == 200, revoke.text
                last, code_ = _closed_with(ws)
            assert last["code"] == "not_authenticated" and "revoked" in str(last["message"]), last
            assert code_ == 4001
            assert httpx.get(f"{base_a}/api/v1/me/", headers={"Authorization": f"Bearer {bot}"}, timeout=30).status_code == 401
            with _stream(base_a, bot) as again:
                last, code_ = _closed_with(again)
            assert last["code"] == "not_authenticated" and code_ == 4001
        finally:
            stop_server(proc_b)
    finally:
        stop_server(proc_a)
    for folder in (logs_a, logs_b):
        log = (folder / "server.log").read_text()
        assert "Traceback" not in log, log[-3000:]
