"""Structured logs: every request gets an id (the client's X-Request-ID when sane), answers
it, logs every line with it (one JSON object per line under LOG_FORMAT=json), and hands it
to the Celery tasks it enqueues."""

from __future__ import annotations

import io
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse

from gridbid import logs
from gridbid.celery import app
from gridbid.middleware import RequestIdMiddleware

probe_log = logging.getLogger("gridbid.tests.probe")
seen: list[tuple[str, str]] = []  # (message, request id) as the probe task saw them
seen_lock = threading.Lock()


@app.task(name="tests.request_logs.probe", ignore_result=True)
def probe(message: str) -> str:
    """A task that logs one line and notes the request id it ran under."""
    probe_log.warning("probe %s", message)
    with seen_lock:
        seen.append((message, logs.request_id.get()))
    return logs.request_id.get()


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    """The root logger's lines, formatted as LOG_FORMAT=json formats them."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RequestIdFilter())
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield buf
    finally:
        root.removeHandler(handler)


def parsed(buf: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in buf.getvalue().splitlines() if line.strip()]


def test_the_request_id_header_round_trips(client, db):
    r = client.get("/api/v1/markets/", HTTP_X_REQUEST_ID="lb-7f3a.01_x")
    assert r["X-Request-ID"] == "lb-7f3a.01_x"
    fresh = client.get("/api/v1/markets/")["X-Request-ID"]
    assert len(fresh) == 32 and fresh != client.get("/api/v1/markets/")["X-Request-ID"], "a new id per request"


@pytest.mark.parametrize("bad", ["", "x" * 65, "two words", "evil\r\nSet-Cookie: a=b", "ünïcode", "<script>", "a/b"])
def test_a_bad_request_id_is_replaced_not_echoed(client, db, bad):
    answered = client.get("/api/v1/markets/", HTTP_X_REQUEST_ID=bad)["X-Request-ID"]
    assert answered != bad and logs.request_id_sane(answered) and len(answered) == 32


def test_with_json_logs_a_requests_lines_parse_and_carry_its_id(buyer, client_for, json_lines):
    c = client_for(buyer)
    r = c.get("/api/v1/bids/999999/", HTTP_X_REQUEST_ID="req-404")
    assert r.status_code == 404 and r["X-Request-ID"] == "req-404"
    lines = parsed(json_lines)
    assert lines, "Django logs a 404 as a warning"
    for line in lines:
        assert set(line) >= {"time", "level", "logger", "message", "request_id"}
        assert line["time"].endswith("Z")
    (not_found,) = [x for x in lines if x["logger"] == "django.request"]
    assert not_found["request_id"] == "req-404" and not_found["level"] == "WARNING" and "/api/v1/bids/999999/" in not_found["message"]
    assert logs.request_id.get() == "", "the id does not outlive its request"


def test_a_traceback_stays_inside_one_json_line(json_lines):
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        logging.getLogger("gridbid.tests").exception("failed")
    (line,) = parsed(json_lines)
    assert line["message"] == "failed" and "ValueError: boom" in line["exception"] and line["request_id"] is None


def test_a_task_enqueued_with_the_id_in_its_headers_logs_with_it(json_lines):
    """The eager path (tests run tasks in-process): the id travels in the task's headers."""
    seen.clear()
    assert logs.request_id.get() == ""
    result = probe.apply_async(args=["eager"], headers={"request_id": "hdr-1"})
    assert result.get() == "hdr-1"
    assert [x["request_id"] for x in parsed(json_lines) if x["message"] == "probe eager"] == ["hdr-1"]
    assert logs.request_id.get() == "", "the task's id is not left behind"
    # a forged id in a header is not trusted either
    assert probe.apply_async(args=["forged"], headers={"request_id": "bad id\n"}).get() == ""


def test_a_task_run_eagerly_inside_a_request_logs_with_the_requests_id(db):
    seen.clear()

    def view(request: HttpRequest) -> HttpResponse:
        probe.delay("inline")
        return HttpResponse("ran")

    request = HttpRequest()
    request.META = {"HTTP_X_REQUEST_ID": "req-eager"}
    RequestIdMiddleware(view)(request).close()
    assert seen == [("inline", "req-eager")]


def test_a_task_enqueued_in_a_request_runs_on_a_worker_with_the_requests_id(settings):
    """Published through the broker to a real worker thread: before_task_publish puts the
    request's id in the message headers, task_prerun restores it in the worker."""
    from celery.contrib.testing.worker import start_worker

    seen.clear()

    def view(request: HttpRequest) -> HttpResponse:
        probe.apply_async(args=["published"])
        return HttpResponse("queued")

    request = HttpRequest()
    request.META = {"REMOTE_ADDR": "198.51.100.4", "HTTP_X_REQUEST_ID": "req-worker-9"}
    app.conf.task_always_eager = False
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=10):
            response = RequestIdMiddleware(view)(request)
            response.close()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not seen:
                time.sleep(0.05)
    finally:
        app.conf.task_always_eager = True
    assert response["X-Request-ID"] == "req-worker-9"
    assert seen == [("published", "req-worker-9")]
