"""Input validation: one typed error naming the first bad field.

Field paths index the input as given (``bids[3].max_price``), before the
engine sorts anything, so the API can point at what the caller sent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

from .limits import (
    MAX_CARBON_HOURS,
    MAX_COMPUTE_UNITS,
    MAX_CUDA,
    MAX_DURATION_S,
    MAX_GPUS,
    MAX_HOST,
    MAX_LATENCY_MS,
    MAX_MEMORY_GIB,
    MAX_PRICE,
    MAX_WEIGHT,
)
from .shares import UNITS as SHARE_UNITS
from .types import (
    CLASSES,
    PRICING_RULES,
    Bid,
    EngineInputError,
    Offer,
    RoundInput,
    RunningJob,
    SetAside,
    Weights,
)


def _int(path: str, value: object, lo: int, hi: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineInputError(path, f"must be an integer, got {type(value).__name__}")
    if value < lo:
        raise EngineInputError(path, f"must be at least {lo:,}, got {value:,}")
    if value > hi:
        raise EngineInputError(path, f"must be at most {hi:,}, got {value:,}")


def _float(path: str, value: object, lo: float, hi: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise EngineInputError(path, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise EngineInputError(path, f"must be a finite number, got {value}")
    if value < lo or value > hi:
        raise EngineInputError(path, f"must be between {lo} and {hi}, got {value}")


def _str(path: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise EngineInputError(path, "must be a non-empty string")


def _bool(path: str, value: object) -> None:
    if not isinstance(value, bool):
        raise EngineInputError(path, f"must be true or false, got {type(value).__name__}")


def _known(path: str, value: object, known: set[str], what: str) -> None:
    _str(path, value)
    if value not in known:
        raise EngineInputError(path, f"unknown {what} {value!r}")


_ORDERS = ("offers", "bids", "gpu_models", "regions", "latency_ms", "running", "occupied")


def materialised(inp: RoundInput) -> RoundInput:
    """``inp`` with each of its collections read once into a tuple.

    A generator passed as ``bids`` would otherwise be used up by validation, and the
    round would clear nothing without a word; anything that is not a collection at all
    is refused by name, like every other bad input.
    """
    changes: dict[str, Any] = {}
    for name in _ORDERS:
        value = getattr(inp, name)
        if isinstance(value, tuple):
            continue
        if isinstance(value, str | bytes | dict) or not isinstance(value, Iterable):
            raise EngineInputError(name, f"must be a sequence, got {type(value).__name__}")
        changes[name] = tuple(value)
    return dataclasses.replace(inp, **changes) if changes else inp


def validate(inp: RoundInput) -> None:
    """Raise EngineInputError for the first thing wrong with ``inp``: pass it
    ``materialised`` first, or a generator among its orders is used up here."""
    model_ids, region_ids = _round(inp)
    offer_ids: set[int] = set()
    for i, o in enumerate(inp.offers):
        if not _offer_ok(o, model_ids, region_ids):
            _offer(f"offers[{i}]", o, model_ids, region_ids)
        _unique(f"offers[{i}].id", o.id, offer_ids, "offer")
    bid_ids: set[int] = set()
    for i, b in enumerate(inp.bids):
        if not _bid_ok(b, model_ids, region_ids):
            _bid(f"bids[{i}]", b, model_ids, region_ids)
        _unique(f"bids[{i}].id", b.id, bid_ids, "bid")
    for i, j in enumerate(inp.running):
        _running(f"running[{i}]", j)
    for i, o in enumerate(inp.occupied):
        if not _offer_ok(o, model_ids, region_ids):
            _offer(f"occupied[{i}]", o, model_ids, region_ids)
        _unique(f"occupied[{i}].id", o.id, offer_ids, "offer")


def screen(inp: RoundInput) -> tuple[RoundInput, tuple[SetAside, ...]]:
    """Split off each order the engine cannot take, with its reason, and return the rest.

    One bad order must not fail the round for everyone: a bid over a limit is set aside
    and its owner told why, while the others clear. What is wrong with the round itself
    (the catalogue, the config, the clock, two orders with one id) still raises, since
    no order's owner could fix it. ``validate`` passes on what this returns.
    """
    inp = materialised(inp)
    model_ids, region_ids = _round(inp)
    aside: list[SetAside] = []
    offers = [
        (i, o) for i, o in enumerate(inp.offers)
        if _offer_ok(o, model_ids, region_ids) or _keep(aside, "offer", i, o, _offer, model_ids, region_ids)
    ]
    bids = [
        (i, b) for i, b in enumerate(inp.bids)
        if _bid_ok(b, model_ids, region_ids) or _keep(aside, "bid", i, b, _bid, model_ids, region_ids)
    ]
    running = tuple(j for i, j in enumerate(inp.running) if _keep(aside, "running", i, j, _running))
    occupied = tuple(o for i, o in enumerate(inp.occupied)
                     if _offer_ok(o, model_ids, region_ids) or _keep(aside, "occupied", i, o, _offer, model_ids, region_ids))
    # a duplicate is named by its place in the input as given, like every other error
    offer_ids: set[int] = set()
    for i, o in offers:
        _unique(f"offers[{i}].id", o.id, offer_ids, "offer")
    bid_ids: set[int] = set()
    for i, b in bids:
        _unique(f"bids[{i}].id", b.id, bid_ids, "bid")
    for i, o in enumerate(occupied):
        _unique(f"occupied[{i}].id", o.id, offer_ids, "offer")
    kept = dataclasses.replace(inp, offers=tuple(o for _, o in offers), bids=tuple(b for _, b in bids), running=running, occupied=occupied)
    return kept, tuple(aside)


def _keep(aside: list[SetAside], kind: str, i: int, item: Any, check: Callable[..., None], *context: set[str]) -> bool:
    """True if ``item`` passes ``check``; else its reason goes on ``aside``."""
    prefix = f"{kind}s[{i}]" if kind not in ("running", "occupied") else f"{kind}[{i}]"
    try:
        check(prefix, item, *context)
    except EngineInputError as exc:
        field = exc.field.removeprefix(prefix).lstrip(".") or kind
        ident = getattr(item, "trade_id" if kind == "running" else "id", None)
        aside.append(SetAside(kind, ident if type(ident) is int else None, field, exc.message))
        return False
    return True


def _unique(path: str, ident: int, seen: set[int], what: str) -> None:
    if ident in seen:
        raise EngineInputError(path, f"duplicate {what} id {ident}")
    seen.add(ident)


def _round(inp: RoundInput) -> tuple[set[str], set[str]]:
    """Check what belongs to the round rather than to an order; the model and region ids."""
    _int("now", inp.now, 0, 2**62)
    model_ids: set[str] = set()
    for i, m in enumerate(inp.gpu_models):
        p = f"gpu_models[{i}]"
        _str(f"{p}.id", m.id)
        if m.id in model_ids:
            raise EngineInputError(f"{p}.id", f"duplicate GPU model {m.id!r}")
        model_ids.add(m.id)
        _str(f"{p}.vendor", m.vendor)
        _int(f"{p}.memory_gib", m.memory_gib, 1, 100_000)
        _float(f"{p}.compute_units", m.compute_units, 0.0, 1e9)
        _int(f"{p}.tdp_watts", m.tdp_watts, 0, 100_000)
    region_ids: set[str] = set()
    for i, r in enumerate(inp.regions):
        p = f"regions[{i}]"
        _str(f"{p}.id", r.id)
        if r.id in region_ids:
            raise EngineInputError(f"{p}.id", f"duplicate region {r.id!r}")
        region_ids.add(r.id)
        _float(f"{p}.carbon_g_per_kwh", r.carbon_g_per_kwh, 0.0, 1e5)
        if not isinstance(r.carbon_hourly, tuple) or len(r.carbon_hourly) > MAX_CARBON_HOURS:
            raise EngineInputError(f"{p}.carbon_hourly", f"must be a tuple of at most {MAX_CARBON_HOURS} hourly intensities")
        for k, v in enumerate(r.carbon_hourly):
            _float(f"{p}.carbon_hourly[{k}]", v, 0.0, 1e5)
    seen_pairs: set[tuple[str, str]] = set()
    for i, row in enumerate(inp.latency_ms):
        p = f"latency_ms[{i}]"
        if not isinstance(row, tuple) or len(row) != 3:
            raise EngineInputError(p, "must be a (from_region, to_region, ms) triple")
        _known(f"{p}[0]", row[0], region_ids, "region")
        _known(f"{p}[1]", row[1], region_ids, "region")
        _float(f"{p}[2]", row[2], 0.0, 1e6)
        if (row[0], row[1]) in seen_pairs:
            raise EngineInputError(p, f"duplicate latency for {row[0]} -> {row[1]}")
        seen_pairs.add((row[0], row[1]))
    c = inp.config
    if c.pricing not in PRICING_RULES:
        raise EngineInputError("config.pricing", f"must be one of {', '.join(PRICING_RULES)}")
    _float("config.fair_share_cap", c.fair_share_cap, 0.0, 1.0)
    _float("config.price_point", c.price_point, 0.0, 1.0)
    if c.fair_share_cap <= 0.0:
        raise EngineInputError("config.fair_share_cap", "must be above 0")
    _int("config.max_candidates", c.max_candidates, 0, 10**9)
    _int("config.group_scan", c.group_scan, 0, 10**9)
    _int("config.exact_node_limit", c.exact_node_limit, 0, 10**9)
    _bool("config.certify", c.certify)
    _int("config.pack_band", c.pack_band, 0, MAX_PRICE)
    return model_ids, region_ids


_ID = 2**62
HOST_FIELDS = ("ram_gib", "disk_gb", "net_down_mbps")  # Offer.x, Bid.min_x


def _i(v: object, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


def _f(v: object, lo: float, hi: float) -> bool:
    return (type(v) is float or type(v) is int) and lo <= v <= hi


def _offer_ok(o: Offer, models: set[str], regions: set[str]) -> bool:
    """The common case, without building field paths; False means look closer."""
    return (
        type(o) is Offer
        and _i(o.id, 0, _ID)
        and _i(o.provider_id, 0, _ID)
        and _i(o.machine_id, 0, _ID)
        and type(o.region) is str
        and o.region in regions
        and type(o.gpu_model) is str
        and o.gpu_model in models
        and _i(o.gpus, 1, MAX_GPUS)
        and _i(o.ask, 0, MAX_PRICE)
        and _i(o.min_duration_s, 0, MAX_DURATION_S)
        and _i(o.max_duration_s, 1, MAX_DURATION_S)
        and o.max_duration_s >= o.min_duration_s
        and _i(o.available_from, 0, _ID)
        and (
            o.available_until is None
            or (_i(o.available_until, 0, _ID) and o.available_until > o.available_from)
        )
        and type(o.spot_allowed) is bool
        and type(o.reserved_only) is bool
        and type(o.containers) is bool
        and type(o.ports) is bool
        and type(o.spot_only) is bool
        and _i(o.nvlink_gpus, 0, o.gpus)
        and (o.shares == () or _shares_ok(o))
        and _i(o.cuda, 0, MAX_CUDA)
        and _i(o.ram_gib, 0, MAX_HOST)
        and _i(o.disk_gb, 0, MAX_HOST)
        and _i(o.net_down_mbps, 0, MAX_HOST)
        and _f(o.reliability, 0.0, 1.0)
        and _i(o.created_at, 0, _ID)
    )


def _shares_ok(o: Offer) -> bool:
    s = o.shares
    return type(s) is tuple and len(s) == o.gpus and all(_i(x, 0, SHARE_UNITS) for x in s) and sum(s) > 0


def _bid_ok(b: Bid, models: set[str], regions: set[str]) -> bool:
    """The common case, without building field paths; False means look closer."""
    if type(b) is not Bid:
        return False
    w = b.weights
    return (
        _i(b.id, 0, _ID)
        and _i(b.buyer_id, 0, _ID)
        and _i(b.gpus, 1, MAX_GPUS)
        and type(b.gpu_models) is tuple
        and all(type(m) is str and m in models for m in b.gpu_models)
        and _i(b.min_memory_gib, 0, MAX_MEMORY_GIB)
        and _f(b.min_compute_units, 0.0, MAX_COMPUTE_UNITS)
        and (b.vendor is None or (type(b.vendor) is str and b.vendor != ""))
        and type(b.same_machine) is bool
        and type(b.allowed_regions) is tuple
        and all(type(r) is str and r in regions for r in b.allowed_regions)
        and type(b.preferred_regions) is tuple
        and all(type(r) is str and r in regions for r in b.preferred_regions)
        and (b.location_region is None or (type(b.location_region) is str and b.location_region in regions))
        and (
            b.max_latency_ms is None
            or (_f(b.max_latency_ms, 0.0, MAX_LATENCY_MS) and b.location_region is not None)
        )
        and _i(b.max_price, 0, MAX_PRICE)
        and _i(b.duration_s, 1, MAX_DURATION_S)
        and (b.deadline is None or _i(b.deadline, 0, _ID))
        and b.klass in CLASSES
        and type(b.needs_containers) is bool
        and type(b.needs_ports) is bool
        and type(b.needs_nvlink) is bool
        and (not b.needs_nvlink or b.same_machine)
        and _i(b.gpu_milli, 1, 1000)
        and (b.gpu_milli == 1000 or b.gpus == 1)
        and _i(b.min_cuda, 0, MAX_CUDA)
        and _i(b.min_ram_gib, 0, MAX_HOST)
        and _i(b.min_disk_gb, 0, MAX_HOST)
        and _i(b.min_net_down_mbps, 0, MAX_HOST)
        and (b.runtime_p90_s is None or _i(b.runtime_p90_s, 1, MAX_DURATION_S))
        and (b.runtime_p50_s is None or _i(b.runtime_p50_s, 1, MAX_DURATION_S))
        and _f(b.min_reliability, 0.0, 1.0)
        and type(w) is Weights
        and _f(w.latency_per_ms, 0.0, MAX_WEIGHT)
        and _f(w.non_preferred_region, 0.0, MAX_WEIGHT)
        and _f(w.carbon_per_kg, 0.0, MAX_WEIGHT)
        and _f(w.reliability, 0.0, MAX_WEIGHT)
        and _i(b.created_at, 0, _ID)
    )


def _offer(p: str, o: Offer, models: set[str], regions: set[str]) -> None:
    if not isinstance(o, Offer):
        raise EngineInputError(p, "must be an Offer")
    _int(f"{p}.id", o.id, 0, 2**62)
    _int(f"{p}.provider_id", o.provider_id, 0, 2**62)
    _int(f"{p}.machine_id", o.machine_id, 0, 2**62)
    _known(f"{p}.region", o.region, regions, "region")
    _known(f"{p}.gpu_model", o.gpu_model, models, "GPU model")
    _int(f"{p}.gpus", o.gpus, 1, MAX_GPUS)
    _int(f"{p}.ask", o.ask, 0, MAX_PRICE)
    _int(f"{p}.min_duration_s", o.min_duration_s, 0, MAX_DURATION_S)
    _int(f"{p}.max_duration_s", o.max_duration_s, 1, MAX_DURATION_S)
    if o.max_duration_s < o.min_duration_s:
        raise EngineInputError(f"{p}.max_duration_s", "must not be below min_duration_s")
    _int(f"{p}.available_from", o.available_from, 0, 2**62)
    if o.available_until is not None:
        _int(f"{p}.available_until", o.available_until, 0, 2**62)
        if o.available_until <= o.available_from:
            raise EngineInputError(f"{p}.available_until", "must be after available_from")
    _bool(f"{p}.spot_allowed", o.spot_allowed)
    _bool(f"{p}.reserved_only", o.reserved_only)
    _bool(f"{p}.containers", o.containers)
    _bool(f"{p}.ports", o.ports)
    _bool(f"{p}.spot_only", o.spot_only)
    _int(f"{p}.nvlink_gpus", o.nvlink_gpus, 0, o.gpus)
    if o.shares != ():
        if not isinstance(o.shares, tuple) or len(o.shares) != o.gpus:
            raise EngineInputError(f"{p}.shares", f"must be a tuple of the eighths free on each of its {o.gpus} GPU(s), or empty for whole GPUs")
        for k, x in enumerate(o.shares):
            _int(f"{p}.shares[{k}]", x, 0, SHARE_UNITS)
        if not sum(o.shares):
            raise EngineInputError(f"{p}.shares", "has no eighth free: an offer sells something")
    _int(f"{p}.cuda", o.cuda, 0, MAX_CUDA)
    for name in HOST_FIELDS:
        _int(f"{p}.{name}", getattr(o, name), 0, MAX_HOST)
    _float(f"{p}.reliability", o.reliability, 0.0, 1.0)
    _int(f"{p}.created_at", o.created_at, 0, 2**62)


def _weights(p: str, w: Weights) -> None:
    if not isinstance(w, Weights):
        raise EngineInputError(p, "must be Weights")
    for name in ("latency_per_ms", "non_preferred_region", "carbon_per_kg", "reliability"):
        _float(f"{p}.{name}", getattr(w, name), 0.0, MAX_WEIGHT)


def _bid(p: str, b: Bid, models: set[str], regions: set[str]) -> None:
    if not isinstance(b, Bid):
        raise EngineInputError(p, "must be a Bid")
    _int(f"{p}.id", b.id, 0, 2**62)
    _int(f"{p}.buyer_id", b.buyer_id, 0, 2**62)
    _int(f"{p}.gpus", b.gpus, 1, MAX_GPUS)
    if not isinstance(b.gpu_models, tuple):
        raise EngineInputError(f"{p}.gpu_models", "must be a tuple of GPU model ids")
    for k, m in enumerate(b.gpu_models):
        _known(f"{p}.gpu_models[{k}]", m, models, "GPU model")
    _int(f"{p}.min_memory_gib", b.min_memory_gib, 0, MAX_MEMORY_GIB)
    _float(f"{p}.min_compute_units", b.min_compute_units, 0.0, MAX_COMPUTE_UNITS)
    if b.vendor is not None:
        _str(f"{p}.vendor", b.vendor)
    _bool(f"{p}.same_machine", b.same_machine)
    for name in ("allowed_regions", "preferred_regions"):
        seq = getattr(b, name)
        if not isinstance(seq, tuple):
            raise EngineInputError(f"{p}.{name}", "must be a tuple of region ids")
        for k, r in enumerate(seq):
            _known(f"{p}.{name}[{k}]", r, regions, "region")
    if b.location_region is not None:
        _known(f"{p}.location_region", b.location_region, regions, "region")
    if b.max_latency_ms is not None:
        _float(f"{p}.max_latency_ms", b.max_latency_ms, 0.0, MAX_LATENCY_MS)
        if b.location_region is None:
            raise EngineInputError(f"{p}.max_latency_ms", "needs location_region to measure from")
    _int(f"{p}.max_price", b.max_price, 0, MAX_PRICE)
    _int(f"{p}.duration_s", b.duration_s, 1, MAX_DURATION_S)
    if b.deadline is not None:
        _int(f"{p}.deadline", b.deadline, 0, 2**62)
    if b.klass not in CLASSES:
        raise EngineInputError(f"{p}.klass", f"must be one of {', '.join(CLASSES)}")
    _float(f"{p}.min_reliability", b.min_reliability, 0.0, 1.0)
    _bool(f"{p}.needs_containers", b.needs_containers)
    _bool(f"{p}.needs_ports", b.needs_ports)
    _bool(f"{p}.needs_nvlink", b.needs_nvlink)
    if b.needs_nvlink and not b.same_machine:
        raise EngineInputError(f"{p}.needs_nvlink", "needs same_machine: one NVLink domain is on one machine")
    _int(f"{p}.gpu_milli", b.gpu_milli, 1, 1000)
    if b.gpu_milli < 1000 and b.gpus != 1:
        raise EngineInputError(f"{p}.gpu_milli", f"a share of a GPU ({b.gpu_milli} thousandths) is of one GPU: gpus must be 1, not {b.gpus}")
    _int(f"{p}.min_cuda", b.min_cuda, 0, MAX_CUDA)
    for name in HOST_FIELDS:
        _int(f"{p}.min_{name}", getattr(b, f"min_{name}"), 0, MAX_HOST)
    _weights(f"{p}.weights", b.weights)
    _int(f"{p}.created_at", b.created_at, 0, 2**62)
    if b.runtime_p90_s is not None:
        _int(f"{p}.runtime_p90_s", b.runtime_p90_s, 1, MAX_DURATION_S)
    if b.runtime_p50_s is not None:
        _int(f"{p}.runtime_p50_s", b.runtime_p50_s, 1, MAX_DURATION_S)


def _running(p: str, j: RunningJob) -> None:
    if not isinstance(j, RunningJob):
        raise EngineInputError(p, "must be a RunningJob")
    _int(f"{p}.trade_id", j.trade_id, 0, 2**62)
    _int(f"{p}.offer_id", j.offer_id, 0, 2**62)
    _int(f"{p}.machine_id", j.machine_id, 0, 2**62)
    _int(f"{p}.gpus", j.gpus, 1, MAX_GPUS)
    if j.klass not in CLASSES:
        raise EngineInputError(f"{p}.klass", f"must be one of {', '.join(CLASSES)}")
    _int(f"{p}.price", j.price, 0, MAX_PRICE)
