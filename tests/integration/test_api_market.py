"""Offers, bids, machines, idempotency and object-level permissions over the REST API."""

from __future__ import annotations

import pytest

from market.models import Bid, Offer
from tests.conftest import bid_body

pytestmark = pytest.mark.django_db


# --- catalogue and markets --------------------------------------------------------
def test_catalogues_are_public_and_cover_the_required_models(anon):
    models = {m["id"] for m in anon.get("/api/v1/gpu-models/").json()}
    for needed in ["A100-SXM-40GB", "A100-SXM-80GB", "H100-PCIe-80GB", "H100-SXM-80GB", "H200-SXM-141GB", "L4-24GB", "L40S-48GB", "RTX-4090-24GB", "RTX-3090-24GB", "T4-16GB", "V100-SXM-32GB", "MI250-128GB", "MI300X-192GB", "TPU-v5e-16GB", "Ascend-910B-64GB"]:
        assert needed in models
    regions = anon.get("/api/v1/regions/").json()
    assert len(regions) >= 12 and all("carbon_g_per_kwh" in r for r in regions)


def test_markets_show_best_ask_and_free_gpus_per_bucket(anon, provider_user, make_offer):
    make_offer(provider_user, price=2_400_000, count=8)
    make_offer(provider_user, price=2_100_000, count=4)
    make_offer(provider_user, model="RTX-4090-24GB", region="eu-west", price=400_000, count=2)
    rows = {r["key"]: r for r in anon.get("/api/v1/markets/").json()}
    h100 = rows["H100-SXM-80GB.us-east"]
    assert (h100["best_ask"], h100["gpus_free"], h100["offers"]) == (2_100_000, 12, 2)
    assert rows["RTX-4090-24GB.eu-west"]["gpus_free"] == 2


# --- machines and offers ----------------------------------------------------------
def test_provider_registers_a_machine_and_publishes_an_offer(provider_user, client_for):
    client = client_for(provider_user)
    m = client.post("/api/v1/machines/", {"name": "rack1", "region": "eu-north", "gpus": [{"index": i, "uuid": f"GPU-x-{i}", "model": "H100-SXM-80GB"} for i in range(4)]}, format="json")
    assert m.status_code == 201, m.json()
    o = client.post("/api/v1/offers/", {"machine": m.json()["id"], "gpu_model": "H100-SXM-80GB", "gpus": 4, "price": 2_000_000}, format="json")
    assert o.status_code == 201, o.json()
    assert o.json()["gpus_free"] == 4 and o.json()["region"] == "eu-north"


def test_offer_for_more_gpus_than_installed_is_rejected(provider_user, client_for, make_machine):
    machine = make_machine(provider_user, count=2)
    r = client_for(provider_user).post("/api/v1/offers/", {"machine": machine.id, "gpu_model": "H100-SXM-80GB", "gpus": 4, "price": 1}, format="json")
    assert r.status_code == 400
    assert "At most 2" in r.json()["error"]["fields"]["gpus"][0]


def test_second_live_offer_for_the_same_machine_and_model_conflicts(provider_user, client_for, make_offer):
    offer = make_offer(provider_user, count=4)
    r = client_for(provider_user).post("/api/v1/offers/", {"machine": offer.machine_id, "gpu_model": "H100-SXM-80GB", "gpus": 2, "price": 5}, format="json")
    assert r.status_code == 409


@pytest.mark.parametrize("field,value", [("price", 0), ("price", -5), ("gpus", 0), ("max_duration_s", 10)])
def test_offer_with_bad_terms_gets_400_naming_the_field(provider_user, client_for, make_machine, field, value):
    machine = make_machine(provider_user)
    body = {"machine": machine.id, "gpu_model": "H100-SXM-80GB", "gpus": 2, "price": 100, field: value}
    r = client_for(provider_user).post("/api/v1/offers/", body, format="json")
    assert r.status_code == 400
    assert field in r.json()["error"]["fields"]


