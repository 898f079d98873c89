"""Hard constraints: each one alone keeps a bid off an offer."""

from __future__ import annotations

from typing import Any

import pytest

from market.engine import EngineInputError, clear_round
from tests.unit.engine.engine_builders import NOW, bid, offer, round_of


def matched(o: dict[str, Any], b: dict[str, Any]) -> bool:
    res = clear_round(round_of([offer(1, **o)], [bid(1, **b)]))
    return bool(res.trades)


def test_a_plain_bid_matches_a_plain_offer() -> None:
    assert matched({}, {})


@pytest.mark.parametrize(
    ("o", "b"),
    [
        ({"gpu_model": "A100"}, {"gpu_models": ("H100",)}),
        ({"gpu_model": "L4"}, {"gpu_models": (), "min_memory_gib": 40}),
        ({"gpu_model": "A100"}, {"gpu_models": (), "min_compute_units": 200.0}),
        ({"gpu_model": "MI300X"}, {"gpu_models": (), "vendor": "nvidia"}),
        ({"gpus": 4}, {"gpus": 8}),
        ({"region": "us-east"}, {"allowed_regions": ("eu-west",)}),
        ({"region": "us-east"}, {"location_region": "eu-west", "max_latency_ms": 40.0}),
        ({"ask": 3_100_000}, {"max_price": 3_000_000}),
        ({"available_until": NOW + 1800}, {"duration_s": 3600}),
        ({"max_duration_s": 1800}, {"duration_s": 3600}),
        ({"available_from": NOW + 60}, {}),
        ({"reliability": 0.9}, {"min_reliability": 0.95}),
        ({"reserved_only": True}, {"klass": "on_demand"}),
        ({"spot_allowed": False}, {"klass": "spot"}),
        ({}, {"deadline": NOW + 1800, "duration_s": 3600}),
        ({"containers": False, "ports": False}, {"needs_containers": True}),
        ({"ports": False}, {"needs_ports": True}),
        ({"containers": False, "ports": False}, {"needs_ports": True}),
        ({"cuda": 1202}, {"min_cuda": 1204}),
        ({"ram_gib": 64}, {"min_ram_gib": 128}),
        ({"disk_gb": 99}, {"min_disk_gb": 100}),
        ({"net_down_mbps": 500}, {"min_net_down_mbps": 1000}),
        ({}, {"min_cuda": 1100}),
        ({"spot_only": True}, {"klass": "on_demand"}),
        ({"spot_only": True}, {"klass": "reserved"}),
    ],
    ids=[
        "model-not-allowed", "memory-too-small", "compute-too-small", "wrong-vendor",
        "machine-too-small", "region-not-allowed", "latency-too-high", "ask-over-max-price",
        "window-too-short", "duration-over-offer-max", "not-yet-available", "reliability-too-low",
        "reserved-only-offer", "spot-not-allowed", "deadline-too-soon",
        "image-on-a-process-machine", "ports-without-a-public-host", "ports-on-a-process-machine",
        "cuda-too-old", "ram-too-small", "disk-too-small", "download-too-slow", "host-not-reported",
        "lent-offer-on-demand", "lent-offer-reserved",
    ],
)
def test_bid_failing_one_hard_constraint_is_not_matched(o: dict[str, Any], b: dict[str, Any]) -> None:
    assert not matched(o, b)


def test_min_specs_match_any_model_meeting_them() -> None:
    assert matched({"gpu_model": "MI300X"}, {"gpu_models": (), "min_memory_gib": 100})


def test_reserved_only_offer_takes_reserved_bids() -> None:
    assert matched({"reserved_only": True}, {"klass": "reserved"})


def test_same_machine_bid_is_not_split_across_machines() -> None:
    res = clear_round(round_of([offer(1, gpus=4), offer(2, gpus=4)], [bid(1, gpus=8)]))
    assert res.trades == ()


def test_multi_machine_bid_is_split_within_one_region_and_model() -> None:
    offers = [offer(1, gpus=4), offer(2, gpus=4, ask=2_100_000), offer(3, gpus=8, region="us-east")]
    res = clear_round(round_of(offers, [bid(1, gpus=8, same_machine=False, allowed_regions=("eu-west",))]))
    assert sorted((t.offer_id, t.gpus) for t in res.trades) == [(1, 4), (2, 4)]


