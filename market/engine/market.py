"""The round as arrays, and the feasible (bid, offer) pairs with their scores.

Hard constraints split in two. Those that depend on the bid and only the
offer's *bucket* (GPU model, region) - model or minimum specs, allowed
regions, latency - are decided once per bid and bucket as small boolean
matrices. Offers are then grouped into *views*: one per bucket and capacity
tier (a power of two), holding the offers available now with at least that
many free GPUs, sorted by ask. A same-machine bid for g GPUs looks only at
the view of the largest tier <= g, so an 8-GPU job never scans the 1-GPU
machines that could not host it. Within a view the offer-level constraints
(price, capacity, reliability, duration window, class rules) and the score
are evaluated for many bids at once with numpy.

Score of a pair, in base units, rounded half-to-even to an integer so that
every later comparison is exact::

    value/GPU-hour = (max_price - ask) + w.reliability * reliability
                     - w.latency_per_ms * latency_ms(location -> region)
                     - w.non_preferred_region * [region not preferred]
                     - w.carbon_per_kg * kg CO2 per GPU-hour(model, region, the hours the job runs)
    score          = round(gpus * hours * value)

Only pairs with a positive score are candidates: a pair the buyer values at
or below nothing adds no surplus.

Scores are int64 (numpy) and sums of them must stay int64 too, yet the limits
allow 1,000 GPUs for 10 years at 10**12 a GPU-hour: about 8.8e19 base units,
past 2**63. So a round whose scores could add up past ``SCORE_BUDGET`` counts
them in a coarser unit, ``Market.score_unit`` (the smallest power of two that
brings the sum of every bid's largest possible score under the budget), by
dividing ``b_hours`` by it: every score, sum and bound of the round is then in
that unit, and ``clear_round`` multiplies them back into base units when it
reports them. A power of two divides a float exactly, so a round within the
budget (unit 1; every real one) clears bit for bit as before; one past it
knows each score to within a unit (a pair worth under half a unit for the
whole job counts as worth nothing), where float arithmetic had already lost
the last digits of such scores.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from .types import CLASSES, Bid, GpuModel, Offer, Region, RoundInput

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

NEVER = 2**62
SCORE_BUDGET = 2**60  # base units: the most all of a round's scores may add up to, unscaled
SCORE_CAP = float(2**62)  # no score gets near it; clipping to it keeps a cast to int64 defined
CHUNK_CELLS = 1 << 19  # cells of one bids x offers block: bounds peak memory


def tie_key(bid_ids: I64, offer_ids: I64) -> I64:
    """A pair's place among pairs of equal score: a fixed hash of the bid's and the
    offer's ids (broadcast), in [0, 2**63). Equal scores are common (one price
    level, one reliability): broken by the offer alone, every bid would keep the
    same first offers of a view and the LP's columns would crowd onto a few
    hundred machines out of thousands. By ids, not positions, so a pair keeps
    its place whatever else is in the book."""
    with np.errstate(over="ignore"):
        h = (bid_ids.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
            offer_ids.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))
        h ^= h >> np.uint64(31)
        h *= np.uint64(0xBF58476D1CE4E5B9)
        h ^= h >> np.uint64(29)
    out: I64 = (h >> np.uint64(1)).astype(np.int64)
    return out


def _tier(g: int) -> int:
    return 1 << (g.bit_length() - 1)


# a machine's host as offers report it and bids ask for it (issue 32), in o_host's columns
HOST_COLUMNS = ("cuda", "ram_gib", "disk_gb", "net_down_mbps")
CUT_TIERS = 5  # divisibility rows per offer: multiples of 1, 2, 4, 8 and 16 GPUs


def size_tier(gpus: I64, same: BoolA) -> I64:
    """Per item, the last divisibility row it counts in: ``j`` such that
    ``2**j`` is the largest power of two (up to ``2**(CUT_TIERS-1)``) dividing
    its GPUs. Parts of a multi-machine bid may be any size: row 0 only.

    Why the rows hold: the GPUs that items of multiples of ``s = 2**j`` take on
    one offer sum to a multiple of ``s``, so they fit in ``s * (free // s)``,
    not just ``free``. A 7-GPU leftover takes one 4-GPU job, never 7/4 of them
    as the plain LP relaxation would allow; in thick markets of 1/2/4/8-GPU
    jobs this closes most of the gap between the relaxation and the optimum.
    """
    v = np.zeros(len(gpus), dtype=np.int64)
    for j in range(1, CUT_TIERS):
        v += gpus % (1 << j) == 0
    out: I64 = np.where(same, v, 0)
    return out


def cut_caps(free: I64) -> I64:
    """``caps[o, j]``: the GPUs of offer ``o`` that items of multiples of
    ``2**j`` GPUs can use together (``free`` rounded down to a multiple)."""
    f = np.maximum(free.astype(np.int64), 0)
    out: I64 = np.stack([(f >> j) << j for j in range(CUT_TIERS)], axis=1)
    return out


def tier_prices(lam: I64) -> I64:
    """Per offer and row ``j``, the price per GPU an item whose last row is
    ``j`` pays: the sum of the row prices ``lam[o, 0..j]``. A 1-D ``lam``
    (one price per offer) is the same price for every size."""
    if lam.ndim == 1:
        out: I64 = np.repeat(lam[:, None], CUT_TIERS, axis=1)
        return out
    cum: I64 = np.cumsum(lam, axis=1)
    return cum


@dataclass
class Market:
    """Read-only arrays describing one round; bids and offers sorted by id."""

    now: int
    offers: tuple[Offer, ...]
    bids: tuple[Bid, ...]
    model_ids: tuple[str, ...]
    region_ids: tuple[str, ...]
    # offers
    o_model: I64
    o_region: I64
    o_gpus: I64
    o_ask: I64
    o_rel: F64
    o_from: I64
    o_until: I64
    o_min_dur: I64
    o_max_dur: I64
    o_spot: BoolA
    o_resv: BoolA
    o_spotonly: BoolA  # lent: spot bids only
    o_cont: BoolA  # runs container images
    o_ports: BoolA  # publishes ports
    o_nvl: I64  # the most free GPUs in one NVLink domain (issue 38)
    o_host: I64  # offers x 4: CUDA, RAM GiB, disk GB, download Mbit/s (HOST_COLUMNS)
    o_id: I64
    bids_id: I64
    # bids
    b_gpus: I64
    b_maxp: I64
    b_dur: I64
    # what must fit before an offer's window closes: the duration, or for a spot bid with a
    # runtime prediction the shorter p90 (backfill, issue 36)
    b_span: I64
    b_hours: F64  # the job's hours over ``score_unit``: what a score multiplies
    b_klass: I64
    b_minrel: F64
    b_wrel: F64
    b_wc: F64
    b_same: BoolA
    b_cont: BoolA  # needs a container runtime
    b_ports: BoolA  # needs published ports
    b_nvl: BoolA  # its GPUs must share one NVLink domain
    b_host: I64  # bids x 4: the least of each HOST_COLUMNS the job needs
    b_hostneed: BoolA  # a bid with any host minimum
    b_deadline_ok: BoolA
    b_tier: I64
    # bid x model / bid x region
    model_ok: BoolA
    region_allowed: BoolA
    latency_ok: BoolA
    latency: F64
    pen: F64  # latency and region penalty per GPU-hour
    m_kw: F64  # per model: its TDP in kW
    # bid x region: the grid's mean g CO2/kWh over the hours the bid's job is expected to run
    # (issue 37, ``carbon_means``); a bid's carbon per GPU-hour on model m is m_kw[m] x this / 1000
    b_carb: F64
    r_carb: F64 | None  # per region, when no region has a forecast (every row of b_carb is it): the fast path
    views: dict[tuple[int, int, int], I64]
    bucket_supply: I64  # model x region: GPUs offered
    score_unit: int = 1  # base units per unit of score (a power of two; 1 unless scores would overflow)

    def value(self, b: int, o: int) -> float:
        """Per-GPU-hour value of one pair, in the same float steps as ``pair_scores``."""
        m, r = int(self.o_model[o]), int(self.o_region[o])
        v = float(self.b_maxp[b] - self.o_ask[o]) + float(self.b_wrel[b]) * float(self.o_rel[o])
        v = v - float(self.pen[b, r])
        return v - float(self.b_wc[b]) * (float(self.m_kw[m]) * (float(self.b_carb[b, r]) / 1000.0))

    def values(self, b: int, offs: I64) -> tuple[F64, BoolA]:
        """``value`` and ``offer_ok`` (GPUs aside) of bid ``b`` on each of
        ``offs`` (offers available now) at once (``pair_values``' one row)."""
        v, ok = pair_values(self, np.asarray([b], dtype=np.int64), offs)
        return v[0], ok[0]

    def offer_ok(self, b: int, o: int, *, check_gpus: bool = True) -> bool:
        """Offer-level hard constraints for one pair (bucket-level ones aside)."""
        dur = int(self.b_dur[b])
        k = int(self.b_klass[b])
        return bool(
            self.o_ask[o] <= self.b_maxp[b]
            and (not check_gpus or self.o_gpus[o] >= self.b_gpus[b])
            and self.o_rel[o] >= self.b_minrel[b]
            and self.o_min_dur[o] <= dur <= self.o_max_dur[o]
            and self.o_from[o] <= self.now
            and self.o_until[o] >= self.now + int(self.b_span[b])
            and (not self.o_resv[o] or k == 0)
            and (not self.o_spotonly[o] or k == 2)
            and (k != 2 or self.o_spot[o])
            and (self.o_cont[o] or not self.b_cont[b])
            and (self.o_ports[o] or not self.b_ports[b])
            and (not self.b_nvl[b] or self.o_nvl[o] >= self.b_gpus[b])
            and (not self.b_hostneed[b] or bool((self.o_host[o] >= self.b_host[b]).all()))
        )


def carbon_means(regions: Sequence[Region], now: int, spans: Sequence[int]) -> F64:
    """Bid x region: each region's mean intensity (g/kWh) over ``[now, now + span)`` for each
    bid's span, from its hourly forecast (``Region.carbon_hourly``, from the hour that holds
    ``now``; past its end, its last hour), each hour weighted by the part the span covers.
    A region without a forecast counts its constant throughout. Without any forecast, one
    row broadcast to every bid (no copy)."""
    carb = np.asarray([r.carbon_g_per_kwh for r in regions], dtype=np.float64)
    n = len(spans)
    if not any(r.carbon_hourly for r in regions):
        return np.broadcast_to(carb[None, :], (n, len(regions)))
    if n == 0:  # every bid set aside: nothing to price
        return np.zeros((0, len(regions)), dtype=np.float64)
    span = np.maximum(np.asarray(spans, dtype=np.float64), 1.0)
    offset = float(now % 3600)
    out = np.empty((n, len(regions)), dtype=np.float64)
    for j, r in enumerate(regions):
        if not r.carbon_hourly:
            out[:, j] = carb[j]
            continue
        need = int(np.ceil((offset + float(span.max())) / 3600.0)) + 1
        vals = np.asarray(r.carbon_hourly, dtype=np.float64)
        if len(vals) < need:
            vals = np.concatenate([vals, np.full(need - len(vals), vals[-1])])
        cum = np.concatenate([[0.0], np.cumsum(vals)]) * 3600.0  # seconds x g/kWh from the hour's start

        def integral(x: F64, vals: F64 = vals, cum: F64 = cum) -> F64:
            k = np.floor(x / 3600.0).astype(np.int64)
            return cum[k] + vals[k] * (x - 3600.0 * k)

        out[:, j] = (integral(offset + span) - integral(np.full(n, offset))) / span
    return out


def score_unit(bids: Sequence[Bid]) -> int:
    """The round's unit of score: 1, or the smallest power of two that keeps the sum
    of every bid's largest possible score (its GPUs x hours x (max price + the
    whole reliability bonus): penalties and asks only lower it) under
    ``SCORE_BUDGET`` once divided by it. Python integers and floats: no overflow."""
    top = sum(b.gpus * (b.max_price + b.weights.reliability) * b.duration_s / 3600 for b in bids)
    if top <= SCORE_BUDGET:
        return 1
    return 1 << math.ceil(math.log2(top / SCORE_BUDGET))


class ModelTable:
    """The GPU models of a round, in its order, and which of them a bid takes: those it
    names (any, if none), with its memory, compute and vendor. `build_market`'s model_ok and
    the sub-markets' joins (`parts`) read the same rows."""

    def __init__(self, models: Sequence[GpuModel]) -> None:
        self.index = {m.id: i for i, m in enumerate(models)}
        self.vendor = [m.vendor for m in models]
        self.mem = np.asarray([m.memory_gib for m in models], dtype=np.int64)
        self.cu = np.asarray([m.compute_units for m in models], dtype=np.float64)

    def row(self, b: Bid) -> BoolA:
        if b.gpu_models:
            row = np.zeros(len(self.vendor), dtype=np.bool_)
            row[[self.index[m] for m in b.gpu_models]] = True
        else:
            row = np.ones(len(self.vendor), dtype=np.bool_)
        row &= (self.mem >= b.min_memory_gib) & (self.cu >= b.min_compute_units)
        if b.vendor is not None:
            row &= np.asarray([v == b.vendor for v in self.vendor], dtype=np.bool_)
        return row


def build_market(inp: RoundInput) -> Market:
    offers = tuple(sorted(inp.offers, key=lambda o: o.id))
    bids = tuple(sorted(inp.bids, key=lambda b: b.id))
    models = sorted(inp.gpu_models, key=lambda m: m.id)
    regions = sorted(inp.regions, key=lambda r: r.id)
    model_ids = tuple(m.id for m in models)
    region_ids = tuple(r.id for r in regions)
    mi = {m: i for i, m in enumerate(model_ids)}
    ri = {r: i for i, r in enumerate(region_ids)}
    nm, nr, nb = len(models), len(regions), len(bids)

    lat = np.full((nr, nr), np.inf)
    for a, b_, ms in sorted(inp.latency_ms):
        lat[ri[a], ri[b_]] = ms
    # a one-way measurement serves both directions when the other is missing,
    # and a region is 0 ms from itself unless a row says otherwise
    lat = np.where(np.isinf(lat), lat.T, lat)
    np.fill_diagonal(lat, np.where(np.isinf(np.diag(lat)), 0.0, np.diag(lat)))

    def ia(xs: list[int]) -> I64:
        return np.asarray(xs, dtype=np.int64).reshape(-1)

    o_until = ia([NEVER if o.available_until is None else o.available_until for o in offers])
    mkt_o: dict[str, Any] = dict(
        o_model=ia([mi[o.gpu_model] for o in offers]),
        o_region=ia([ri[o.region] for o in offers]),
        o_gpus=ia([o.gpus for o in offers]),
        o_ask=ia([o.ask for o in offers]),
        o_rel=np.asarray([o.reliability for o in offers], dtype=np.float64).reshape(-1),
        o_from=ia([o.available_from for o in offers]),
        o_until=o_until,
        o_min_dur=ia([o.min_duration_s for o in offers]),
        o_max_dur=ia([o.max_duration_s for o in offers]),
        o_spot=np.asarray([o.spot_allowed for o in offers], dtype=np.bool_).reshape(-1),
        o_resv=np.asarray([o.reserved_only for o in offers], dtype=np.bool_).reshape(-1),
        o_spotonly=np.asarray([o.spot_only for o in offers], dtype=np.bool_).reshape(-1),
        o_cont=np.asarray([o.containers for o in offers], dtype=np.bool_).reshape(-1),
        o_ports=np.asarray([o.ports for o in offers], dtype=np.bool_).reshape(-1),
        o_nvl=np.asarray([o.nvlink_gpus for o in offers], dtype=np.int64).reshape(-1),
        o_host=np.asarray([[o.cuda, o.ram_gib, o.disk_gb, o.net_down_mbps] for o in offers], dtype=np.int64).reshape(-1, len(HOST_COLUMNS)),
        o_id=ia([o.id for o in offers]),
        bids_id=ia([b.id for b in bids]),
    )

    accepts = ModelTable(models)
    model_ok = np.zeros((nb, nm), dtype=np.bool_)
    region_allowed = np.ones((nb, nr), dtype=np.bool_)
    latency = np.zeros((nb, nr), dtype=np.float64)
    latency_ok = np.ones((nb, nr), dtype=np.bool_)
    pen = np.zeros((nb, nr), dtype=np.float64)
    for i, b in enumerate(bids):
        model_ok[i] = accepts.row(b)
        if b.allowed_regions:
            region_allowed[i] = False
            region_allowed[i, [ri[r] for r in b.allowed_regions]] = True
        if b.location_region is not None:
            latency[i] = lat[ri[b.location_region]]
            if b.max_latency_ms is not None:
                latency_ok[i] = latency[i] <= b.max_latency_ms
            else:
                latency_ok[i] = np.isfinite(latency[i])
            pen[i] = b.weights.latency_per_ms * np.where(np.isfinite(latency[i]), latency[i], 0.0)
        if b.preferred_regions:
            nonpref = np.ones(nr, dtype=np.bool_)
            nonpref[[ri[r] for r in b.preferred_regions]] = False
            pen[i] = pen[i] + b.weights.non_preferred_region * nonpref

    tdp = np.asarray([m.tdp_watts for m in models], dtype=np.float64)
    b_carb = carbon_means(regions, inp.now, [b.runtime_p50_s or b.duration_s for b in bids])

    b_dur = ia([b.duration_s for b in bids])
    b_gpus = ia([b.gpus for b in bids])
    b_same = np.asarray([b.same_machine for b in bids], dtype=np.bool_).reshape(-1)
    unit = score_unit(bids)
    b_host = np.asarray([[b.min_cuda, b.min_ram_gib, b.min_disk_gb, b.min_net_down_mbps] for b in bids], dtype=np.int64).reshape(-1, len(HOST_COLUMNS))
    mkt_b: dict[str, Any] = dict(
        b_gpus=b_gpus,
        b_maxp=ia([b.max_price for b in bids]),
        b_dur=b_dur,
        b_span=ia([min(b.duration_s, b.runtime_p90_s) if b.klass == "spot" and b.runtime_p90_s else b.duration_s for b in bids]),
        b_hours=b_dur.astype(np.float64) / 3600.0 / unit,
        b_klass=ia([CLASSES.index(b.klass) for b in bids]),
        b_minrel=np.asarray([b.min_reliability for b in bids], dtype=np.float64).reshape(-1),
        b_wrel=np.asarray([b.weights.reliability for b in bids], dtype=np.float64).reshape(-1),
        b_wc=np.asarray([b.weights.carbon_per_kg for b in bids], dtype=np.float64).reshape(-1),
        b_same=b_same,
        b_cont=np.asarray([b.needs_containers or b.needs_ports for b in bids], dtype=np.bool_).reshape(-1),
        b_ports=np.asarray([b.needs_ports for b in bids], dtype=np.bool_).reshape(-1),
        b_nvl=np.asarray([b.needs_nvlink for b in bids], dtype=np.bool_).reshape(-1),
        b_host=b_host,
        b_hostneed=(b_host > 0).any(axis=1),
        b_deadline_ok=np.asarray(
            [b.deadline is None or inp.now + b.duration_s <= b.deadline for b in bids],
            dtype=np.bool_,
        ).reshape(-1),
        b_tier=ia([_tier(b.gpus) if b.same_machine else 1 for b in bids]),
    )

    # views: offers available now, by (model, region, tier), sorted by ask then id
    o_model, o_region, o_gpus = mkt_o["o_model"], mkt_o["o_region"], mkt_o["o_gpus"]
    avail = mkt_o["o_from"] <= inp.now
    bucket_supply = np.zeros((nm, nr), dtype=np.int64)
    np.add.at(bucket_supply, (o_model[avail], o_region[avail]), o_gpus[avail])
    order = np.lexsort((mkt_o["o_id"], mkt_o["o_ask"], o_region, o_model))
    order = order[avail[order]]
    views: dict[tuple[int, int, int], I64] = {}
    if len(order):
        key = o_model[order] * nr + o_region[order]
        cuts = np.flatnonzero(np.diff(key)) + 1
        for seg in np.split(order, cuts):
            m, r = int(o_model[seg[0]]), int(o_region[seg[0]])
            t = 1
            top = int(o_gpus[seg].max())
            while t <= top:
                sub = seg[o_gpus[seg] >= t]
                views[(m, r, t)] = sub.astype(np.int64)
                t *= 2

    return Market(
        now=inp.now,
        offers=offers,
        bids=bids,
        model_ids=model_ids,
        region_ids=region_ids,
        model_ok=model_ok,
        region_allowed=region_allowed,
        latency_ok=latency_ok,
        latency=latency,
        pen=pen,
        m_kw=tdp / 1000.0,
        b_carb=b_carb,
        r_carb=None if any(r.carbon_hourly for r in regions) else np.asarray([r.carbon_g_per_kwh for r in regions], dtype=np.float64),
        views=views,
        bucket_supply=bucket_supply,
        score_unit=unit,
        **mkt_o,
        **mkt_b,
    )


@dataclass
class Candidates:
    """Per bid, its best feasible offers: ``offers[b]`` by descending score."""

    offers: list[list[int]]
    scores: list[list[int]]
    truncated: list[bool]  # more feasible offers exist than were kept
    views: Sequence[list[tuple[int, int, int]]] | BidViews  # views the bid may draw from
    feasible_pairs: int
    pair_bid: I64  # every kept pair, for the LP bound
    pair_offer: I64
    pair_score: I64
    rest: I64 | None = None  # per bid, a bound on the score of any pair not kept


def bid_views(mkt: Market) -> list[list[tuple[int, int, int]]]:
    nb = len(mkt.bids)
    out: list[list[tuple[int, int, int]]] = [[] for _ in range(nb)]
    ok_b = mkt.b_deadline_ok
    for key in sorted(mkt.views):
        m, r, t = key
        sel = ok_b & mkt.model_ok[:, m] & mkt.region_allowed[:, r] & mkt.latency_ok[:, r]
        sel &= mkt.b_tier == t
        for b in np.flatnonzero(sel).tolist():
            out[b].append(key)
    return out


def pair_values(mkt: Market, bids: I64, offs: I64) -> tuple[F64, BoolA]:
    """Per-GPU-hour values (``Market.value``'s float steps) and the offer-level
    hard constraints, GPUs aside, of the block ``bids x offs`` (offers
    available now)."""
    bc = bids[:, None]
    ask = mkt.o_ask[offs][None, :]
    dur = mkt.b_dur[bc]
    ok = ask <= mkt.b_maxp[bc]
    ok &= mkt.o_rel[offs][None, :] >= mkt.b_minrel[bc]
    ok &= (mkt.o_min_dur[offs][None, :] <= dur) & (dur <= mkt.o_max_dur[offs][None, :])
    ok &= mkt.o_until[offs][None, :] >= mkt.now + mkt.b_span[bc]
    klass = mkt.b_klass[bc]
    ok &= ~mkt.o_resv[offs][None, :] | (klass == 0)
    ok &= ~mkt.o_spotonly[offs][None, :] | (klass == 2)
    ok &= (klass != 2) | mkt.o_spot[offs][None, :]
    ok &= mkt.o_cont[offs][None, :] | ~mkt.b_cont[bc]
    ok &= mkt.o_ports[offs][None, :] | ~mkt.b_ports[bc]
    if mkt.b_nvl[bids].any():  # most bids take any GPUs of a machine: only theirs are compared
        ok &= ~mkt.b_nvl[bc] | (mkt.o_nvl[offs][None, :] >= mkt.b_gpus[bc])
    need = mkt.b_hostneed[bids]
    if need.any():  # most bids ask for no host minimum: only their rows are compared
        rows = np.flatnonzero(need)
        ok[rows] &= (mkt.o_host[offs][None, :, :] >= mkt.b_host[bids[rows]][:, None, :]).all(axis=2)
    m = mkt.o_model[offs]
    r = mkt.o_region[offs]
    v = (mkt.b_maxp[bc] - ask).astype(np.float64) + mkt.b_wrel[bc] * mkt.o_rel[offs][None, :]
    v = v - mkt.pen[bc, r[None, :]]
    if mkt.r_carb is not None:  # one intensity per region for every bid: no bids x offers gather
        v = v - mkt.b_wc[bc] * (mkt.m_kw[m] * (mkt.r_carb[r] / 1000.0))[None, :]
    else:
        v = v - mkt.b_wc[bc] * (mkt.m_kw[m][None, :] * (mkt.b_carb[bc, r[None, :]] / 1000.0))
    return v, ok


def pair_scores(
    mkt: Market, bids: I64, offs: I64, same: bool = True, cap: I64 | None = None
) -> tuple[I64, BoolA]:
    """Scores and feasibility of the block ``bids x offs`` (offers of one bucket)."""
    v, ok = pair_values(mkt, bids, offs)
    bc = bids[:, None]
    if same:
        ok &= (mkt.o_gpus if cap is None else cap)[offs][None, :] >= mkt.b_gpus[bc]
    gh = mkt.b_gpus[bc].astype(np.float64) * mkt.b_hours[bc]
    # a pair worth nothing is out whatever its score: clipped, a huge penalty cannot
    # wrap the int64 cast (above, scores stay under SCORE_BUDGET: see ``score_unit``)
    score = np.rint(np.clip(gh * v, -1.0, SCORE_CAP)).astype(np.int64)
    ok &= score > 0
    return score, ok


def candidates(mkt: Market, max_candidates: int, group_scan: int) -> Candidates:
    nb = len(mkt.bids)
    views_of = bid_views(mkt)
    by_view: dict[tuple[int, int, int], list[int]] = {}
    for b, keys in enumerate(views_of):
        for key in keys:
            by_view.setdefault(key, []).append(b)
    truncated = [False] * nb
    pb: list[I64] = []
    po: list[I64] = []
    ps: list[I64] = []
    feasible = 0
    kmax = max_candidates if max_candidates > 0 else 1 << 30
    for key in sorted(by_view):
        view = mkt.views[key]
        bids_all = np.asarray(by_view[key], dtype=np.int64)
        scan = len(view) if group_scan <= 0 else min(len(view), group_scan)
        offs = view[:scan]
        if scan < len(view):
            # price-feasible offers beyond the scanned prefix: more exist
            more = mkt.o_ask[view[scan]] <= mkt.b_maxp[bids_all]
            for b in bids_all[more].tolist():
                truncated[b] = True
        step = max(1, CHUNK_CELLS // max(1, scan))
        for lo in range(0, len(bids_all), step):
            bids = bids_all[lo : lo + step]
            same_rows = mkt.b_same[bids]
            score, ok = pair_scores(mkt, bids, offs, same=True)
            if not same_rows.all():
                s2, ok2 = pair_scores(mkt, bids, offs, same=False)
                ok = np.where(same_rows[:, None], ok, ok2)
                score = np.where(same_rows[:, None], score, s2)
            feasible += int(ok.sum())
            masked = np.where(ok, score, np.int64(-1))
            if scan > kmax:
                # keep the best kmax per row (by score, then ask order = column)
                part = np.argsort(-masked, axis=1, kind="stable")[:, :kmax]
                masked = np.take_along_axis(masked, part, axis=1)
                cols = part
                rows_over = ok.sum(axis=1) > kmax
                for b in bids[rows_over].tolist():
                    truncated[b] = True
            else:
                cols = np.broadcast_to(np.arange(scan), masked.shape)
            rr, cc = np.nonzero(masked > 0)
            pb.append(bids[rr])
            po.append(offs[cols[rr, cc]])
            ps.append(masked[rr, cc])
    if pb:
        pair_bid = np.concatenate(pb)
        pair_offer = np.concatenate(po)
        pair_score = np.concatenate(ps)
    else:
        pair_bid = np.zeros(0, dtype=np.int64)
        pair_offer = np.zeros(0, dtype=np.int64)
        pair_score = np.zeros(0, dtype=np.int64)
    # per bid: descending score, then cheaper ask, then lower offer id
    order = np.lexsort((mkt.o_id[pair_offer], mkt.o_ask[pair_offer], -pair_score, pair_bid))
    pair_bid, pair_offer, pair_score = pair_bid[order], pair_offer[order], pair_score[order]
    offers_l: list[list[int]] = [[] for _ in range(nb)]
    scores_l: list[list[int]] = [[] for _ in range(nb)]
    if len(pair_bid):
        starts = np.flatnonzero(np.r_[True, pair_bid[1:] != pair_bid[:-1]])
        ends = np.r_[starts[1:], len(pair_bid)]
        keep = np.zeros(len(pair_bid), dtype=np.bool_)
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            b = int(pair_bid[s])
            e2 = min(e, s + kmax)
            if e2 < e:
                truncated[b] = True
            keep[s:e2] = True
            offers_l[b] = pair_offer[s:e2].tolist()
            scores_l[b] = pair_score[s:e2].tolist()
        pair_bid, pair_offer, pair_score = pair_bid[keep], pair_offer[keep], pair_score[keep]
    return Candidates(
        offers=offers_l,
        scores=scores_l,
        truncated=truncated,
        views=views_of,
        feasible_pairs=feasible,
        pair_bid=pair_bid,
        pair_offer=pair_offer,
        pair_score=pair_score,
    )


class BidViews:
    """Per bid, the views it may draw from (sorted), read off per-view bid lists.

    Built on demand: a 100k-bid round has millions of (bid, view) links and
    most bids never need theirs as Python objects.
    """

    def __init__(self, nb: int, by_view: dict[tuple[int, int, int], I64]) -> None:
        self.keys = sorted(by_view)
        self.by_view = by_view
        if self.keys:
            vb = np.concatenate([by_view[k] for k in self.keys])
            vk = np.concatenate([np.full(len(by_view[k]), i, dtype=np.int64) for i, k in enumerate(self.keys)])
        else:
            vb = vk = np.zeros(0, dtype=np.int64)
        order = np.lexsort((vk, vb))
        self._vk = vk[order]
        self._ptr = np.searchsorted(vb[order], np.arange(nb + 1))
        self._nb = nb

    def __len__(self) -> int:
        return self._nb

    def __iter__(self) -> Iterator[list[tuple[int, int, int]]]:
        return (self[b] for b in range(self._nb))

    def __getitem__(self, b: int) -> list[tuple[int, int, int]]:
        return [self.keys[i] for i in self._vk[self._ptr[b] : self._ptr[b + 1]].tolist()]

    def buckets(self) -> dict[tuple[int, int], I64]:
        """Per bucket (model, region), the bids that may use it, ascending."""
        parts: dict[tuple[int, int], list[I64]] = {}
        for m, r, t in self.keys:
            parts.setdefault((m, r), []).append(self.by_view[(m, r, t)])
        return {k: np.unique(np.concatenate(v)) for k, v in sorted(parts.items())}


def view_bids(mkt: Market) -> dict[tuple[int, int, int], I64]:
    """Per view, the bids whose bucket-level constraints and tier admit it."""
    out: dict[tuple[int, int, int], I64] = {}
    ok_b = mkt.b_deadline_ok
    bucket_ok: dict[tuple[int, int], BoolA] = {}
    for key in sorted(mkt.views):
        m, r, t = key
        sel = bucket_ok.get((m, r))
        if sel is None:
            sel = ok_b & mkt.model_ok[:, m] & mkt.region_allowed[:, r] & mkt.latency_ok[:, r]
            bucket_ok[(m, r)] = sel
        bids = np.flatnonzero(sel & (mkt.b_tier == t)).astype(np.int64)
        if len(bids):
            out[key] = bids
    return out


def top_candidates(
    mkt: Market,
    kmax: int,
    *,
    only: BoolA | None = None,
    cap: I64 | None = None,
    chunk: int = 16,
    scan_cap: int = 512,
    views: BidViews | None = None,
) -> Candidates:
    """Each bid's ``kmax`` best feasible offers, found without scoring every pair.

    A view is sorted by ask, and within one bucket a pair's score differs
    between offers only by ``-ask + w_rel * reliability``; so once the next
    offer's optimistic score (its ask, the best reliability still ahead) is
    no better than the bid's ``kmax``-th kept score, nothing further along
    the view can enter the list. Scanning stops there, in chunks, for many
    bids at once. ``rest[b]`` bounds from above the score of every feasible
    pair of ``b`` that was not kept (0 when there is none), which is what
    keeps the dual bound valid over *all* pairs. ``only`` limits the bids
    scanned (the others' lists come back empty), ``cap`` replaces the
    offers' GPUs (free capacity on a refill).
    """
    nb = len(mkt.bids)
    capa = mkt.o_gpus if cap is None else cap
    by_view = view_bids(mkt) if views is None else views.by_view
    top_s = np.full((nb, kmax), -1, dtype=np.int64)
    top_o = np.full((nb, kmax), -1, dtype=np.int64)
    kth = np.zeros(nb, dtype=np.int64)
    rest = np.zeros(nb, dtype=np.int64)
    feasible = 0
    for key in sorted(by_view):
        m, r, t = key
        bids_all = by_view[key]
        if only is not None:
            bids_all = bids_all[only[bids_all]]
        view = mkt.views[key]
        if cap is not None:
            view = view[capa[view] >= max(t, 1)]
        if not len(bids_all) or not len(view):
            continue
        asks = mkt.o_ask[view]
        relmax = np.maximum.accumulate(mkt.o_rel[view][::-1])[::-1]
        base = (
            mkt.b_maxp[bids_all].astype(np.float64)
            - mkt.pen[bids_all, r]
            - mkt.b_wc[bids_all] * (mkt.m_kw[m] * (mkt.r_carb[r] / 1000.0) if mkt.r_carb is not None else mkt.m_kw[m] * (mkt.b_carb[bids_all, r] / 1000.0))
        )
        gh = mkt.b_gpus[bids_all].astype(np.float64) * mkt.b_hours[bids_all]
        wrel = mkt.b_wrel[bids_all]
        maxp = mkt.b_maxp[bids_all]

        def optimistic(pos: int, sel: I64, gh: F64 = gh, base: F64 = base, wrel: F64 = wrel,
                       relmax: F64 = relmax, asks: I64 = asks) -> I64:
            # no pair at or after ``pos`` in the view scores above this
            v = gh[sel] * (base[sel] + wrel[sel] * relmax[pos] - float(asks[pos]))
            out: I64 = np.ceil(np.clip(v, -1.0, SCORE_CAP)).astype(np.int64) + 1
            return out

        loc = np.arange(len(bids_all), dtype=np.int64)
        ub = optimistic(0, loc)
        live = (asks[0] <= maxp) & (ub > 0)
        act = loc[live & (ub > kth[bids_all])]
        skipped = loc[live & (ub <= kth[bids_all])]
        rest[bids_all[skipped]] = np.maximum(rest[bids_all[skipped]], ub[skipped])
        pos = 0
        while len(act) and pos < len(view):
            bids = bids_all[act]
            offs = view[pos : pos + chunk]
            same_rows = mkt.b_same[bids]
            score, ok = pair_scores(mkt, bids, offs, same=True, cap=capa)
            if not same_rows.all():
                s2, ok2 = pair_scores(mkt, bids, offs, same=False, cap=capa)
                ok = np.where(same_rows[:, None], ok, ok2)
                score = np.where(same_rows[:, None], score, s2)
            feasible += int(ok.sum())
            ms = np.concatenate([top_s[bids], np.where(ok, score, np.int64(-1))], axis=1)
            mo = np.concatenate([top_o[bids], np.broadcast_to(offs, score.shape)], axis=1)
            # best score first; among equal scores, each bid its own order (``tie_key``)
            order = np.lexsort((-tie_key(mkt.bids_id[bids][:, None], mkt.o_id[mo]), -ms), axis=1)
            ms = np.take_along_axis(ms, order, axis=1)
            mo = np.take_along_axis(mo, order, axis=1)
            top_s[bids] = ms[:, :kmax]
            top_o[bids] = mo[:, :kmax]
            rest[bids] = np.maximum(rest[bids], np.maximum(ms[:, kmax], 0))
            kth[bids] = np.maximum(ms[:, kmax - 1], 0)
            pos += len(offs)
            if pos >= len(view):
                break
            ub = optimistic(pos, act)
            live = (asks[pos] <= maxp[act]) & (ub > 0)
            go = live & (ub > kth[bids]) & (pos < scan_cap)
            stop = act[live & ~go]
            rest[bids_all[stop]] = np.maximum(rest[bids_all[stop]], ub[live & ~go])
            act = act[go]
    keep = top_s > 0
    rr, cc = np.nonzero(keep)
    pair_bid = rr.astype(np.int64)
    pair_offer = top_o[rr, cc]
    pair_score = top_s[rr, cc]
    order = np.lexsort((mkt.o_id[pair_offer], mkt.o_ask[pair_offer], -pair_score, pair_bid))
    pair_bid, pair_offer, pair_score = pair_bid[order], pair_offer[order], pair_score[order]
    cuts = np.searchsorted(pair_bid, np.arange(nb + 1)).tolist()
    po_l, ps_l = pair_offer.tolist(), pair_score.tolist()
    rows = range(nb) if only is None else np.flatnonzero(only).tolist()  # lists only where asked
    offers_l: list[list[int]] = [[] for _ in range(nb)]
    scores_l: list[list[int]] = [[] for _ in range(nb)]
    for b in rows:
        offers_l[b] = po_l[cuts[b] : cuts[b + 1]]
        scores_l[b] = ps_l[cuts[b] : cuts[b + 1]]
    return Candidates(
        offers=offers_l,
        scores=scores_l,
        truncated=(rest > 0).tolist(),
        views=BidViews(nb, by_view) if views is None else views,
        feasible_pairs=feasible,
        pair_bid=pair_bid,
        pair_offer=pair_offer,
        pair_score=pair_score,
        rest=rest,
    )


def multi_offers(mkt: Market, b: int, key: tuple[int, int, int]) -> tuple[I64, F64]:
    """The offers of view ``key`` a multi-machine bid ``b`` may take parts on (within
    its price, its other hard constraints, positive value), with their value per
    GPU-hour, in the view's order (ask, then id)."""
    view = mkt.views[key]
    view = view[: int(np.searchsorted(mkt.o_ask[view], int(mkt.b_maxp[b]), side="right"))]
    v, ok = mkt.values(b, view)
    ok &= v > 0
    return view[ok], v[ok]


def unfillable(
    mkt: Market, bids: list[int], cap: I64, views: Sequence[list[tuple[int, int, int]]] | BidViews
) -> dict[tuple[int, int], I64]:
    """Per bucket, the multi-machine bids among ``bids`` that cannot get all
    their GPUs there even from all the free GPUs of every offer they could
    use: no assignment ever uses their pairs in that bucket."""
    out: dict[tuple[int, int], list[int]] = {}
    for b in bids:
        if mkt.b_same[b]:
            continue
        one = np.asarray([b], dtype=np.int64)
        for m, r, t in views[b]:
            view = mkt.views[(m, r, t)]
            view = view[cap[view] > 0]
            _, ok = pair_scores(mkt, one, view, same=False, cap=cap)
            if int(cap[view][ok[0]].sum()) < int(mkt.b_gpus[b]):
                out.setdefault((m, r), []).append(b)
    return {k: np.asarray(sorted(v), dtype=np.int64) for k, v in sorted(out.items())}


def price_out(
    mkt: Market,
    bids: I64,
    lam: I64,
    tau: I64,
    views: BidViews,
    cap: I64,
    width: int = 4,
    chunk: int = 64,
    skip: dict[tuple[int, int], I64] | None = None,
) -> tuple[I64, I64, I64, I64]:
    """Per bid in ``bids``, the best reduced score ``score - gpus * price`` over
    its feasible pairs on capacity ``cap``, where ``price`` is ``lam[o]`` for a
    1-D ``lam`` and the offer's price for the bid's size (``tier_prices``) for
    one row of prices per divisibility row, exact wherever it exceeds ``tau``,
    and up to ``width`` pairs that beat ``tau`` (the columns to add).

    Returns (reduced per bid, and per new pair: bid, offer, score). Each view
    is scanned in ask order and a bid stops once the optimistic reduced score
    of everything ahead - its optimistic score with the cheapest ask and best
    reliability still ahead, less its GPUs times the lowest price still ahead
    - is at most the larger of ``tau`` and its ``width``-th best found (which
    is at most the best). ``lam`` are non-negative integers: exact arithmetic.
    ``skip`` names, per bucket, bids whose pairs there are left out.
    """
    nb = len(mkt.bids)
    lo = -(2**62)  # below any reduced score; negating it does not overflow
    n = len(bids)
    slot = np.full(nb, -1, dtype=np.int64)
    slot[bids] = np.arange(n)
    top_r = np.full((n, width), lo, dtype=np.int64)
    top_o = np.full((n, width), -1, dtype=np.int64)
    top_s = np.zeros((n, width), dtype=np.int64)
    thr = np.asarray(tau, dtype=np.int64)
    price = tier_prices(lam)
    jb_all = size_tier(mkt.b_gpus, mkt.b_same)
    for key in views.keys:
        m, r, t = key
        bids_all = views.by_view[key]
        bids_all = bids_all[slot[bids_all] >= 0]
        if skip is not None and (m, r) in skip:
            bids_all = bids_all[~np.isin(bids_all, skip[(m, r)])]
        view = mkt.views[key]
        if not len(bids_all) or not len(view):
            continue
        view = view[cap[view] >= max(t, 1)]
        if not len(view):
            continue
        asks = mkt.o_ask[view]
        relmax = np.maximum.accumulate(mkt.o_rel[view][::-1])[::-1]
        lammin = np.minimum.accumulate(price[view][::-1], axis=0)[::-1]
        base = (
            mkt.b_maxp[bids_all].astype(np.float64)
            - mkt.pen[bids_all, r]
            - mkt.b_wc[bids_all] * (mkt.m_kw[m] * (mkt.r_carb[r] / 1000.0) if mkt.r_carb is not None else mkt.m_kw[m] * (mkt.b_carb[bids_all, r] / 1000.0))
        )
        gpus = mkt.b_gpus[bids_all]
        jb = jb_all[bids_all]
        gh = gpus.astype(np.float64) * mkt.b_hours[bids_all]
        wrel = mkt.b_wrel[bids_all]
        maxp = mkt.b_maxp[bids_all]
        act = np.arange(len(bids_all), dtype=np.int64)
        pos = 0
        while len(act) and pos < len(view):
            v = gh[act] * (base[act] + wrel[act] * relmax[pos] - float(asks[pos]))
            ub = np.ceil(np.clip(v, -1.0, SCORE_CAP)).astype(np.int64) + 1 - gpus[act] * lammin[pos, jb[act]]
            sl = slot[bids_all[act]]
            go = (asks[pos] <= maxp[act]) & (ub > np.maximum(thr[sl], top_r[sl, -1]))
            act = act[go]
            if not len(act):
                break
            b_act = bids_all[act]
            sl = slot[b_act]
            offs = view[pos : pos + chunk]
            same_rows = mkt.b_same[b_act]
            score, ok = pair_scores(mkt, b_act, offs, same=True, cap=cap)
            if not same_rows.all():
                s2, ok2 = pair_scores(mkt, b_act, offs, same=False, cap=cap)
                ok = np.where(same_rows[:, None], ok, ok2)
                score = np.where(same_rows[:, None], score, s2)
            red = score - mkt.b_gpus[b_act][:, None] * price[offs[None, :], jb[act][:, None]]
            red = np.where(ok, red, lo)
            if not (red >= top_r[sl, -1][:, None]).any():
                pos += len(offs)
                continue
            mr = np.concatenate([top_r[sl], red], axis=1)
            mo = np.concatenate([top_o[sl], np.broadcast_to(offs, red.shape)], axis=1)
            ms = np.concatenate([top_s[sl], score], axis=1)
            # among equal reduced scores, each bid its own order (``tie_key``), as in ``top_candidates``
            order = np.lexsort((-tie_key(mkt.bids_id[b_act][:, None], mkt.o_id[mo]), -mr), axis=1)[:, :width]
            top_r[sl] = np.take_along_axis(mr, order, axis=1)
            top_o[sl] = np.take_along_axis(mo, order, axis=1)
            top_s[sl] = np.take_along_axis(ms, order, axis=1)
            pos += len(offs)
    best = top_r[:, 0]
    red_out: I64 = np.maximum(best, 0)
    hit = (top_r > thr[:, None]) & (top_o >= 0)
    rr, cc = np.nonzero(hit)
    return red_out, bids[rr], top_o[rr, cc], top_s[rr, cc]