def test_buyer_cannot_publish_offers(buyer, client_for, provider_user, make_machine):
    machine = make_machine(provider_user)
    r = client_for(buyer).post("/api/v1/offers/", {"machine": machine.id, "gpu_model": "H100-SXM-80GB", "gpus": 1, "price": 5}, format="json")
    assert r.status_code == 403


def test_provider_cannot_touch_another_providers_offer_or_machine(provider_user, other_provider_user, client_for, make_offer):
    offer = make_offer(provider_user)
    rival = client_for(other_provider_user)
    assert rival.patch(f"/api/v1/offers/{offer.id}/", {"price": 1}, format="json").status_code == 404
    assert rival.post(f"/api/v1/offers/{offer.id}/withdraw/").status_code == 404
    assert rival.get(f"/api/v1/machines/{offer.machine_id}/").status_code == 404
    assert rival.get("/api/v1/machines/").json()["results"] == []
    Offer.objects.get(pk=offer.id, price=offer.price)


def test_provider_reprices_and_withdraws_its_offer(provider_user, client_for, make_offer, anon):
    offer = make_offer(provider_user)
    client = client_for(provider_user)
    assert client.patch(f"/api/v1/offers/{offer.id}/", {"price": 1_900_000}, format="json").json()["price"] == 1_900_000
    assert client.post(f"/api/v1/offers/{offer.id}/withdraw/").json()["state"] == "withdrawn"
    assert anon.get("/api/v1/offers/").json()["results"] == []
    assert client.patch(f"/api/v1/offers/{offer.id}/", {"price": 5}, format="json").status_code == 409


def test_a_provider_moves_its_offers_selling_window_and_a_window_that_ends_before_it_starts_is_a_400(provider_user, client_for, make_offer, anon):
    """Offers state the windows in which they sell (issue 40): both ends move with PATCH. A
    window ending before it starts broke the table's check constraint: a 500."""
    from datetime import timedelta

    from django.utils import timezone

    offer = make_offer(provider_user)
    client = client_for(provider_user)
    start = (timezone.now() + timedelta(days=1)).replace(microsecond=0)
    r = client.patch(f"/api/v1/offers/{offer.id}/", {"available_from": start.isoformat(), "available_until": (start + timedelta(hours=8)).isoformat()}, format="json")
    assert r.status_code == 200, r.json()
    got = anon.get(f"/api/v1/offers/{offer.id}/").json()
    assert (got["available_from"], got["available_until"]) == (r.json()["available_from"], r.json()["available_until"])
    assert got["available_from"].startswith(start.strftime("%Y-%m-%dT%H:%M"))
    r = client.patch(f"/api/v1/offers/{offer.id}/", {"available_until": (start - timedelta(hours=1)).isoformat()}, format="json")
    assert r.status_code == 400, r.content
    assert "available_until" in r.json()["error"]["fields"] and "after available_from" in r.content.decode()
    r = client.patch(f"/api/v1/offers/{offer.id}/", {"available_from": (start + timedelta(hours=9)).isoformat()}, format="json")
    assert r.status_code == 400 and "available_until" in r.json()["error"]["fields"], r.content
    assert anon.get(f"/api/v1/offers/{offer.id}/").json()["available_until"] == got["available_until"]  # nothing half-written


def test_offers_filter_by_model_region_count_price_and_reliability(anon, provider_user, make_offer):
    make_offer(provider_user, price=2_000_000, count=8)
    make_offer(provider_user, price=3_000_000, count=2)
    make_offer(provider_user, model="L4-24GB", region="eu-west", price=300_000, count=1)

    def ids(query: str) -> list[int]:
        return [o["price"] for o in anon.get(f"/api/v1/offers/?{query}").json()["results"]]

    assert sorted(ids("gpu_model=H100-SXM-80GB")) == [2_000_000, 3_000_000]
    assert ids("region=eu-west") == [300_000]
    assert ids("min_gpus=4") == [2_000_000]
    assert sorted(ids("max_price=2500000")) == [300_000, 2_000_000]
    assert ids("min_memory_gib=70&max_price=2500000") == [2_000_000]
    assert ids("min_reliability=0.99") == []
    assert ids("ordering=-price")[0] == 3_000_000


