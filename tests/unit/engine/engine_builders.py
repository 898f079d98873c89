"""Small hand-made rounds for the engine tests."""

from __future__ import annotations

import dataclasses
from typing import Any

from market.engine import DEFAULT_WEIGHTS, Bid, GpuModel, Offer, Region, RoundConfig, RoundInput

NOW = 1_700_000_000
MODELS = (
    GpuModel("H100", "nvidia", 80, 250.0, 700),
    GpuModel("A100", "nvidia", 80, 100.0, 400),
    GpuModel("L4", "nvidia", 24, 30.0, 72),
    GpuModel("MI300X", "amd", 192, 350.0, 750),
)
REGIONS = (Region("eu-west", 290.0), Region("us-east", 380.0), Region("eu-north", 30.0))
LATENCY = (
    ("eu-west", "eu-west", 1.0), ("eu-west", "us-east", 85.0), ("eu-west", "eu-north", 25.0),
    ("us-east", "eu-west", 85.0), ("us-east", "us-east", 1.0), ("us-east", "eu-north", 95.0),
    ("eu-north", "eu-west", 25.0), ("eu-north", "us-east", 95.0), ("eu-north", "eu-north", 1.0),
)


def offer(id: int, **kw: Any) -> Offer:
    base: dict[str, Any] = dict(
        id=id, provider_id=100 + id, machine_id=1000 + id, region="eu-west", gpu_model="H100",
        gpus=8, ask=2_000_000, min_duration_s=0, max_duration_s=30 * 86_400,
        available_from=NOW - 60, available_until=None, spot_allowed=True, reserved_only=False,
        reliability=0.99, created_at=NOW - 100,
    )
    base.update(kw)
    return Offer(**base)


def bid(id: int, **kw: Any) -> Bid:
    base: dict[str, Any] = dict(
        id=id, buyer_id=500 + id, gpus=1, gpu_models=("H100",), min_memory_gib=0,
        min_compute_units=0.0, vendor=None, same_machine=True, allowed_regions=(),
        preferred_regions=(), location_region=None, max_latency_ms=None, max_price=3_000_000,
        duration_s=3600, deadline=None, klass="on_demand", min_reliability=0.0,
        weights=DEFAULT_WEIGHTS, created_at=NOW - 10 - id,
    )
    base.update(kw)
    return Bid(**base)


def round_of(offers: list[Offer] | tuple[Offer, ...], bids: list[Bid] | tuple[Bid, ...], **kw: Any) -> RoundInput:
    cfg = kw.pop("config", RoundConfig())
    return RoundInput(now=NOW, offers=tuple(offers), bids=tuple(bids), gpu_models=MODELS,
                      regions=REGIONS, latency_ms=LATENCY, config=cfg, **kw)


def with_config(inp: RoundInput, **kw: Any) -> RoundInput:
    return dataclasses.replace(inp, config=dataclasses.replace(inp.config, **kw))
