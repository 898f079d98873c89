"""A webhook receiver for the tests: an HTTP server on 127.0.0.1 in a thread (http.server),
and the signature check a receiver does (docs/webhooks.md)."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers the statuses it is given
    in turn (then 200)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answers: list[int] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    receiver.requests.append({"path": self.path, "headers": dict(self.headers), "body": body})
                    code = receiver.answers.pop(0) if receiver.answers else 200
                self.send_response(code)
                self.end_headers()
                self.wfile.write(b"receiver says no" if code >= 400 else b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/gridbid"

    def events(self) -> list[str]:
        return [r["headers"]["X-GridBid-Event"] for r in self.requests]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def verify(secret: str, request: dict[str, Any], *, tolerance_s: int = 300) -> dict[str, Any]:
    """What a receiver does (docs/webhooks.md): check the signature and its age, then parse."""
    parts = dict(p.split("=", 1) for p in request["headers"]["X-GridBid-Signature"].split(","))
    expected = hmac.new(secret.encode(), parts["t"].encode() + b"." + request["body"], hashlib.sha256).hexdigest()
    assert hmac.compare_digest(expected, parts["v1"]), "the signature does not match the body"
    assert abs(time.time() - int(parts["t"])) < tolerance_s
    return json.loads(request["body"])


def wait_for_events(receiver: Receiver, wanted: list[str], *, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with receiver.lock:
            got = receiver.events()
        if all(w in got for w in wanted):
            return got
        time.sleep(0.2)
    return receiver.events()