def test_offer_filter_with_a_bad_number_is_a_400(anon):
    r = anon.get("/api/v1/offers/?min_gpus=lots")
    assert r.status_code == 400
    assert "min_gpus" in r.json()["error"]["fields"]


# --- bids ----------------------------------------------------------------------------
def test_buyer_places_lists_and_cancels_a_bid(buyer, client_for):
    client = client_for(buyer)
    r = client.post("/api/v1/bids/", bid_body(client_order_id="ord-1"), format="json")
    assert r.status_code == 201, r.json()
    bid_id = r.json()["id"]
    assert [b["id"] for b in client.get("/api/v1/bids/").json()["results"]] == [bid_id]
    assert client.post(f"/api/v1/bids/{bid_id}/cancel/").json()["state"] == "cancelled"
    again = client.post(f"/api/v1/bids/{bid_id}/cancel/")
    assert again.status_code == 409 and "cancelled" in again.json()["error"]["message"]


@pytest.mark.parametrize(
    "overrides,field",
    [
        ({"max_price": -1}, "max_price"),
        ({"max_price": 0}, "max_price"),
        ({"gpus": 0}, "gpus"),
        ({"duration_s": 5}, "duration_s"),
        ({"gpu_models": ["H9000"]}, "gpu_models"),
        ({"allowed_regions": ["moon-base"]}, "allowed_regions"),
        ({"max_latency_ms": 40}, "location_region"),
        ({"klass": "vip"}, "klass"),
        ({"min_reliability": 1.5}, "min_reliability"),
        ({"job_spec": {}}, "job_spec"),
        ({"job_spec": {"image": "x", "env": {"1BAD": "v"}}}, "job_spec.env"),
        ({"job_spec": {"image": "x", "inputs": [{"url": "https://e.com/a", "sha256": "zz"}]}}, "job_spec.inputs[0].sha256"),
        ({"job_spec": {"image": "x", "inputs": [{"url": "https://e.com/a", "sha256": "a" * 64, "path": "../etc/passwd"}]}}, "job_spec.inputs[0].path"),
        ({"weights": {"latency_per_ms": -3}}, "weights.latency_per_ms"),
        ({"deadline": "2000-01-01T00:00:00Z"}, "deadline"),
    ],
)
def test_bad_bid_gets_400_naming_the_field_and_writes_nothing(buyer, client_for, overrides, field):
    r = client_for(buyer).post("/api/v1/bids/", bid_body(**overrides), format="json")
    assert r.status_code == 400, r.json()
    err = r.json()["error"]
    assert field in err["fields"], err
    assert err["message"].startswith("Invalid input") or err["message"]
    assert not Bid.objects.exists()


def test_non_json_body_is_a_400_not_a_500(buyer, client_for):
    r = client_for(buyer).generic("POST", "/api/v1/bids/", "{not json", content_type="application/json")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "parse_error"


