"""Realistic random rounds for the engine benchmark and its tests.

Catalogue GPU models and regions (with the coordinate-based latency matrix),
asks drawn around each model's public price level, machines of 1/2/4/8 GPUs
(data-centre cards mostly in 8-GPU servers, consumer cards in small boxes),
and two kinds of job: inference (short, 1-2 GPUs, latency-bound, often "any
GPU with enough memory") and training (long, 4-16 GPUs, named models, wide
region choice). Seeded: the same (n, seed) gives the same round.
"""

from __future__ import annotations

import numpy as np

from market.engine import (
    DEFAULT_WEIGHTS,
    Bid,
    GpuModel,
    Offer,
    Region,
    RoundConfig,
    RoundInput,
)
from providers import catalogue

NOW = 1_760_000_000
TRAINING = ("H100-SXM-80GB", "H200-SXM-141GB", "A100-SXM-80GB", "B200-SXM-180GB", "MI300X-192GB",
            "H100-PCIe-80GB", "A100-SXM-40GB", "A100-PCIe-80GB", "MI250-128GB", "Ascend-910B-64GB")
INFERENCE = ("L4-24GB", "A10-24GB", "L40S-48GB", "RTX-4090-24GB", "RTX-3090-24GB", "T4-16GB",
             "A100-PCIe-80GB", "H100-PCIe-80GB", "RTX-A6000-48GB", "V100-PCIe-16GB", "TPU-v5e-16GB")
CONSUMER = {"RTX-4090-24GB", "RTX-3090-24GB", "RTX-A6000-48GB", "T4-16GB", "L4-24GB", "A10-24GB",
            "V100-PCIe-16GB"}


def catalogue_parts() -> tuple[tuple[GpuModel, ...], tuple[Region, ...], tuple[tuple[str, str, float], ...]]:
    models = tuple(
        GpuModel(id=m.id, vendor=m.vendor, memory_gib=m.memory_gib,
                 compute_units=m.compute_units, tdp_watts=m.tdp_watts)
        for m in catalogue.gpu_models().values()
    )
    regions = tuple(Region(id=r.id, carbon_g_per_kwh=r.carbon_g_per_kwh)
                    for r in catalogue.regions().values())
    lat = tuple(sorted((a, b, ms) for (a, b), ms in catalogue.latency_matrix().items()))
    return models, regions, lat


def make_round(n_offers: int, n_bids: int, seed: int = 0, config: RoundConfig | None = None) -> RoundInput:
    rng = np.random.default_rng(seed)
    models, regions, lat = catalogue_parts()
    specs = catalogue.gpu_models()
    model_ids = [m.id for m in models]
    region_ids = [r.id for r in regions]
    # supply is denser in the big markets
    rw = np.array([3, 2, 2, 1, 0.5, 2, 1, 2, 1, 0.5, 1, 1, 1, 0.5])[: len(region_ids)]
    rw = rw / rw.sum()
    mw = np.array([3 if m in INFERENCE else 2 for m in model_ids], dtype=float)
    mw = mw / mw.sum()
    offers = []
    for i in range(n_offers):
        m = model_ids[int(rng.choice(len(model_ids), p=mw))]
        size = int(rng.choice([1, 2, 4], p=[0.5, 0.3, 0.2])) if m in CONSUMER else int(
            rng.choice([1, 2, 4, 8], p=[0.1, 0.15, 0.25, 0.5]))
        free = size if rng.random() < 0.8 else int(rng.integers(1, size + 1))
        base = specs[m].usd_per_hour * 1e6
        ask = int(round(base * rng.lognormal(0.0, 0.15), -3))
        until = None if rng.random() < 0.6 else NOW + int(rng.integers(86_400, 30 * 86_400))
        offers.append(Offer(
            id=i + 1, provider_id=int(rng.integers(1, max(2, n_offers // 20))), machine_id=i + 1,
            region=region_ids[int(rng.choice(len(region_ids), p=rw))], gpu_model=m, gpus=free,
            ask=ask, min_duration_s=0 if rng.random() < 0.9 else 3600,
            max_duration_s=30 * 86_400, available_from=NOW - int(rng.integers(0, 86_400)),
            available_until=until, spot_allowed=bool(rng.random() < 0.8),
            reserved_only=bool(rng.random() < 0.05),
            reliability=float(round(0.9 + 0.099 * rng.random(), 3)),
            created_at=NOW - int(rng.integers(0, 86_400)),
        ))
    bids = []
    for i in range(n_bids):
        if rng.random() < 0.65:  # inference
            gpus = 1 if rng.random() < 0.8 else 2
            dur = int(rng.integers(1, 13)) * 1800
            if rng.random() < 0.5:
                mem = int(rng.choice([16, 24, 48, 80]))
                fits = [x for x in model_ids if specs[x].memory_gib >= mem]
                level = sorted(specs[x].usd_per_hour for x in fits)[min(2, len(fits) - 1)]
                allowed: tuple[str, ...] = ()
            else:
                mem = 0
                k = int(rng.integers(1, 4))
                allowed = tuple(sorted(rng.choice(INFERENCE, size=k, replace=False).tolist()))
                level = max(specs[x].usd_per_hour for x in allowed)
            loc = region_ids[int(rng.choice(len(region_ids), p=rw))]
            max_lat: float | None = float(rng.choice([40, 60, 100, 150]))
            regions_allowed: tuple[str, ...] = ()
            klass = str(rng.choice(["on_demand", "spot", "reserved"], p=[0.7, 0.25, 0.05]))
            same = True
        else:  # training
            gpus = int(rng.choice([4, 8, 16], p=[0.45, 0.5, 0.05]))
            dur = int(rng.integers(12, 169)) * 3600
            k = int(rng.integers(1, 3))
            allowed = tuple(sorted(rng.choice(TRAINING, size=k, replace=False).tolist()))
            level = max(specs[x].usd_per_hour for x in allowed)
            mem = 0
            loc = None
            max_lat = None
            regions_allowed = () if rng.random() < 0.4 else tuple(sorted(
                rng.choice(region_ids, size=int(rng.integers(2, 6)), replace=False).tolist()))
            klass = str(rng.choice(["reserved", "on_demand", "spot"], p=[0.2, 0.6, 0.2]))
            same = gpus <= 8 and rng.random() < 0.95
        max_price = int(round(level * 1e6 * rng.lognormal(0.05, 0.2), -3))
        pref = tuple(sorted(rng.choice(region_ids, size=2, replace=False).tolist())) if rng.random() < 0.3 else ()
        bids.append(Bid(
            id=i + 1, buyer_id=int(rng.integers(1, max(2, n_bids // 10))), gpus=gpus,
            gpu_models=allowed, min_memory_gib=mem, min_compute_units=0.0,
            vendor="nvidia" if (not allowed and rng.random() < 0.3) else None,
            same_machine=same, allowed_regions=regions_allowed, preferred_regions=pref,
            location_region=loc, max_latency_ms=max_lat, max_price=max_price, duration_s=dur,
            deadline=None if rng.random() < 0.8 else NOW + dur * int(rng.integers(1, 4)),
            klass=klass, min_reliability=float(rng.choice([0.0, 0.0, 0.9, 0.95])),
            weights=DEFAULT_WEIGHTS, created_at=NOW - int(rng.integers(0, 3600)),
        ))
    return RoundInput(now=NOW, offers=tuple(offers), bids=tuple(bids), gpu_models=models,
                      regions=regions, latency_ms=lat, config=config or RoundConfig())
