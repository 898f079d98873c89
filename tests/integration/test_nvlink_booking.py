"""NVLink domains from the agent's inventory to the booking (issue 38): the agent reads its
machine's topology from a declared inventory file, the market keeps each GPU's NVLink
domain, and a 2-GPU job is booked on a linked pair, not across domains."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from market.models import Bid, Booking, Trade
from providers.agent.inventory import detect
from tests.conftest import bid_body

pytestmark = pytest.mark.django_db

INVENTORY = """
driver_version = "550.54.15"
cuda_version = "12.4"
""" + "".join(f"""
[[gpus]]
index = {i}
name = "NVIDIA H100 80GB HBM3"
memory_mib = 81559
model = "H100-SXM-80GB"
""" for i in range(4)) + """
[[links]]
a = 0
b = 1
kind = "nvlink"
[[links]]
a = 2
b = 3
kind = "nvlink"
[[links]]
a = 1
b = 2
kind = "pcie-host"
"""


def test_the_agents_nvlink_domains_reach_the_market_and_a_pair_is_booked_on_one(tmp_path: Path, provider_user, buyer, client_for, make_bid) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    path = tmp_path / "inventory.toml"
    path.write_text(INVENTORY)
    inv = detect(path)
    assert inv.nvlink_groups() == {0: 0, 1: 0, 2: 2, 3: 2} and inv.interconnect == "pcie", "two NVLink pairs, PCIe between them"
    api = client_for(provider_user, ["read", "provide"])
    body = {"name": "dgx-half", "region": "us-east", "interconnect": inv.interconnect, "gpus": inv.registration_gpus()}
    got = api.post("/api/v1/machines/", body, format="json")
    assert got.status_code == 201, got.json()
    assert [g["nvlink_group"] for g in got.json()["gpus"]] == [0, 0, 2, 2]
    offer = api.post("/api/v1/offers/", {"machine": got.json()["id"], "gpu_model": "H100-SXM-80GB", "gpus": 4, "price": 2_000_000}, format="json")
    assert offer.status_code == 201, offer.json()
    one = make_bid(buyer, gpus=1)
    round_clear(now=timezone.now() + timezone.timedelta(seconds=1), slot=52_000_001)  # a slot of its own: rounds never share one
    one.refresh_from_db()
    assert Trade.objects.filter(bid=one).exists(), one.explanation
    assert Booking.objects.get(trade=Trade.objects.get(bid=one)).gpu_indexes == [0]
    pair = make_bid(buyer, gpus=2)
    round_clear(now=timezone.now() + timezone.timedelta(seconds=1), slot=52_000_002)
    # the lowest free indexes would be 1 and 2, across the PCIe link; the linked pair left is 2 and 3
    assert Booking.objects.get(trade=Trade.objects.get(bid=pair)).gpu_indexes == [2, 3]


def test_a_group_that_names_no_gpu_of_the_machine_is_refused(provider_user, client_for) -> None:  # type: ignore[no-untyped-def]
    gpus = [{"index": i, "uuid": f"GPU-n-{i}", "model": "H100-SXM-80GB", "nvlink_group": 7} for i in range(2)]
    got = client_for(provider_user, ["read", "provide"]).post("/api/v1/machines/", {"name": "odd", "region": "us-east", "gpus": gpus}, format="json")
    assert got.status_code == 400 and "nvlink_group 7 names no GPU of this machine" in str(got.json())


def _machine(api, name: str, groups: list[int | None]) -> int:  # type: ignore[no-untyped-def]
    gpus = [{"index": i, "uuid": f"GPU-{name}-{i}", "model": "H100-SXM-80GB", "nvlink_group": g} for i, g in enumerate(groups)]
    m = api.post("/api/v1/machines/", {"name": name, "region": "us-east", "gpus": gpus}, format="json")
    assert m.status_code == 201, m.json()
    o = api.post("/api/v1/offers/", {"machine": m.json()["id"], "gpu_model": "H100-SXM-80GB", "gpus": len(groups), "price": 2_000_000}, format="json")
    assert o.status_code == 201, o.json()
    return int(o.json()["id"])


def test_a_bid_that_needs_nvlink_is_booked_inside_one_domain_or_waits(provider_user, buyer, client_for, make_bid) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    api = client_for(provider_user, ["read", "provide"])
    _machine(api, "tri", [0, 0, 0, None])  # GPUs 0-2 on one NVLink domain, 3 alone: 3 at most linked
    placed = client_for(buyer).post("/api/v1/bids/", {**bid_body(gpus=2), "interconnect": "nvlink"}, format="json")
    assert placed.status_code == 201, placed.json()
    assert placed.json()["interconnect"] == "nvlink" and placed.json()["same_machine"] is True
    first = Bid.objects.get(pk=placed.json()["id"])
    second = make_bid(buyer, gpus=2)
    second.needs_nvlink = True
    second.save(update_fields=["needs_nvlink"])
    too_big = make_bid(buyer, gpus=4)
    too_big.needs_nvlink = True
    too_big.save(update_fields=["needs_nvlink"])
    rnd = round_clear(now=timezone.now() + timezone.timedelta(seconds=1), slot=52_000_011)
    assert Booking.objects.get(trade=Trade.objects.get(bid=first)).gpu_indexes == [0, 1]
    # the engine saw 4 GPUs free, 3 of them linked, and placed both pairs; the second pair
    # would straddle the domain and the lone GPU: it is dropped, and bids again next round
    assert not Trade.objects.filter(bid=second).exists() and second.pk in rnd.stats["dropped_bids"]
    too_big.refresh_from_db()
    assert any("fewer than 4 free GPUs in one NVLink domain (largest 3)" in r for r in too_big.explanation["reasons"]), too_big.explanation


@pytest.mark.parametrize(("body", "says"), [
    ({"interconnect": "infiniband"}, "is not a valid choice"),
    ({"interconnect": "nvlink", "same_machine": False}, "interconnect nvlink and same_machine false disagree"),
])
def test_a_bad_interconnect_is_refused(buyer, client_for, body, says) -> None:  # type: ignore[no-untyped-def]
    got = client_for(buyer).post("/api/v1/bids/", {**bid_body(gpus=2), **body}, format="json")
    assert got.status_code == 400 and says in str(got.json()), got.json()
