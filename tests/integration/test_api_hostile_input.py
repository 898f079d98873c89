"""Bodies too deep or too big for the REST API: refused in the error shape before they are
parsed, while deep-but-legal JSON still goes through. The same bodies against a real
server over real sockets: tests/e2e/test_hostile_input.py."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from market.api.parsers import MAX_JSON_DEPTH, json_too_deep
from tests.conftest import bid_body

pytestmark = pytest.mark.django_db


def nested(depth: int) -> object:
    value: object = "leaf"
    for level in range(depth):
        value = {"level": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize(("text", "deep"), [
    ("[" * 65 + "]" * 65, True),
    ("[" * 64 + "]" * 64, False),
    ('{"a": ' * 65 + "1" + "}" * 65, True),
    ("[" * 100_000, True),  # unterminated: still measured, not parsed
    ('["' + "[" * 1000 + '"]', False),  # brackets in a string do not count
    ('["\\"' + "[" * 1000 + '"]', False),  # nor after an escaped quote
    ("[" * 40 + "]" * 40 + "[" * 40 + "]" * 40, False),  # wide is not deep
    (json.dumps(nested(MAX_JSON_DEPTH)), False),
    (json.dumps(nested(MAX_JSON_DEPTH + 1)), True),
])
def test_json_depth_is_measured_on_the_text(text, deep):
    assert json_too_deep(text) is deep
    assert json_too_deep(text.encode()) is deep


def test_a_body_nested_100000_deep_gets_a_400_saying_the_limit(anon):
    r = anon.post("/api/v1/accounts/signup/", "[" * 100_000 + "]" * 100_000, content_type="application/json")
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "parse_error"
    assert error["message"] == f"JSON nested deeper than {MAX_JSON_DEPTH} levels; flatten it."


def test_a_bid_whose_job_spec_nests_20_deep_is_still_placed(buyer, client_for):
    body = bid_body(job_spec={"image": "ghcr.io/acme/train:1", "notes": nested(20)})
    r = client_for(buyer).post("/api/v1/bids/", json.dumps(body), content_type="application/json")
    assert r.status_code == 201, r.json()


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_a_json_body_over_the_size_limit_gets_a_413_saying_the_limit(anon):
    body = json.dumps({"username": "a" * 2000, "password": "a-long-enough-pass-1"})
    r = anon.post("/api/v1/accounts/signup/", body, content_type="application/json")
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "too_large"
    assert "1,000 bytes" in error["message"]


@pytest.mark.parametrize("host", ['d~o"!<!)', "evil.example.com"])
def test_a_host_header_the_server_does_not_answer_to_gets_the_api_error_shape(host: str) -> None:
    """The API fuzzer sent `host: d~o"!<!)`: Django refuses a Host outside ALLOWED_HOSTS before any
    view, and answered with its HTML 400 page; an API path answers in the API's error shape."""
    from django.test import Client

    got = Client().post("/api/v1/webhooks/", data="{}", content_type="application/json", HTTP_HOST=host)
    assert got.status_code == 400 and got["Content-Type"] == "application/json", got.content[:200]
    assert got.json()["error"]["code"] == "invalid" and "Host header" in got.json()["error"]["message"]
    page = Client().get("/markets/", HTTP_HOST=host)
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html"), "a page keeps Django's page"
