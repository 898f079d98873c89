"""What a token sees follows its scopes, not only its account's role (issue 27, item 4): an
operator's `read` token sees its own account's data; seeing other users' needs `operate`. A
browser session keeps its role's reach."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


def session_of(user) -> APIClient:
    client = APIClient()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def ids(response) -> set[int]:
    assert response.status_code == 200, response.content
    body = response.json()
    return {row["id"] for row in (body["results"] if isinstance(body, dict) else body)}


@pytest.fixture
def others_job(provider_user, make_job):
    """A job between the `buyer` and the `provider`: none of it the operator's."""
    return make_job(provider_user)


@pytest.mark.parametrize("path, row", [
    ("/api/v1/bids/", lambda job: job.trade.bid_id),
    ("/api/v1/trades/", lambda job: job.trade_id),
    ("/api/v1/jobs/", lambda job: job.pk),
    ("/api/v1/machines/", lambda job: job.trade.offer.machine_id),
])
def test_an_operators_read_token_sees_no_other_users_rows_but_its_operate_token_and_session_do(operator, others_job, client_for, path, row):
    theirs = row(others_job)
    assert theirs not in ids(client_for(operator, ["read"]).get(path))
    assert theirs in ids(client_for(operator, ["read", "operate"]).get(path))
    assert theirs in ids(session_of(operator).get(path))


def test_an_operators_read_token_sees_its_own_bids(operator, buyer, make_bid, client_for):
    own, theirs = make_bid(operator), make_bid(buyer)
    seen = ids(client_for(operator, ["read"]).get("/api/v1/bids/"))
    assert own.pk in seen and theirs.pk not in seen


def test_an_operators_read_token_sees_only_its_own_audit_records(operator, buyer, client_for):
    from market.models import AuditEvent

    reader = client_for(operator, ["read"])
    rows = reader.get("/api/v1/audit/").json()["results"]
    assert rows and {r["id"] for r in rows} <= set(AuditEvent.objects.filter(actor_id=operator.pk).values_list("id", flat=True))
    theirs = AuditEvent.objects.filter(actor_id=buyer.pk).values_list("id", flat=True)
    assert theirs and set(theirs) <= {r["id"] for r in client_for(operator, ["read", "operate"]).get("/api/v1/audit/").json()["results"]}
    assert set(theirs) <= {r["id"] for r in session_of(operator).get("/api/v1/audit/").json()["results"]}


def test_an_operators_read_token_cannot_read_another_users_trade_on_the_ledger(operator, others_job, client_for):
    path = f"/api/v1/ledger/trades/{others_job.trade_id}/"
    r = client_for(operator, ["read"]).get(path)
    assert r.status_code == 404, r.content
    assert client_for(operator, ["read", "operate"]).get(path).status_code == 200


def test_an_operators_read_token_is_refused_the_metrics_naming_the_operate_scope(operator, client_for):
    r = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {client_for(operator, ['read']).raw_token}")
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "permission_denied"
    assert "'operate'" in r.json()["error"]["message"]
    assert Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {client_for(operator, ['read', 'operate']).raw_token}").status_code == 200
