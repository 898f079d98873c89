"""Token management against a hostile token holder: a token mints only tokens with a subset
of its own scopes, managing tokens needs the `tokens` scope, and a replayed create never
hands the secret out again nor keeps it in the replay record."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from market.models import ApiToken, IdempotencyRecord

pytestmark = pytest.mark.django_db


def test_a_read_token_cannot_mint_a_trade_token(buyer, client_for):
    client = client_for(buyer, ["read"])
    r = client.post("/api/v1/tokens/", {"name": "bot", "scopes": ["read", "trade"]}, format="json")
    assert r.status_code == 403
    assert "'tokens' scope" in r.json()["error"]["message"]
    assert ApiToken.objects.filter(user=buyer, name="bot").count() == 0


def test_a_read_token_cannot_revoke_the_users_other_tokens(buyer, client_for):
    main = client_for(buyer)
    main_id = ApiToken.objects.filter(user=buyer).latest("id").id
    snoop = client_for(buyer, ["read"])
    r = snoop.post(f"/api/v1/tokens/{main_id}/revoke/")
    assert r.status_code == 403
    assert "'tokens' scope" in r.json()["error"]["message"]
    assert ApiToken.objects.get(pk=main_id).revoked_at is None
    assert main.get("/api/v1/bids/").status_code == 200


def test_an_operators_read_token_cannot_mint_operate(operator, client_for):
    client = client_for(operator, ["read"])
    r = client.post("/api/v1/tokens/", {"name": "root", "scopes": ["operate"]}, format="json")
    assert r.status_code == 403
    assert not ApiToken.objects.filter(user=operator, scopes__contains=["operate"], name="root").exists()


def test_a_token_manager_mints_only_a_subset_of_its_own_scopes(operator, client_for):
    client = client_for(operator, ["read", "tokens"])
    wider = client.post("/api/v1/tokens/", {"name": "root", "scopes": ["read", "operate"]}, format="json")
    assert wider.status_code == 403
    err = wider.json()["error"]
    assert "operate" in err["message"] and "scopes" in err["fields"]
    narrower = client.post("/api/v1/tokens/", {"name": "reader", "scopes": ["read"]}, format="json")
    assert narrower.status_code == 201, narrower.content
    assert narrower.json()["scopes"] == ["read"]


def test_a_token_manager_can_revoke_and_list(buyer, client_for):
    client_for(buyer, ["read"])
    victim = ApiToken.objects.filter(user=buyer).latest("id")
    manager = client_for(buyer, ["read", "tokens"])
    assert manager.post(f"/api/v1/tokens/{victim.id}/revoke/").status_code == 200
    assert len(manager.get("/api/v1/tokens/").json()["results"]) == 2


def test_a_browser_session_manages_tokens_within_its_role(buyer):
    from rest_framework.test import APIClient

    from tests.conftest import PASSWORD

    session = APIClient(enforce_csrf_checks=False)
    assert session.login(username=buyer.username, password=PASSWORD)
    ok = session.post("/api/v1/tokens/", {"name": "bot", "scopes": ["read", "trade", "tokens"]}, format="json")
    assert ok.status_code == 201, ok.content
    assert session.post("/api/v1/tokens/", {"name": "x", "scopes": ["provide"]}, format="json").status_code == 403


def test_a_token_created_with_an_idempotency_key_is_not_kept_or_replayed(buyer, client_for):
    client = client_for(buyer, ["read", "trade", "tokens"])
    body = {"name": "bot", "scopes": ["read"]}
    first = client.post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == 201
    raw = first.json()["token"]
    secret = raw.split("_", 2)[2]  # gb_<prefix>_<secret>: a secret may hold "_" itself (URL-safe base64)
    stored = list(IdempotencyRecord.objects.values_list("body", flat=True))
    assert stored and all(secret not in repr(b) and raw not in repr(b) for b in stored)
    again = client.post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert again.status_code == 200
    assert again["Idempotent-Replayed"] == "true"
    replay = again.json()
    assert raw not in again.content.decode() and "token" not in replay
    assert replay["id"] == first.json()["id"] and "shown only once" in replay["note"]
    assert ApiToken.objects.filter(user=buyer, name="bot").count() == 1


def test_a_token_that_expires_in_the_past_is_refused(buyer, client_for):
    client = client_for(buyer, ["read", "tokens"])
    past = (timezone.now() - timedelta(minutes=1)).isoformat()
    r = client.post("/api/v1/tokens/", {"name": "old", "scopes": ["read"], "expires_at": past}, format="json")
    assert r.status_code == 400
    assert "expires_at" in r.json()["error"]["fields"]
    assert not ApiToken.objects.filter(name="old").exists()


def test_offering_on_another_providers_machine_looks_like_a_missing_machine(provider_user, other_provider_user, make_machine, client_for):
    theirs = make_machine(other_provider_user)
    mine = client_for(provider_user)
    body = {"gpu_model": "H100-SXM-80GB", "gpus": 1, "price": 2_000_000}
    other = mine.post("/api/v1/offers/", body | {"machine": theirs.id}, format="json")
    missing = mine.post("/api/v1/offers/", body | {"machine": 999_999}, format="json")
    assert other.status_code == missing.status_code == 400
    assert other.json()["error"]["fields"]["machine"] == [m.replace("999999", str(theirs.id)) for m in missing.json()["error"]["fields"]["machine"]]


def test_signing_up_over_the_api_makes_the_account_but_no_browser_session(anon):
    """The API sign-up is for scripts: it sets no session cookie (a cross-site form post must
    not be able to sign a browser into an account someone else chose). The browser signs up
    and is signed in by the /signup/ page."""
    r = anon.post("/api/v1/accounts/signup/", {"username": "carol", "password": "a-long-enough-pass-1"}, format="json")
    assert r.status_code == 201
    assert "sessionid" not in r.cookies
    assert anon.get("/api/v1/me/").status_code == 401


def test_the_signup_endpoint_documents_that_it_does_not_sign_in(anon):
    schema = anon.get("/api/schema/", HTTP_ACCEPT="application/json").json()
    text = schema["paths"]["/api/v1/accounts/signup/"]["post"]["description"]
    assert "does not sign" in text and "/signup/" in text


def test_a_replay_of_a_record_kept_before_redaction_does_not_hand_out_the_token(buyer, client_for):
    """Rows written by the old code (kept up to 24 h) hold the plaintext; a replay strips it."""
    client = client_for(buyer, ["read", "tokens"])
    body = {"name": "old-bot", "scopes": ["read"]}
    first = client.post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="legacy")
    record = IdempotencyRecord.objects.get(user=buyer, key="legacy")
    record.status_code, record.body = 201, first.json()  # as the old code stored it
    record.save()
    again = client.post("/api/v1/tokens/", body, format="json", HTTP_IDEMPOTENCY_KEY="legacy")
    assert again.status_code == 200 and "token" not in again.json()
    assert first.json()["token"] not in again.content.decode()
