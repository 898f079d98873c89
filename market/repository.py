"""The one place where ORM rows become matching-engine objects.

`snapshot()` reads the open book in one transaction and returns a pure
`RoundInput`; nothing in `market/engine` ever sees a model instance.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction

from contracts.receipts import job_ports
from market import bookings, engine, grid_carbon
from market.models import Bid, Offer, Trade
from market.states import BidState, JobState, OfferState
from providers import catalogue
from providers.models import GpuModel


def _epoch(dt: datetime | None) -> int | None:
    return None if dt is None else int(dt.timestamp())


def weights_to_domain(overrides: dict[str, Any]) -> engine.Weights:
    known = {f.name for f in dataclasses.fields(engine.Weights)}
    return dataclasses.replace(engine.DEFAULT_WEIGHTS, **{k: float(v) for k, v in (overrides or {}).items() if k in known})


def bid_to_domain(bid: Bid) -> engine.Bid:
    return engine.Bid(
        id=bid.pk,
        buyer_id=bid.buyer_id,
        gpus=bid.gpus,
        gpu_models=tuple(bid.gpu_models),
        min_memory_gib=bid.min_memory_gib,
        min_compute_units=float(bid.min_compute_units),
        vendor=bid.vendor or None,
        same_machine=bid.same_machine,
        allowed_regions=tuple(bid.allowed_regions),
        preferred_regions=tuple(bid.preferred_regions),
        location_region=bid.location_region_id,
        max_latency_ms=bid.max_latency_ms,
        max_price=bid.max_price,
        duration_s=bid.duration_s,
        deadline=_epoch(bid.deadline),
        klass=bid.klass,
        min_reliability=float(bid.min_reliability),
        weights=weights_to_domain(bid.weights),
        created_at=_epoch(bid.created_at) or 0,
        # the provider's agent refuses these after matching on a machine that cannot run
        # them (providers/agent/daemon.py refusal): the engine does not match them there
        needs_containers=bool((bid.job_spec or {}).get("image")) and not (bid.job_spec or {}).get("command"),
        needs_ports=bool(job_ports(bid.job_spec or {})),
        min_cuda=bid.min_cuda,
        min_ram_gib=bid.min_ram_gib,
        min_disk_gb=bid.min_disk_gb,
        min_net_down_mbps=bid.min_net_down_mbps,
        runtime_p90_s=_quantile(bid.runtime_prediction, "p90_s"),
        runtime_p50_s=_quantile(bid.runtime_prediction, "p50_s"),
        needs_nvlink=bid.needs_nvlink,
    )


def _quantile(prediction: Any, name: str) -> int | None:
    """A run-time quantile (p50_s, p90_s) a bid was placed with (market.predictions), None without one."""
    v = prediction.get(name) if isinstance(prediction, dict) else None
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v >= 1 else None


def offer_to_domain(offer: Offer) -> engine.Offer:
    return engine.Offer(
        id=offer.pk,
        provider_id=offer.machine.provider_id,
        machine_id=offer.machine_id,
        region=offer.machine.region_id,
        gpu_model=offer.gpu_model_id,
        gpus=offer.gpus_free,
        ask=offer.price,
        min_duration_s=offer.min_duration_s,
        max_duration_s=offer.max_duration_s,
        available_from=_epoch(offer.available_from) or 0,
        available_until=_epoch(offer.available_until),
        spot_allowed=offer.spot_allowed,
        reserved_only=offer.reserved_only,
        spot_only=offer.reclaimable,
        reliability=float(offer.machine.reliability),
        created_at=_epoch(offer.created_at) or 0,
        containers=offer.machine.runs_containers,
        ports=offer.machine.publishes_ports,
        cuda=offer.machine.cuda,
        ram_gib=offer.machine.ram_gib,
        disk_gb=offer.machine.disk_gb,
        net_down_mbps=offer.machine.net_down_mbps,
    )


def catalogue_to_domain(now: datetime) -> tuple[tuple[engine.GpuModel, ...], tuple[engine.Region, ...], tuple[tuple[str, str, float], ...]]:
    """The catalogue as the engine sees it at ``now``: each region's carbon intensity is its
    grid's at that hour (CARBON_FEED, market.grid_carbon), its constant where there is none."""
    models = tuple(engine.GpuModel(m.id, m.vendor, m.memory_gib, float(m.compute_units), m.tdp_watts) for m in GpuModel.objects.order_by("id"))
    regions = tuple(engine.Region(r, reading.g_per_kwh[0], reading.g_per_kwh if reading.source != "constant" else ())
                    for r, reading in grid_carbon.carbon_ahead(now).items())
    ids = {r.id for r in regions}
    latency = tuple(sorted((a, b, ms) for (a, b), ms in catalogue.latency_matrix().items() if a in ids and b in ids))
    return models, regions, latency


