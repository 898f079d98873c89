"""The audit log: each security-relevant action leaves exactly one record with who did it,
from where and to what; users read their own, operators everyone's; nothing edits or
deletes a record, and no record holds a secret."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection, transaction
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import PASSWORD, bid_body

ADDRESS = "203.0.113.7"


def api(user: Any, client_for: Any, scopes: list[str] | None = None) -> APIClient:
    """An API client of ``user`` calling from ADDRESS."""
    c = client_for(user, scopes)
    c.defaults["REMOTE_ADDR"] = ADDRESS
    return c


def events(action: str) -> list[Any]:
    from market.models import AuditEvent

    return list(AuditEvent.objects.filter(action=action).order_by("id"))


def only(action: str) -> Any:
    found = events(action)
    assert len(found) == 1, f"{action}: {len(found)} records, expected exactly one"
    return found[0]


# --- each action, once, with its actor, address and object -----------------------------------
def test_a_web_login_and_a_failed_one_are_recorded_with_the_address(buyer):
    browser = Client(REMOTE_ADDR=ADDRESS)
    assert browser.post("/login/", {"username": "buyer", "password": "wrong-password"}).status_code == 200
    failed = only("auth.login_failed")
    assert failed.actor_id is None and failed.address == ADDRESS
    assert (failed.object_type, failed.object_id) == ("user", str(buyer.pk)), "the account it was tried on"
    assert failed.details == {"username": "buyer", "path": "/login/"}

    assert browser.post("/login/", {"username": "buyer", "password": PASSWORD}).status_code == 302
    ok = only("auth.login")
    assert (ok.actor_id, ok.address, ok.object_type, ok.object_id) == (buyer.pk, ADDRESS, "user", str(buyer.pk))


def test_a_failed_login_for_an_unknown_name_names_no_account(db):
    Client(REMOTE_ADDR=ADDRESS).post("/login/", {"username": "nobody", "password": "x"})
    failed = only("auth.login_failed")
    assert failed.object_type == "" and failed.details["username"] == "nobody"


def test_an_admin_login_is_recorded(db):
    from market.models import User

    admin = User.objects.create_superuser(username="root", password=PASSWORD, email="")
    r = Client(REMOTE_ADDR=ADDRESS).post("/admin/login/?next=/admin/", {"username": "root", "password": PASSWORD, "next": "/admin/"})
    assert r.status_code == 302
    ok = only("auth.login")
    assert (ok.actor_id, ok.address, ok.details["path"]) == (admin.pk, ADDRESS, "/admin/login/")


def test_an_api_signup_is_recorded_without_the_password(db):
    r = APIClient(REMOTE_ADDR=ADDRESS).post("/api/v1/accounts/signup/", {"username": "newbie", "password": "a-long-enough-pass", "role": "buyer"}, format="json")
    assert r.status_code == 201, r.content
    e = only("account.signup")
    assert (e.actor_id, e.address, e.object_type, e.object_id) == (r.json()["id"], ADDRESS, "user", str(r.json()["id"]))
    assert e.details == {"role": "buyer"}


def test_a_token_created_and_revoked_is_recorded_with_its_scopes_never_its_plaintext(buyer, client_for):
    from market.models import AuditEvent

    c = api(buyer, client_for)
    before = AuditEvent.objects.count()  # the fixture's own token
    r = c.post("/api/v1/tokens/", {"name": "bot", "scopes": ["trade", "read"]}, format="json")
    assert r.status_code == 201
    raw, token_id = r.json()["token"], r.json()["id"]
    created = AuditEvent.objects.filter(action="token.create", object_id=str(token_id)).get()
    assert (created.actor_id, created.address, created.object_type) == (buyer.pk, ADDRESS, "token")
    assert created.details == {"name": "bot", "prefix": r.json()["prefix"], "scopes": ["read", "trade"], "expires_at": None}
    assert c.post(f"/api/v1/tokens/{token_id}/revoke/").status_code == 200
    revoked = only("token.revoke")
    assert (revoked.actor_id, revoked.address, revoked.object_id, revoked.details["scopes"]) == (buyer.pk, ADDRESS, str(token_id), ["read", "trade"])
    assert AuditEvent.objects.count() == before + 2
    dumped = json.dumps(list(AuditEvent.objects.values("details")))
    secret = raw.split("_", 2)[2]  # gb_<prefix>_<secret>: a secret may hold "_" itself (URL-safe base64)
    assert raw not in dumped and secret not in dumped and PASSWORD not in dumped


def test_a_token_made_and_revoked_on_the_account_page_is_recorded_with_the_browsers_address(buyer):
    from market.models import ApiToken

    browser = Client(REMOTE_ADDR=ADDRESS)
    browser.force_login(buyer)
    r = browser.post("/account/", {"action": "create", "name": "web-bot", "scopes": ["read"]}, HTTP_X_REQUEST_ID="acct-1")
    page = r.content.decode()
    token = ApiToken.objects.get(name="web-bot")
    created = only("token.create")
    assert (created.actor_id, created.address, created.object_id) == (buyer.pk, ADDRESS, str(token.pk))
    assert created.request_id == r["X-Request-ID"] == "acct-1", "the record names the request, as its log lines do"
    assert browser.post("/account/", {"action": "revoke", "token": token.pk}).status_code == 302
    assert only("token.revoke").address == ADDRESS
    raw = page.split('id="new-token">')[1].split("<")[0]
    from market.models import AuditEvent

    assert raw.startswith("gb_") and raw not in json.dumps(list(AuditEvent.objects.values("details")))


def test_a_bid_placed_and_cancelled_is_recorded(buyer, client_for):
    c = api(buyer, client_for)
    r = c.post("/api/v1/bids/", bid_body(), format="json")
    assert r.status_code == 201, r.content
    placed = only("bid.place")
    assert (placed.actor_id, placed.address, placed.object_type, placed.object_id) == (buyer.pk, ADDRESS, "bid", str(r.json()["id"]))
    assert placed.details["gpus"] == 4 and placed.details["max_price"] == 3_000_000
    assert c.post(f"/api/v1/bids/{r.json()['id']}/cancel/").status_code == 200
    cancelled = only("bid.cancel")
    assert (cancelled.actor_id, cancelled.address, cancelled.object_id) == (buyer.pk, ADDRESS, str(r.json()["id"]))
    assert c.post(f"/api/v1/bids/{r.json()['id']}/cancel/").status_code == 409
    assert len(events("bid.cancel")) == 1, "a refused action leaves no record"


def test_an_offer_published_repriced_paused_and_withdrawn_is_recorded_once_each(provider_user, make_machine, client_for):
    machine = make_machine(provider_user, count=4)
    c = api(provider_user, client_for)
    r = c.post("/api/v1/offers/", {"machine": machine.pk, "gpu_model": "H100-SXM-80GB", "gpus": 4, "price": 2_000_000}, format="json")
    assert r.status_code == 201, r.content
    offer = str(r.json()["id"])
    assert (only("offer.publish").actor_id, only("offer.publish").object_id, only("offer.publish").address) == (provider_user.pk, offer, ADDRESS)
    assert c.patch(f"/api/v1/offers/{offer}/", {"price": 2_200_000}, format="json").status_code == 200
    assert only("offer.reprice").details == {"price": [2_000_000, 2_200_000]}
    assert c.patch(f"/api/v1/offers/{offer}/", {"state": "paused"}, format="json").status_code == 200
    assert only("offer.pause").details == {"state": ["open", "paused"]}
    assert c.patch(f"/api/v1/offers/{offer}/", {"state": "open"}, format="json").status_code == 200
    assert only("offer.resume").object_id == offer
    assert c.post(f"/api/v1/offers/{offer}/withdraw/").status_code == 200
    w = only("offer.withdraw")
    assert (w.actor_id, w.object_type, w.object_id, w.address) == (provider_user.pk, "offer", offer, ADDRESS)


def test_an_operator_preemption_is_recorded(operator, provider_user, make_job, client_for):
    job = make_job(provider_user, trade_state="recorded")
    r = api(operator, client_for).post(f"/api/v1/jobs/{job.pk}/preempt/")
    assert r.status_code == 200, r.content
    e = only("job.preempt")
    assert (e.actor_id, e.address, e.object_type, e.object_id) == (operator.pk, ADDRESS, "job", str(job.pk))
    assert e.details == {"reason": "preempted by the operator", "trade": job.trade_id}


# --- who reads what --------------------------------------------------------------------------
def test_a_user_sees_only_their_own_records_and_operators_see_all_with_filters(buyer, stranger, operator, client_for):
    mine = api(buyer, client_for)
    theirs = api(stranger, client_for)
    assert mine.post("/api/v1/bids/", bid_body(), format="json").status_code == 201
    assert theirs.post("/api/v1/bids/", bid_body(), format="json").status_code == 201

    body = mine.get("/api/v1/audit/").json()
    assert body["results"] and {e["actor"] for e in body["results"]} == {buyer.pk}
    assert {e["action"] for e in body["results"]} >= {"bid.place", "token.create"}
    bid = next(e for e in body["results"] if e["action"] == "bid.place")
    assert bid["address"] == ADDRESS and bid["object"]["type"] == "bid" and bid["actor_username"] == "buyer"
    # a user's filter for another actor does not widen what they see
    assert all(e["actor"] == buyer.pk for e in mine.get(f"/api/v1/audit/?actor={stranger.pk}").json()["results"])

    boss = api(operator, client_for)
    every = boss.get("/api/v1/audit/?action=bid.place").json()["results"]
    assert {e["actor"] for e in every} == {buyer.pk, stranger.pk}
    assert [e["actor"] for e in boss.get(f"/api/v1/audit/?action=bid.place&actor={stranger.pk}").json()["results"]] == [stranger.pk]
    assert boss.get("/api/v1/audit/?since=2999-01-01T00:00:00Z").json()["results"] == []
    assert mine.get("/api/v1/audit/?limit=1").json()["next"], "cursor paginated"


def test_a_bad_filter_is_a_clear_400(operator, client_for):
    c = api(operator, client_for)
    r = c.get("/api/v1/audit/?action=bid.explode")
    assert r.status_code == 400 and "action" in r.json()["error"]["fields"]
    r = c.get("/api/v1/audit/?since=yesterday")
    assert r.status_code == 400 and "since" in r.json()["error"]["fields"]
    assert c.get("/api/v1/audit/?actor=me").status_code == 400


def test_the_audit_log_needs_a_login_and_the_read_scope(buyer, client_for):
    assert APIClient().get("/api/v1/audit/").status_code in (401, 403)
    assert client_for(buyer, ["trade"]).get("/api/v1/audit/").status_code == 403


def test_the_account_page_lists_the_users_recent_events(buyer, stranger, client_for):
    api(stranger, client_for).post("/api/v1/bids/", bid_body(), format="json")
    browser = Client(REMOTE_ADDR=ADDRESS)
    browser.post("/login/", {"username": "buyer", "password": PASSWORD})
    page = browser.get("/account/").content.decode()
    assert "Recent activity" in page and "auth.login" in page and ADDRESS in page
    assert "bid.place" not in page, "another user's event"


# --- append-only -------------------------------------------------------------------------------
def test_a_record_cannot_be_changed_or_deleted(buyer, client_for):
    from market.audit import AuditImmutable
    from market.models import AuditEvent

    api(buyer, client_for).post("/api/v1/bids/", bid_body(), format="json")
    e = only("bid.place")
    e.action = "bid.cancel"
    with pytest.raises(AuditImmutable):
        e.save()
    with pytest.raises(AuditImmutable):
        e.delete()
    with pytest.raises(AuditImmutable):
        AuditEvent.objects.filter(pk=e.pk).update(address="10.0.0.1")
    with pytest.raises(AuditImmutable):
        AuditEvent.objects.filter(pk=e.pk).delete()
    assert AuditEvent.objects.get(pk=e.pk).action == "bid.place"


@pytest.mark.postgres
def test_the_database_itself_refuses_to_change_or_delete_a_record(buyer, client_for):
    from django.db import DatabaseError

    api(buyer, client_for).post("/api/v1/bids/", bid_body(), format="json")
    e = only("bid.place")
    for sql in ("UPDATE market_auditevent SET address = '10.0.0.1' WHERE id = %s", "DELETE FROM market_auditevent WHERE id = %s"):
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic(), connection.cursor() as cur:
            cur.execute(sql, [e.pk])
    assert only("bid.place").address == ADDRESS


def test_deleting_a_user_keeps_their_records(stranger, client_for):
    from market.models import AuditEvent

    api(stranger, client_for).post("/api/v1/bids/", bid_body(), format="json")
    pk = stranger.pk
    kept = AuditEvent.objects.filter(actor_id=pk).count()
    assert kept >= 2
    from ledger.models import CustodialKey
    from market.models import ApiToken, Bid

    Bid.objects.filter(buyer=stranger).delete()
    ApiToken.objects.filter(user=stranger).delete()
    CustodialKey.objects.filter(user=stranger).delete()  # a key with money on it is never deleted with its user (PROTECT)
    stranger.delete()
    assert AuditEvent.objects.filter(actor_id=pk).count() == kept
    assert only("bid.place").actor_username == "stranger"


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_a_bid_placed_and_cancelled_over_the_websocket_is_recorded_with_the_sockets_address(buyer, client_for):
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator

    from gridbid.asgi import application

    # database_sync_to_async closes the thread's connection after: the test database can be dropped
    raw = (await database_sync_to_async(client_for)(buyer, ["read", "trade"])).raw_token
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=[(b"authorization", f"Bearer {raw}".encode())])
    comm.scope["client"] = [ADDRESS, 51234]
    assert (await comm.connect(timeout=5))[0]
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"
    await comm.send_json_to({"type": "place_bid", "client_order_id": "ws-1", "bid": bid_body()})
    ack = json.loads(await comm.receive_from(timeout=5))
    assert ack["type"] == "ack", ack
    await comm.send_json_to({"type": "cancel_bid", "bid_id": ack["bid"]["id"]})
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "ack"
    await comm.disconnect()
    placed, cancelled = await database_sync_to_async(lambda: (only("bid.place"), only("bid.cancel")))()
    for e in (placed, cancelled):
        assert (e.actor_id, e.address, e.object_id) == (buyer.pk, ADDRESS, str(ack["bid"]["id"]))
    assert placed.request_id and placed.request_id == cancelled.request_id, "one id per connection, as in its log lines"
