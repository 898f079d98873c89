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
    """All draws are vectorised; only the dataclasses are built one by one."""
    rng = np.random.default_rng(seed)
    models, regions, lat = catalogue_parts()
    specs = catalogue.gpu_models()
    model_ids = [m.id for m in models]
    region_ids = [r.id for r in regions]
    nm, nr = len(model_ids), len(region_ids)
    usd = np.asarray([specs[m].usd_per_hour for m in model_ids])
    mem_of = np.asarray([specs[m].memory_gib for m in model_ids])
    consumer = np.asarray([m in CONSUMER for m in model_ids])
    # supply is denser in the big markets
    rw = np.array([3, 2, 2, 1, 0.5, 2, 1, 2, 1, 0.5, 1, 1, 1, 0.5])[:nr]
    rw = rw / rw.sum()
    mw = np.array([3 if m in INFERENCE else 2 for m in model_ids], dtype=float)
    mw = mw / mw.sum()

    n = n_offers
    om = rng.choice(nm, size=n, p=mw)
    size = np.where(
        consumer[om],
        rng.choice([1, 2, 4], size=n, p=[0.5, 0.3, 0.2]),
        rng.choice([1, 2, 4, 8], size=n, p=[0.1, 0.15, 0.25, 0.5]),
    )
    free = np.where(rng.random(n) < 0.8, size, np.floor(rng.random(n) * size).astype(np.int64) + 1)
    ask = (np.round(usd[om] * 1e6 * rng.lognormal(0.0, 0.15, n), -3)).astype(np.int64)
    until = np.where(rng.random(n) < 0.6, -1, NOW + rng.integers(86_400, 30 * 86_400, n))
    provider = rng.integers(1, max(2, n_offers // 20), n)
    oregion = rng.choice(nr, size=n, p=rw)
    min_dur = np.where(rng.random(n) < 0.9, 0, 3600)
    avail = NOW - rng.integers(0, 86_400, n)
    spot = rng.random(n) < 0.8
    resv = rng.random(n) < 0.05
    rel = np.round(0.9 + 0.099 * rng.random(n), 3)
    created = NOW - rng.integers(0, 86_400, n)
    offers = tuple(
        Offer(id=i + 1, provider_id=p_, machine_id=i + 1, region=region_ids[r_], gpu_model=model_ids[m_],
              gpus=g_, ask=a_, min_duration_s=md_, max_duration_s=30 * 86_400, available_from=af_,
              available_until=None if u_ < 0 else u_, spot_allowed=sp_, reserved_only=rs_,
              reliability=rl_, created_at=c_)
        for i, (p_, r_, m_, g_, a_, md_, af_, u_, sp_, rs_, rl_, c_) in enumerate(zip(
            provider.tolist(), oregion.tolist(), om.tolist(), free.tolist(), ask.tolist(),
            min_dur.tolist(), avail.tolist(), until.tolist(), spot.tolist(), resv.tolist(),
            rel.tolist(), created.tolist(), strict=True))
    )

    n = n_bids
    infer = rng.random(n) < 0.65
    # inference: 1-2 GPUs, short, latency-bound, by memory or by named models
    i_gpus = np.where(rng.random(n) < 0.8, 1, 2)
    i_dur = rng.integers(1, 13, n) * 1800
    by_mem = rng.random(n) < 0.5
    mem = rng.choice([16, 24, 48, 80], size=n)
    # the price level of a memory bid: the third-cheapest model that fits
    level_mem = {}
    for mm in (16, 24, 48, 80):
        fits = np.sort(usd[mem_of >= mm])
        level_mem[mm] = float(fits[min(2, len(fits) - 1)])
    inf_idx = np.asarray([model_ids.index(m) for m in INFERENCE])
    trn_idx = np.asarray([model_ids.index(m) for m in TRAINING])
    i_k = rng.integers(1, 4, n)
    i_pick = np.argsort(rng.random((n, len(INFERENCE))), axis=1)[:, :3]
    loc = rng.choice(nr, size=n, p=rw)
    max_lat = rng.choice([40.0, 60.0, 100.0, 150.0], size=n)
    i_klass = rng.choice(3, size=n, p=[0.7, 0.25, 0.05])  # on_demand, spot, reserved
    # training: 4-16 GPUs, long, named models, wide region choice
    t_gpus = rng.choice([4, 8, 16], size=n, p=[0.45, 0.5, 0.05])
    t_dur = rng.integers(12, 169, n) * 3600
    t_k = rng.integers(1, 3, n)
    t_pick = np.argsort(rng.random((n, len(TRAINING))), axis=1)[:, :2]
    any_region = rng.random(n) < 0.4
    n_reg = rng.integers(2, 6, n)
    reg_pick = np.argsort(rng.random((n, nr)), axis=1)[:, :5]
    t_klass = rng.choice(3, size=n, p=[0.2, 0.6, 0.2])  # reserved, on_demand, spot
    t_same = rng.random(n) < 0.95
    price_f = rng.lognormal(0.05, 0.2, n)
    has_pref = rng.random(n) < 0.3
    pref_pick = np.argsort(rng.random((n, nr)), axis=1)[:, :2]
    nvidia = rng.random(n) < 0.3
    buyer = rng.integers(1, max(2, n_bids // 10), n)
    deadline_mult = np.where(rng.random(n) < 0.8, 0, rng.integers(1, 4, n))
    min_rel = rng.choice([0.0, 0.0, 0.9, 0.95], size=n)
    created_b = NOW - rng.integers(0, 3600, n)
    i_names = ("on_demand", "spot", "reserved")
    t_names = ("reserved", "on_demand", "spot")

    bids = []
    for i in range(n):
        if infer[i]:
            gpus = int(i_gpus[i])
            dur = int(i_dur[i])
            if by_mem[i]:
                m_gib = int(mem[i])
                level = level_mem[m_gib]
                allowed: tuple[str, ...] = ()
            else:
                m_gib = 0
                idx = inf_idx[i_pick[i, : int(i_k[i])]]
                allowed = tuple(sorted(model_ids[j] for j in idx.tolist()))
                level = float(usd[idx].max())
            location: str | None = region_ids[int(loc[i])]
            lat_ms: float | None = float(max_lat[i])
            regions_allowed: tuple[str, ...] = ()
            klass = i_names[int(i_klass[i])]
            same = True
        else:
            gpus = int(t_gpus[i])
            dur = int(t_dur[i])
            idx = trn_idx[t_pick[i, : int(t_k[i])]]
            allowed = tuple(sorted(model_ids[j] for j in idx.tolist()))
            level = float(usd[idx].max())
            m_gib = 0
            location = None
            lat_ms = None
            regions_allowed = () if any_region[i] else tuple(
                sorted(region_ids[j] for j in reg_pick[i, : int(n_reg[i])].tolist()))
            klass = t_names[int(t_klass[i])]
            same = gpus <= 8 and bool(t_same[i])
        pref = tuple(sorted(region_ids[j] for j in pref_pick[i].tolist())) if has_pref[i] else ()
        dm = int(deadline_mult[i])
        bids.append(Bid(
            id=i + 1, buyer_id=int(buyer[i]), gpus=gpus, gpu_models=allowed, min_memory_gib=m_gib,
            min_compute_units=0.0, vendor="nvidia" if (not allowed and nvidia[i]) else None,
            same_machine=same, allowed_regions=regions_allowed, preferred_regions=pref,
            location_region=location, max_latency_ms=lat_ms,
            max_price=int(round(level * 1e6 * float(price_f[i]), -3)), duration_s=dur,
            deadline=None if dm == 0 else NOW + dur * dm, klass=klass,
            min_reliability=float(min_rel[i]), weights=DEFAULT_WEIGHTS, created_at=int(created_b[i]),
        ))
    return RoundInput(now=NOW, offers=offers, bids=tuple(bids), gpu_models=models,
                      regions=regions, latency_ms=lat, config=config or RoundConfig())
