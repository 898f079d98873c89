"""Hard constraints: each one alone keeps a bid off an offer."""

from __future__ import annotations

from typing import Any

import pytest

from market.engine import clear_round
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
    ],
    ids=[
        "model-not-allowed", "memory-too-small", "compute-too-small", "wrong-vendor",
        "machine-too-small", "region-not-allowed", "latency-too-high", "ask-over-max-price",
        "window-too-short", "duration-over-offer-max", "not-yet-available", "reliability-too-low",
        "reserved-only-offer", "spot-not-allowed", "deadline-too-soon",
        "image-on-a-process-machine", "ports-without-a-public-host", "ports-on-a-process-machine",
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