def test_repeated_idempotency_key_returns_the_first_response_and_places_one_bid(buyer, client_for):
    client = client_for(buyer)
    first = client.post("/api/v1/bids/", bid_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    second = client.post("/api/v1/bids/", bid_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-1")
    assert first.status_code == second.status_code == 201
    assert first.json() == second.json()
    assert second["Idempotent-Replayed"] == "true"
    assert Bid.objects.count() == 1


def test_idempotency_key_reused_with_another_body_is_409(buyer, client_for):
    client = client_for(buyer)
    client.post("/api/v1/bids/", bid_body(), format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    r = client.post("/api/v1/bids/", bid_body(gpus=2), format="json", HTTP_IDEMPOTENCY_KEY="k-2")
    assert r.status_code == 409
    assert Bid.objects.count() == 1


def test_idempotency_keys_are_per_user(buyer, stranger, client_for):
    client_for(buyer).post("/api/v1/bids/", bid_body(), format="json", HTTP_IDEMPOTENCY_KEY="same")
    r = client_for(stranger).post("/api/v1/bids/", bid_body(), format="json", HTTP_IDEMPOTENCY_KEY="same")
    assert r.status_code == 201
    assert Bid.objects.count() == 2


def test_duplicate_client_order_id_conflicts(buyer, client_for):
    client = client_for(buyer)
    assert client.post("/api/v1/bids/", bid_body(client_order_id="a"), format="json").status_code == 201
    assert client.post("/api/v1/bids/", bid_body(client_order_id="a"), format="json").status_code == 409


# --- nobody sees another user's objects ------------------------------------------------
def test_no_endpoint_leaks_another_users_bids_trades_jobs_or_machines(buyer, stranger, provider_user, client_for, make_bid, make_offer):
    bid = make_bid(buyer)
    make_offer(provider_user)
    snoop = client_for(stranger)
    assert snoop.get(f"/api/v1/bids/{bid.id}/").status_code == 404
    assert snoop.post(f"/api/v1/bids/{bid.id}/cancel/").status_code == 404
    for path in ["/api/v1/bids/", "/api/v1/trades/", "/api/v1/jobs/", "/api/v1/machines/"]:
        r = snoop.get(path)
        assert r.status_code == 200 and r.json()["results"] == [], path
    from market.models import ApiToken

    own = set(ApiToken.objects.filter(user=stranger).values_list("id", flat=True))
    assert {t["id"] for t in snoop.get("/api/v1/tokens/").json()["results"]} == own
    assert Bid.objects.get(pk=bid.id).state == "open"


def test_operator_sees_every_bid(buyer, stranger, operator, client_for, make_bid):
    make_bid(buyer)
    make_bid(stranger)
    assert len(client_for(operator).get("/api/v1/bids/").json()["results"]) == 2


def test_lists_page_with_a_cursor(buyer, client_for, make_bid):
    for i in range(5):
        make_bid(buyer, client_order_id=f"o{i}")
    client = client_for(buyer)
    page = client.get("/api/v1/bids/?limit=2").json()
    assert len(page["results"]) == 2 and page["next"]
    seen = [b["id"] for b in page["results"]]
    while page["next"]:
        page = client.get(page["next"]).json()
        seen += [b["id"] for b in page["results"]]
    assert len(seen) == len(set(seen)) == 5


@pytest.mark.parametrize("cursor", [
    "not-base64!",  # not a cursor at all
    "cD1hYmM=",  # p=abc: decodes, but its position is no bid id
    "bz0tMw==",  # o=-3: a negative offset
])
def test_a_bad_cursor_is_a_400_that_says_to_start_from_the_first_page(buyer, client_for, make_bid, cursor):
    make_bid(buyer)
    r = client_for(buyer).get(f"/api/v1/bids/?cursor={cursor}")
    assert r.status_code == 400, r.content
    error = r.json()["error"]
    assert error["code"] == "invalid" and "cursor" in error["fields"]
    assert "first page" in error["message"]


def test_a_cursor_whose_position_does_not_fit_the_ordering_is_a_400(buyer, client_for, make_bid):
    make_bid(buyer)
    client = client_for(buyer)
    r = client.get("/api/v1/bids/?ordering=created_at&cursor=cD1ub3QtYS1kYXRl")  # p=not-a-date
    assert r.status_code == 400, r.content
    assert "cursor" in r.json()["error"]["fields"]


def test_schema_and_docs_are_served(anon):
    assert anon.get("/api/schema/").status_code == 200
    docs = anon.get("/api/docs/")
    assert docs.status_code == 200 and b"swagger" in docs.content.lower()


def test_a_nul_character_anywhere_in_a_body_is_a_400(provider_user, client_for):
    r = client_for(provider_user).post("/api/v1/machines/", {"name": "m", "region": "eu\u0000west", "gpus": [{"index": 0, "uuid": "u", "model": "H100\u0000"}]}, format="json")
    assert r.status_code == 400 and "NUL" in r.json()["error"]["message"]
