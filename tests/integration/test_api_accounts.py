"""Accounts and tokens through the REST API: sign-up, scopes, hashing, revocation."""

from __future__ import annotations

import pytest

from market.models import ApiToken

pytestmark = pytest.mark.django_db


def test_signup_creates_a_buyer_and_refuses_a_taken_username(anon):
    body = {"username": "alice", "password": "a-long-enough-pass-1", "role": "buyer"}
    first = anon.post("/api/v1/accounts/signup/", body, format="json")
    assert first.status_code == 201
    assert first.json()["role"] == "buyer"
    again = anon.post("/api/v1/accounts/signup/", body, format="json")
    assert again.status_code == 409
    assert again.json()["error"]["fields"]["username"]


def test_signup_rejects_a_weak_password_with_a_field_message(anon):
    r = anon.post("/api/v1/accounts/signup/", {"username": "bob", "password": "123"}, format="json")
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid"
    assert "password" in err["fields"]


def test_signup_cannot_make_an_operator(anon):
    r = anon.post("/api/v1/accounts/signup/", {"username": "eve", "password": "a-long-enough-pass-1", "role": "operator"}, format="json")
    assert r.status_code == 400
    assert "role" in r.json()["error"]["fields"]


def test_request_without_a_token_gets_401_in_the_error_format(anon):
    r = anon.get("/api/v1/bids/")
    assert r.status_code == 401
    assert r.json()["error"]["code"] == "not_authenticated"


def test_malformed_and_unknown_tokens_are_refused_with_a_reason(anon):
    anon.credentials(HTTP_AUTHORIZATION="Bearer nope")
    r = anon.get("/api/v1/bids/")
    assert r.status_code == 401
    assert "gb_" in r.json()["error"]["message"]
    anon.credentials(HTTP_AUTHORIZATION="Bearer gb_deadbeef_notatoken")
    assert anon.get("/api/v1/bids/").status_code == 401


def test_token_is_shown_once_and_stored_only_as_a_hash(buyer, client_for):
    client = client_for(buyer, ["read", "trade", "tokens"])
    r = client.post("/api/v1/tokens/", {"name": "bot", "scopes": ["read", "trade"]}, format="json")
    assert r.status_code == 201
    raw = r.json()["token"]
    assert raw.startswith("gb_")
    row = ApiToken.objects.get(pk=r.json()["id"])
    assert raw not in (row.digest, row.prefix) and len(row.digest) == 64
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert all("token" not in t for t in listed)


def test_a_revoked_token_stops_working(buyer, client_for):
    client = client_for(buyer)
    token_id = ApiToken.objects.filter(user=buyer).latest("id").id
    assert client.post(f"/api/v1/tokens/{token_id}/revoke/").status_code == 200
    r = client.get("/api/v1/bids/")
    assert r.status_code == 401
    assert "revoked" in r.json()["error"]["message"]


def test_a_read_only_token_cannot_place_bids(buyer, client_for):
    from tests.conftest import bid_body

    client = client_for(buyer, ["read"])
    r = client.post("/api/v1/bids/", bid_body(), format="json")
    assert r.status_code == 403
    assert "trade" in r.json()["error"]["message"]


def test_a_buyer_cannot_mint_a_provide_scope(buyer, client_for):
    client = client_for(buyer)
    r = client.post("/api/v1/tokens/", {"name": "x", "scopes": ["provide"]}, format="json")
    assert r.status_code == 403
    assert "scopes" in r.json()["error"]["fields"]


def test_unknown_api_path_answers_json_404(anon):
    r = anon.get("/api/v1/nothing-here/")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
