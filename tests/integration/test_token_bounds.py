"""A token hands on no more than it has (issue 27, items 5 and 6): a token it makes expires no
later than it, and it revokes only tokens whose every scope it holds. A browser session is
bound by neither."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from market.models import ApiToken
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def session_of(user) -> APIClient:
    client = APIClient()
    assert client.login(username=user.username, password=PASSWORD)
    return client


# --- a child token expires no later than its parent ------------------------------------------------
def test_a_token_made_by_an_expiring_token_expires_with_it(buyer, client_for):
    parent = client_for(buyer, ["read", "tokens"])
    ends = timezone.now() + timedelta(seconds=60)
    ApiToken.objects.filter(user=buyer).update(expires_at=ends)
    r = parent.post("/api/v1/tokens/", {"name": "child", "scopes": ["read"]}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["expires_at"] is not None
    assert ApiToken.objects.get(pk=r.json()["id"]).expires_at == ends


def test_a_token_cannot_make_one_that_outlives_it(buyer, client_for):
    parent = client_for(buyer, ["read", "tokens"])
    ends = timezone.now() + timedelta(seconds=60)
    ApiToken.objects.filter(user=buyer).update(expires_at=ends)
    later = (ends + timedelta(days=1)).isoformat()
    r = parent.post("/api/v1/tokens/", {"name": "child", "scopes": ["read"], "expires_at": later}, format="json")
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert "expires_at" in error["fields"] and ends.isoformat()[:19] in error["message"]
    assert not ApiToken.objects.filter(name="child").exists()
    sooner = (ends - timedelta(seconds=30)).isoformat()
    ok = parent.post("/api/v1/tokens/", {"name": "child", "scopes": ["read"], "expires_at": sooner}, format="json")
    assert ok.status_code == 201, ok.content


def test_a_token_made_by_a_token_that_never_expires_may_never_expire(buyer, client_for):
    r = client_for(buyer, ["read", "tokens"]).post("/api/v1/tokens/", {"name": "child", "scopes": ["read"]}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["expires_at"] is None


def test_a_browser_session_makes_tokens_that_never_expire(buyer):
    r = session_of(buyer).post("/api/v1/tokens/", {"name": "forever", "scopes": ["read"]}, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["expires_at"] is None


# --- revoking needs every scope of the token revoked ----------------------------------------------
def test_a_weaker_token_cannot_revoke_a_stronger_one(buyer, client_for):
    strong = client_for(buyer, ["read", "trade", "tokens"])
    strong_id = ApiToken.objects.filter(user=buyer).latest("id").id
    weak = client_for(buyer, ["read", "tokens"])
    r = weak.post(f"/api/v1/tokens/{strong_id}/revoke/")
    assert r.status_code == 403, r.content
    assert "trade" in r.json()["error"]["message"]
    assert ApiToken.objects.get(pk=strong_id).revoked_at is None
    assert strong.get("/api/v1/bids/").status_code == 200


def test_a_token_revokes_one_whose_scopes_it_holds_and_itself(buyer, client_for):
    client_for(buyer, ["read", "tokens"])
    peer_id = ApiToken.objects.filter(user=buyer).latest("id").id
    strong = client_for(buyer, ["read", "trade", "tokens"])
    strong_id = ApiToken.objects.filter(user=buyer).latest("id").id
    assert strong.post(f"/api/v1/tokens/{peer_id}/revoke/").status_code == 200
    assert strong.post(f"/api/v1/tokens/{strong_id}/revoke/").status_code == 200


def test_a_browser_session_revokes_any_of_its_tokens(buyer, client_for):
    client_for(buyer, ["read", "trade", "tokens"])
    token_id = ApiToken.objects.filter(user=buyer).latest("id").id
    assert session_of(buyer).post(f"/api/v1/tokens/{token_id}/revoke/").status_code == 200