def round_config() -> engine.RoundConfig:
    return engine.RoundConfig(
        pricing=settings.GRIDBID["PRICING_RULE"],
        fair_share_cap=settings.GRIDBID["FAIR_SHARE_CAP"],
        price_point=settings.GRIDBID["PRICE_POINT"],
        pack_band=round(settings.GRIDBID.get("PACK_BAND", 0.0) * 1_000_000),
    )


def nvlink_free(offers: list[Offer]) -> dict[int, int]:
    """Per offer on a machine with NVLink domains, the most of its model's GPUs free (no held
    booking takes them) inside one domain (issue 38): what a bid that needs NVLink may take."""
    gpus_free = {o.pk: o.gpus_free for o in offers}
    linked = bookings.free_gpus(offers, linked_only=True)
    return {pk: min(max(Counter(g for _, g in free).values()), gpus_free[pk]) for pk, free in linked.items() if free}


@transaction.atomic
def snapshot(*, now: datetime, extra_bids: tuple[engine.Bid, ...] = ()) -> engine.RoundInput:
    """The open book at `now`, read in one transaction, as a pure engine input."""
    bids = tuple(bid_to_domain(b) for b in Bid.objects.filter(state=BidState.OPEN, expires_at__gt=now).order_by("id"))
    rows = list(Offer.objects.filter(state=OfferState.OPEN, gpus_free__gt=0).select_related("machine").order_by("id"))
    linked = nvlink_free(rows)
    offers = tuple(dataclasses.replace(offer_to_domain(o), nvlink_gpus=linked.get(o.pk, 0)) for o in rows)
    running = tuple(
        engine.RunningJob(trade_id=t.pk, offer_id=t.offer_id, machine_id=t.offer.machine_id, gpus=t.gpus, klass=t.bid.klass, price=t.price,
                          stopping=bool((t.job.checkpoint or {}).get("preempt_requested")))
        # an extension runs as its trade's job (its Job mirrors it): one unit, the trade it extends
        for t in Trade.objects.filter(bid__klass="spot", extends__isnull=True, job__state__in=[JobState.ASSIGNED, JobState.RUNNING, JobState.CHECKPOINTED])
        .select_related("offer", "bid", "job").order_by("id")
    )
    # open offers spot jobs fill: nothing to clear on them, but what preempting would free
    spot_held: dict[int, int] = {}
    for j in running:
        spot_held[j.offer_id] = spot_held.get(j.offer_id, 0) + j.gpus
    occupied = tuple(
        dataclasses.replace(offer_to_domain(o), gpus=spot_held[o.pk])
        for o in Offer.objects.filter(pk__in=list(spot_held), state=OfferState.OPEN, gpus_free=0).select_related("machine").order_by("id")
    )
    models, regions, latency = catalogue_to_domain(now)
    return engine.RoundInput(
        now=int(now.timestamp()),
        offers=offers,
        bids=bids + extra_bids,
        gpu_models=models,
        regions=regions,
        latency_ms=latency,
        running=running,
        config=round_config(),
        occupied=occupied,
    )
