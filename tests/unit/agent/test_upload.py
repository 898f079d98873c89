"""Uploading a packed archive to the job's store: a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from providers.agent.inputs import UploadError, pack_checkpoint, upload_archive, upload_url


@pytest.fixture
def server() -> Iterator[tuple[str, dict[str, Any]]]:
    seen: dict[str, Any] = {"puts": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            seen["puts"] += 1
            body = self.rfile.read(int(self.headers["Content-Length"]))
            if self.path.startswith("/refuse"):
                self.send_response(403)
            else:
                seen[self.path] = (body, self.headers["X-Content-SHA256"])
                self.send_response(201)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()


def _archive(tmp_path: Path) -> dict[str, Any]:
    src = tmp_path / "out"
    src.mkdir()
    (src / "result.txt").write_text("42")
    packed = pack_checkpoint(src, tmp_path / "out.tar")
    assert packed is not None
    return packed


def test_an_archive_is_put_with_its_digest_and_its_url_becomes_the_store(tmp_path: Path, server: tuple[str, dict[str, Any]]) -> None:
    base, seen = server
    packed = _archive(tmp_path)
    url = upload_url(base + "/jobs/", 7, "outputs.tar")
    assert url == f"{base}/jobs/trade-7/outputs.tar"
    done = upload_archive(packed, url)
    body, digest = seen["/jobs/trade-7/outputs.tar"]
    assert done == {**packed, "url": url} and digest == packed["sha256"] == hashlib.sha256(body).hexdigest()


def test_a_refusing_store_or_a_non_http_url_is_an_upload_error_not_a_crash(tmp_path: Path, server: tuple[str, dict[str, Any]]) -> None:
    base, seen = server
    packed = _archive(tmp_path)
    with pytest.raises(UploadError, match="403"):
        upload_archive(packed, base + "/refuse/x.tar")
    assert seen["puts"] == 1, "a 4xx is not retried"
    with pytest.raises(UploadError, match="http or https"):
        upload_archive(packed, "ftp://store.example/x.tar")