def test_capacity_of_a_machine_is_never_exceeded() -> None:
    res = clear_round(round_of([offer(1, gpus=4)], [bid(i, gpus=2) for i in range(1, 5)]))
    assert sum(t.gpus for t in res.trades) == 4


def test_a_job_that_needs_a_container_runtime_or_ports_goes_where_they_are_and_says_why_not() -> None:
    # issue 32: the provider's agent refused these after matching; the engine matches them
    # only where the machine runs images (containers) and publishes ports (ports)
    process = offer(1, ask=1_000_000, containers=False, ports=False)
    docker_no_host = offer(2, ask=1_500_000, containers=True, ports=False)
    docker = offer(3, ask=2_000_000)
    res = clear_round(round_of([process, docker_no_host, docker], [
        bid(1, needs_ports=True, max_price=3_000_000), bid(2, needs_containers=True, max_price=3_000_000),
        bid(3, max_price=3_000_000)]))
    assert {t.bid_id: t.offer_id for t in res.trades} == {1: 3, 2: 2, 3: 1}
    alone = clear_round(round_of([process], [bid(1, needs_ports=True), bid(2, needs_containers=True)]))
    assert not alone.trades
    why = {u.bid_id: " ".join(u.reasons) for u in alone.unmatched}
    assert "cannot publish ports" in why[1] and "plain processes" in why[2], why


def test_a_job_goes_only_to_a_host_that_meets_its_needs_and_an_unmatched_one_says_what_fell_short() -> None:
    # issue 32: a bid may ask for a least CUDA version, RAM, free disk and download bandwidth
    host = {"cuda": 1204, "ram_gib": 256, "disk_gb": 2000, "net_down_mbps": 10_000}
    old_cuda = offer(1, ask=1_000_000, **{**host, "cuda": 1108})
    small_disk = offer(2, ask=1_200_000, **{**host, "disk_gb": 80})
    big = offer(3, ask=2_000_000, **host)
    needs = {"min_cuda": 1200, "min_disk_gb": 100, "max_price": 3_000_000}
    res = clear_round(round_of([old_cuda, small_disk, big], [bid(1, **needs), bid(2, max_price=3_000_000, gpus=2)]))
    trades = {t.bid_id: t.offer_id for t in res.trades}
    assert trades[1] == 3, "the dearer host that meets both needs"
    assert trades[2] in (1, 2), "a bid with no needs takes a cheaper host"
    alone = clear_round(round_of([old_cuda, small_disk], [bid(1, **needs)]))
    assert not alone.trades
    why = " ".join(alone.unmatched[0].reasons)
    assert "fall short of the host your job needs" in why, why
    assert "2 offers in eu-west" in why and "CUDA 12.0 or more (the cheapest has 11.8)" in why, why
    disk = " ".join(clear_round(round_of([small_disk], [bid(1, **needs)])).unmatched[0].reasons)
    assert "free disk 100 GB or more (the cheapest has 80 GB)" in disk and "CUDA" not in disk, disk
    unreported = clear_round(round_of([offer(1)], [bid(1, min_ram_gib=64)]))
    assert "RAM 64 GiB or more (the cheapest has none reported)" in " ".join(unreported.unmatched[0].reasons)


@pytest.mark.parametrize("field,value", [("min_cuda", -1), ("min_cuda", 10_000), ("min_ram_gib", 1.5), ("min_disk_gb", True), ("min_net_down_mbps", 10**10)])
def test_a_bad_host_need_is_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(EngineInputError) as err:
        clear_round(round_of([offer(1)], [bid(1, **{field: value})]))
    assert err.value.field == f"bids[0].{field}"


def test_a_bad_host_on_an_offer_is_refused_by_name() -> None:
    with pytest.raises(EngineInputError) as err:
        clear_round(round_of([offer(1, cuda=-4)], [bid(1)]))
    assert err.value.field == "offers[0].cuda"


def test_a_lent_offer_sells_to_spot_only_and_says_so() -> None:
    # issue 31, tides: an owner's GPUs lent while it does not need them go to spot bids alone
    lent = offer(1, ask=1_000_000, spot_only=True)
    res = clear_round(round_of([lent], [bid(1, klass="on_demand"), bid(2, klass="spot")]))
    assert [(t.bid_id, t.offer_id) for t in res.trades] == [(2, 1)]
    why = " ".join(res.unmatched[0].reasons)
    assert "lent by owners who take them back" in why, why
