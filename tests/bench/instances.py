"""Realistic random rounds for the engine benchmark and its tests.

Catalogue GPU models and regions (with the coordinate-based latency matrix),
asks drawn around each model's public price level, machines of 1/2/4/8 GPUs
(data-centre cards mostly in 8-GPU servers, consumer cards in small boxes),
and two kinds of job: inference (short, 1-2 GPUs, latency-bound, often "any
GPU with enough memory") and training (long, 4-16 GPUs, named models, wide
region choice). Seeded: the same (n, seed) gives the same round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np

from market.engine import (
    CLASSES,
    DEFAULT_WEIGHTS,
    Bid,
    GpuModel,
    Offer,
    Region,
    RoundConfig,
    RoundInput,
    Weights,
    limits,
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


# --- instance families (issue 29) -------------------------------------------------------
#
# Each family is a function (seed, orders a side) -> RoundInput that the engine accepts
# (types.py, limits.py, validate.py). They stress one thing each: heavy-tailed sizes, a
# scarce region, many equal asks, narrow model sets, multi-machine jobs, all-spot,
# all-reserved, one huge bid, binding fair-share caps, and values at the validated limits;
# `catalogue` is make_round above. `tests/unit/engine/test_issue29_quality.py` clears
# them against an exact lexicographic MILP, and `tests/bench/bench_families.py` times them.

FAMILY_MODELS = ("H100-SXM-80GB", "A100-SXM-80GB", "L40S-48GB", "RTX-4090-24GB", "MI300X-192GB")
FAMILY_REGIONS = ("us-east", "eu-west", "eu-central", "ap-south")
HOUR = 3600
DAY = 86_400


@dataclass(frozen=True)
class Knobs:
    """What a family changes in the common draw (`_draw`); the defaults are a thick,
    ordinary market of 1-8 GPU machines and 1-8 GPU jobs over five models in four regions."""

    offer_sizes: tuple[int, ...] = (1, 2, 4, 8)
    offer_size_p: tuple[float, ...] = (0.2, 0.2, 0.3, 0.3)
    bid_sizes: tuple[int, ...] = (1, 2, 4, 8)
    bid_size_p: tuple[float, ...] = (0.4, 0.25, 0.2, 0.15)
    multi_p: float = 0.1  # share of bids that may span machines (same_machine=False)
    klass_p: tuple[float, float, float] = (0.2, 0.6, 0.2)  # reserved, on-demand, spot
    offer_region_p: tuple[float, ...] = (0.35, 0.3, 0.25, 0.1)
    region_limited_p: float = 0.3  # share of bids naming their allowed regions
    models_per_bid: tuple[int, ...] = (1, 2, 3)
    by_memory_p: float = 0.2  # share of bids asking "any model with this much memory"
    ask_sigma: float = 0.15  # lognormal spread of asks around the model's price
    ask_step: int = 1_000  # asks are rounded to this many base units
    price_mu: float = 0.1  # lognormal centre and spread of a bid's price over its models' price
    price_sigma: float = 0.2
    hours: tuple[int, int] = (1, 48)
    spot_allowed_p: float = 0.8
    reserved_only_p: float = 0.05
    buyers: int = 0  # 0: one buyer per ten bids
    latency_p: float = 0.3  # share of bids with a location and a latency limit
    min_rel: tuple[float, ...] = (0.0, 0.0, 0.9, 0.95)
    config: RoundConfig = field(default_factory=RoundConfig)


def _draw(rng: np.random.Generator, n: int, k: Knobs) -> tuple[list[Offer], list[Bid], RoundInput]:
    models, regions, lat = catalogue_parts()
    specs = catalogue.gpu_models()
    usd = {m: specs[m].usd_per_hour for m in FAMILY_MODELS}
    mem = {m: specs[m].memory_gib for m in FAMILY_MODELS}
    offers: list[Offer] = []
    om = rng.choice(len(FAMILY_MODELS), size=n)
    orr = rng.choice(len(FAMILY_REGIONS), size=n, p=k.offer_region_p)
    osz = rng.choice(k.offer_sizes, size=n, p=k.offer_size_p)
    for i in range(n):
        model = FAMILY_MODELS[int(om[i])]
        ask = int(round(usd[model] * 1e6 * rng.lognormal(0.0, k.ask_sigma) / k.ask_step)) * k.ask_step
        offers.append(Offer(
            id=i + 1, provider_id=1 + int(rng.integers(0, max(1, n // 8))), machine_id=i + 1,
            region=FAMILY_REGIONS[int(orr[i])], gpu_model=model, gpus=int(osz[i]), ask=max(0, ask),
            min_duration_s=0 if rng.random() < 0.9 else HOUR, max_duration_s=60 * DAY,
            available_from=NOW - int(rng.integers(0, DAY)),
            available_until=None if rng.random() < 0.7 else NOW + int(rng.integers(2, 30)) * DAY,
            spot_allowed=bool(rng.random() < k.spot_allowed_p),
            reserved_only=bool(rng.random() < k.reserved_only_p),
            reliability=round(0.85 + 0.149 * float(rng.random()), 3), created_at=NOW - int(rng.integers(0, DAY)),
        ))
    bids: list[Bid] = []
    buyers = k.buyers or max(2, n // 10)
    for i in range(n):
        gpus = int(rng.choice(k.bid_sizes, p=k.bid_size_p))
        same = not (rng.random() < k.multi_p)
        if rng.random() < k.by_memory_p:
            need = int(rng.choice([24, 48, 80]))
            allowed: tuple[str, ...] = ()
            fits = sorted(usd[m] for m in FAMILY_MODELS if mem[m] >= need)
            level = fits[min(1, len(fits) - 1)]
        else:
            need = 0
            pick = rng.permutation(len(FAMILY_MODELS))[: int(rng.choice(k.models_per_bid))]
            allowed = tuple(sorted(FAMILY_MODELS[j] for j in pick.tolist()))
            level = max(usd[m] for m in allowed)
        regions_allowed: tuple[str, ...] = ()
        if rng.random() < k.region_limited_p:
            pick = rng.permutation(len(FAMILY_REGIONS))[: int(rng.integers(1, 3))]
            regions_allowed = tuple(sorted(FAMILY_REGIONS[j] for j in pick.tolist()))
        location: str | None = None
        max_lat: float | None = None
        if rng.random() < k.latency_p:
            location = FAMILY_REGIONS[int(rng.integers(0, len(FAMILY_REGIONS)))]
            max_lat = float(rng.choice([30.0, 90.0, 200.0]))
        klass = CLASSES[int(rng.choice(3, p=k.klass_p))]
        dur = int(rng.integers(k.hours[0], k.hours[1] + 1)) * HOUR
        bids.append(Bid(
            id=i + 1, buyer_id=1 + int(rng.integers(0, buyers)), gpus=gpus, gpu_models=allowed,
            min_memory_gib=need, min_compute_units=0.0, vendor=None, same_machine=same,
            allowed_regions=regions_allowed,
            preferred_regions=(FAMILY_REGIONS[int(rng.integers(0, len(FAMILY_REGIONS)))],) if rng.random() < 0.3 else (),
            location_region=location, max_latency_ms=max_lat,
            max_price=int(round(level * 1e6 * rng.lognormal(k.price_mu, k.price_sigma), -3)),
            duration_s=dur, deadline=None if rng.random() < 0.9 else NOW + 2 * dur, klass=klass,
            min_reliability=float(rng.choice(k.min_rel)), weights=DEFAULT_WEIGHTS,
            created_at=NOW - int(rng.integers(0, HOUR)),
        ))
    inp = RoundInput(now=NOW, offers=tuple(offers), bids=tuple(bids), gpu_models=models, regions=regions,
                     latency_ms=lat, config=k.config)
    return offers, bids, inp


def heavy_tailed(seed: int, n: int) -> RoundInput:
    """Machine and job sizes from a power law (1 to 64 GPUs; most jobs of 1, a few of
    dozens spanning machines), durations from an hour to two months."""
    rng = np.random.default_rng([29, 1, seed])
    sizes = (1, 2, 4, 8, 16, 32, 64)
    p = np.asarray([1 / s**1.1 for s in sizes])
    k = Knobs(offer_sizes=sizes, offer_size_p=tuple((p / p.sum()).tolist()), bid_sizes=sizes,
              bid_size_p=tuple((p / p.sum()).tolist()), multi_p=0.25, hours=(1, 1440))
    _, bids, inp = _draw(rng, n, k)
    # a job larger than 8 GPUs mostly spans machines, as big jobs do
    bids = [replace(b, same_machine=b.same_machine and (b.gpus <= 8 or rng.random() < 0.3)) for b in bids]
    return replace(inp, bids=tuple(bids))


def scarce_region(seed: int, n: int) -> RoundInput:
    """One region holds 4% of the machines and most of the demand: two thirds of the bids
    accept only ap-south, or must be within 30 ms of it."""
    rng = np.random.default_rng([29, 2, seed])
    k = Knobs(offer_region_p=(0.32, 0.32, 0.32, 0.04), region_limited_p=0.0, latency_p=0.0)
    _, bids, inp = _draw(rng, n, k)
    out = []
    for b in bids:
        u = rng.random()
        if u < 0.45:
            b = replace(b, allowed_regions=("ap-south",))
        elif u < 0.67:
            b = replace(b, location_region="ap-south", max_latency_ms=30.0)
        out.append(b)
    return replace(inp, bids=tuple(out))


def ties(seed: int, n: int) -> RoundInput:
    """Many equal asks: two price levels per model, one reliability, bids at three price
    levels with one duration, so whole sets of pairs score the same."""
    rng = np.random.default_rng([29, 3, seed])
    k = Knobs(ask_sigma=0.0, price_sigma=0.0, hours=(4, 4), multi_p=0.1, latency_p=0.0,
              region_limited_p=0.0, by_memory_p=0.0, min_rel=(0.0,))
    offers, bids, inp = _draw(rng, n, k)
    offers = [replace(o, ask=o.ask + (250_000 if rng.random() < 0.3 else 0), reliability=0.95) for o in offers]
    bids = [replace(b, max_price=b.max_price + int(rng.choice([0, 500_000, 1_000_000])), preferred_regions=())
            for b in bids]
    return replace(inp, offers=tuple(offers), bids=tuple(bids))


def narrow_models(seed: int, n: int) -> RoundInput:
    """Each bid names exactly one model, and supply leans to other models than demand."""
    rng = np.random.default_rng([29, 4, seed])
    k = Knobs(models_per_bid=(1,), by_memory_p=0.0)
    offers, bids, inp = _draw(rng, n, k)
    lean = rng.permutation(len(FAMILY_MODELS))
    supply_p = np.asarray([0.4, 0.3, 0.15, 0.1, 0.05])[np.argsort(lean)]
    demand_p = supply_p[::-1] / supply_p.sum()
    offers = [replace(o, gpu_model=FAMILY_MODELS[int(rng.choice(len(FAMILY_MODELS), p=supply_p))]) for o in offers]
    bids = [replace(b, gpu_models=(FAMILY_MODELS[int(rng.choice(len(FAMILY_MODELS), p=demand_p))],),
                    max_price=int(round(catalogue.gpu_models()[FAMILY_MODELS[0]].usd_per_hour * 1e6
                                        * rng.lognormal(0.0, 0.4), -3)))
            for b in bids]
    return replace(inp, offers=tuple(offers), bids=tuple(bids))


def multi_machine(seed: int, n: int) -> RoundInput:
    """Most jobs may span machines: 3 to 24 GPUs over machines of 1 to 8."""
    rng = np.random.default_rng([29, 5, seed])
    k = Knobs(bid_sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24), bid_size_p=(0.1, 0.1, 0.15, 0.15, 0.15, 0.15, 0.1, 0.05, 0.05),
              multi_p=0.7)
    return _draw(rng, n, k)[2]


def all_spot(seed: int, n: int) -> RoundInput:
    """Every bid is spot, and 40% of the machines do not take spot work."""
    rng = np.random.default_rng([29, 6, seed])
    return _draw(rng, n, Knobs(klass_p=(0.0, 0.0, 1.0), spot_allowed_p=0.6))[2]


def all_reserved(seed: int, n: int) -> RoundInput:
    """Every bid is reserved, and a third of the machines are reserved-only."""
    rng = np.random.default_rng([29, 7, seed])
    return _draw(rng, n, Knobs(klass_p=(1.0, 0.0, 0.0), reserved_only_p=0.33))[2]


def one_huge_bid(seed: int, n: int) -> RoundInput:
    """An ordinary market and one job that wants half of all the GPUs of one model,
    across machines, at a price well over the market's."""
    rng = np.random.default_rng([29, 8, seed])
    offers, bids, inp = _draw(rng, n, Knobs())
    model = FAMILY_MODELS[int(rng.integers(0, 2))]
    supply = sum(o.gpus for o in offers if o.gpu_model == model)
    huge = replace(bids[0], gpus=max(2, supply // 2), gpu_models=(model,), min_memory_gib=0, same_machine=False,
                   allowed_regions=(), location_region=None, max_latency_ms=None, deadline=None,
                   klass=str(rng.choice(["reserved", "on_demand"])), min_reliability=0.0,
                   max_price=int(catalogue.gpu_models()[model].usd_per_hour * 1e6 * 1.6))
    return replace(inp, bids=(huge, *bids[1:]))


def fair_share(seed: int, n: int) -> RoundInput:
    """A binding fair-share cap (0.25 or 0.5) among 3 to 5 buyers, twice as many GPUs bid as
    offered, most bids reserved: the issue's case was 41 reserved bids, 21 offers, cap 0.5."""
    rng = np.random.default_rng([29, 9, seed])
    cap = float(rng.choice([0.25, 0.5]))
    k = Knobs(klass_p=(0.7, 0.2, 0.1), buyers=int(rng.integers(3, 6)), region_limited_p=0.5,
              models_per_bid=(1, 2), config=RoundConfig(fair_share_cap=cap))
    offers, bids, inp = _draw(rng, n, k)
    return replace(inp, offers=tuple(offers[: max(2, n // 2)]))


def at_limits(seed: int, n: int) -> RoundInput:
    """Values at the validated limits (limits.py): prices and asks near MAX_PRICE, score
    weights of MAX_WEIGHT, ten-year jobs, latency limits of MAX_LATENCY_MS, offers of up to
    MAX_GPUS, bids of up to 1,000 GPUs: the scores pass 2**63 unless counted coarser."""
    rng = np.random.default_rng([29, 10, seed])
    offers, bids, inp = _draw(rng, n, Knobs(offer_sizes=(1, 8, 1000, limits.MAX_GPUS),
                                           offer_size_p=(0.4, 0.3, 0.2, 0.1), bid_sizes=(1, 8, 64, 1000),
                                           bid_size_p=(0.4, 0.3, 0.2, 0.1)))
    top = limits.MAX_PRICE
    big = [replace(o, ask=top - int(rng.integers(0, 10**11)) if rng.random() < 0.5 else o.ask,
                   max_duration_s=limits.MAX_DURATION_S, available_until=None, min_duration_s=0,
                   reliability=1.0 if rng.random() < 0.3 else o.reliability)
           for o in offers]
    out = []
    for b in bids:
        u = rng.random()
        w = Weights(latency_per_ms=limits.MAX_WEIGHT if u < 0.1 else DEFAULT_WEIGHTS.latency_per_ms,
                    non_preferred_region=limits.MAX_WEIGHT if 0.1 <= u < 0.2 else DEFAULT_WEIGHTS.non_preferred_region,
                    carbon_per_kg=DEFAULT_WEIGHTS.carbon_per_kg,
                    reliability=limits.MAX_WEIGHT if 0.2 <= u < 0.4 else DEFAULT_WEIGHTS.reliability)
        out.append(replace(
            b, weights=w, max_price=top if rng.random() < 0.6 else b.max_price,
            duration_s=limits.MAX_DURATION_S if rng.random() < 0.3 else b.duration_s, deadline=None,
            max_latency_ms=limits.MAX_LATENCY_MS if b.location_region is not None else None,
            min_reliability=1.0 if rng.random() < 0.1 else b.min_reliability,
        ))
    return replace(inp, offers=tuple(big), bids=tuple(out))


def catalogue_round(seed: int, n: int) -> RoundInput:
    """make_round above: the whole catalogue, inference and training jobs."""
    return make_round(n, n, seed=seed)


FAMILIES: dict[str, Callable[[int, int], RoundInput]] = {
    "heavy_tailed": heavy_tailed,
    "scarce_region": scarce_region,
    "ties": ties,
    "narrow_models": narrow_models,
    "multi_machine": multi_machine,
    "all_spot": all_spot,
    "all_reserved": all_reserved,
    "one_huge_bid": one_huge_bid,
    "fair_share": fair_share,
    "at_limits": at_limits,
    "catalogue": catalogue_round,
}


def next_round(inp: RoundInput, seed: int, churn: float = 0.10) -> RoundInput:
    """The next round of a continuous market (issue 35's warm rounds): about ``churn`` of
    the book changed. Half of it on the bids: that many leave (filled or cancelled) and as
    many new ones arrive, drawn like the rest; half on the offers: some repriced by up to
    5% either way, some with a GPU sold. Five seconds later. Seeded."""
    rng = np.random.default_rng(seed)
    bids, offers = list(inp.bids), list(inp.offers)
    k = int(round(len(bids) * churn / 2))
    gone = set(rng.choice(len(bids), size=k, replace=False).tolist()) if k else set()
    top = max((b.id for b in bids), default=0)
    arrivals = make_round(max(1, k), max(1, k), seed=seed + 1_000_003, config=inp.config).bids[:k]
    kept = [b for i, b in enumerate(bids) if i not in gone]
    kept += [replace(b, id=top + 1 + i) for i, b in enumerate(arrivals)]
    m = int(round(len(offers) * churn / 2))
    for j, i in enumerate(rng.choice(len(offers), size=m, replace=False).tolist() if m else []):
        o = offers[i]
        offers[i] = replace(o, ask=max(1, int(o.ask * rng.uniform(0.95, 1.05)))) if j % 2 or o.gpus == 1 else replace(o, gpus=o.gpus - 1)
    return replace(inp, now=inp.now + 5, bids=tuple(kept), offers=tuple(offers))
