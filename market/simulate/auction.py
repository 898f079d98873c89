"""The ``gridbid`` policy: the market itself. Waiting pods are bids, nodes with free GPUs
are offers, and each round is cleared by the real engine (``market.engine.clear_round``),
with its candidate search, lexicographic classes, pricing and tie-breaks.

A round runs at each instant of the simulation (an arrival or a completion) when pods are
waiting: the book is every waiting pod's bid and every node's free GPUs. A trade starts the
pod on the node at once and holds its GPUs until its runtime has passed (a booking, released
on completion); an unmatched bid stays in the book for the next round. The chain, the
network and the agents are not simulated: a trade's job starts the moment it clears.

Orders, the way the server maps its rows (``market/repository.py``):

* **Offers**: one per node with free GPUs (``gpus`` = free), id and machine = the node's
  index + 1, provider = the node's index // 8 + 1, its region and catalogue model, open
  for any duration, spot allowed, reliability 0.99. A node an inference service lends is
  a lent offer (``spot_only``): it sells to spot bids only, at ``LENT_ASK`` (half) of the
  node's usual ask, since its owner would otherwise leave those GPUs dark. Its ask is the catalogue's rate for the
  model times a seeded spread, uniform in [0.8, 1.2] per node (``ask_spread``).
* **Bids**: one per waiting pod, same machine, for its GPUs and its models (any, where the
  trace gives none), booked for the runtime it still has rounded up to whole hours (the
  trace holds no requested durations; buyers book in hours, as the bid form asks and SF
  Compute sells, so a 10-minute pod books an hour); the buyer is the pod's team. Its class follows its QoS: ``Guaranteed`` reserved, ``BE`` (best effort) spot, the
  rest on-demand; a pod the run's preemptible rule marks (``--spot-qos``) bids as spot. Its limit price is the catalogue rate of the dearest model it allows that
  the cluster has, times a seeded spread uniform in [1.2, 1.5] per pod: every buyer could pay
  the usual ask of any GPU it can use, and prefers the cheaper ones by the engine's surplus.
  Default scoring weights (latency, region, carbon, reliability), as a bid placed without
  them would have.

What the buyers pay is what the rounds charged: the uniform clearing price x GPUs x the
time the pod ran (the live market pays a provider the GPU-seconds of its signed receipt and
refunds the rest of the booking), so ``cost_per_gpu_hour`` for this policy is the market's,
not an owned cluster's.

**Backfill (issue 36).** With an inference service that lends, a lent node's offer closes
its window (``available_until``) at the next hour its tide is expected to reach into that
node (``window``): the first hour ahead whose need passes both the need now and the GPUs of
the service's nodes before it, which it fills first. A spot pod's bid carries its
predicted p90 (``market.runtime``, refitted every ``prediction.REFIT_S`` on the pods
finished by then, capped at the booking) where the policy predicts (``gridbid``), so the
engine may backfill it into a window shorter than its booking; without predictions
(``gridbid-no-predict``) its booking must fit the window whole. The tide still preempts
whatever runs on GPUs it takes, as before: a forecast or a prediction that was wrong costs
a preemption.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from market import carbon, engine, runtime
from providers import catalogue

from .prediction import REFIT_S, record
from .sim import F64, I64, Service
from .trace import Node, Pod

EPOCH = 1_640_995_200  # the simulation's second 0 on the engine's clock: 2022-01-01T00:00Z, hour 0 of the grids' series (metrics.CARBON_EPOCH)
ASK_SPREAD = (0.8, 1.2)
VALUE_SPREAD = (1.2, 1.5)
LENT_ASK = 0.5  # a lent node asks this share of its usual ask: idle GPUs its owner would leave dark
KLASS = {"Guaranteed": "reserved", "BE": "spot"}  # any other QoS: on_demand
RELIABILITY = 0.99
HOUR_S = 3600
WINDOW_HORIZON_H = 14 * 24  # a lent window looks this far ahead for the tide's next rise; none: open-ended
# gridbid-carbon (issue 37): every buyer prices carbon at this (base units per kg: 0.19 USD, the US
# EPA's 2023 social cost of carbon, 190 USD a tonne); gridbid prices it at nothing
CARBON_WEIGHT = 190_000.0
DEFER_QOS = frozenset({"BE", "Burstable"})  # the pods that may wait for a cleaner hour: best effort and burstable
PACK_BAND = 50_000  # gridbid-pack: a trade may give up 0.05 USD per GPU-hour of value to fragment its bucket less
DEFER_S = 6 * HOUR_S  # ... for at most this long after they arrive (their latest start)
FORECAST_HOURS = 48  # the grid forecast a round sees, as the live market's (grid_carbon.FORECAST_HOURS)


def booked_s(left: float) -> int:
    """What a pod books for the ``left`` seconds it still has to run: whole hours."""
    return min(engine.limits.MAX_DURATION_S, max(1, math.ceil(left / HOUR_S)) * HOUR_S)


def _usd(x: float) -> int:
    return round(x * 1_000_000)


def asks(nodes: Sequence[Node], seed: int) -> list[int]:
    """Each trace node's ask (base units per GPU-hour): its model's catalogue rate x a seeded spread."""
    rates = catalogue.gpu_models()
    spread = np.random.default_rng([30, 2, seed]).uniform(*ASK_SPREAD, size=len(nodes))
    return [_usd(rates[n.model].usd_per_hour * float(f)) for n, f in zip(nodes, spread, strict=True)]


def limits(pods: Sequence[Pod], nodes: Sequence[Node], seed: int) -> list[int]:
    """Each pod's limit price: the dearest model it allows that ``nodes`` have, x a seeded spread."""
    rates = catalogue.gpu_models()
    have = sorted({n.model for n in nodes})
    value = np.random.default_rng([30, 3, seed]).uniform(*VALUE_SPREAD, size=len(pods))
    out = []
    for p, f in zip(pods, value, strict=True):
        allowed = [m for m in have if not p.models or m in p.models] or have
        out.append(_usd(max(rates[m].usd_per_hour for m in allowed) * float(f)))
    return out


@dataclass
class Market:
    """The chooser ``sim.run`` asks at each instant: it clears one round through the engine.
    ``asks`` per node of ``nodes``, ``limits`` per pod of ``pods``."""

    pods: Sequence[Pod]
    nodes: Sequence[Node]
    asks: Sequence[int]
    limits: Sequence[int]
    spot_only: frozenset[int] = frozenset()  # nodes whose GPUs sell to spot bids only (a service's, lent)
    closed: frozenset[int] = frozenset()  # nodes never offered (a service's, not lent)
    spot: frozenset[int] = frozenset()  # pods that bid as spot whatever their QoS (the run's preemptible rule)
    paid: float = 0.0  # USD charged by the rounds (a preempted trade pro rata)
    rounds: int = 0
    trades: int = 0
    engine_s: float = 0.0
    models: tuple[engine.GpuModel, ...] = ()
    regions: tuple[engine.Region, ...] = ()
    latency: tuple[tuple[str, str, float], ...] = field(default=())
    charged: dict[int, tuple[int, float]] = field(default_factory=dict)  # pod -> (its trade's price, seconds it will run)
    service: Service | None = None  # an inference service that lends: its lent nodes' windows close at its rises
    predict: bool = False  # spot bids carry their predicted p90 (backfill)
    backfilled: int = 0  # trades the engine placed past their offer's window on a p90
    carbon_aware: bool = False  # gridbid-carbon: carbon weight on, the grids' hourly forecasts, deferrable pods wait
    carbon_weight: float = CARBON_WEIGHT
    pack_band: int = 0  # gridbid-pack: the engine's packing band (issue 38), base units per GPU-hour
    deferred: set[int] = field(default_factory=set)  # pods that waited for a cleaner hour at least once
    _feed: carbon.Feed | None = None
    _ahead: tuple[int, tuple[engine.Region, ...]] | None = None
    _cum_before: dict[int, int] = field(default_factory=dict)
    _ends: F64 = field(default_factory=lambda: np.zeros(0))
    _by_end: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _model: runtime.Model | None = None
    _fitted_at: float = -1.0

    def __post_init__(self) -> None:
        rates = catalogue.gpu_models()
        models = tuple(engine.GpuModel(m.id, m.vendor, m.memory_gib, float(m.compute_units), m.tdp_watts)
                       for m in sorted(rates.values(), key=lambda m: m.id))
        regs = catalogue.regions()
        self.models = models
        self.regions = tuple(engine.Region(r.id, float(r.carbon_g_per_kwh)) for r in sorted(regs.values(), key=lambda r: r.id))
        self.latency = tuple(sorted((a, b, ms) for (a, b), ms in catalogue.latency_matrix().items()))
        if self.service is not None and self.service.lend:
            before = 0
            for j in self.service.owned:  # the order the tide takes its nodes' GPUs in (sim.run's tide)
                self._cum_before[j] = before
                before += self.nodes[j].gpus
        if self.carbon_aware:
            self._feed = carbon.Feed(carbon.EiaReplay(), {r.id: r.carbon_g_per_kwh for r in self.regions})
        if self.predict:
            self._ends = np.asarray([p.arrival + p.runtime for p in self.pods], dtype=np.float64)
            self._by_end = np.argsort(self._ends, kind="stable")
            self._ends = self._ends[self._by_end]  # in end order: a refit takes a prefix

    def window(self, j: int, clock: float) -> int | None:
        """When lent node ``j``'s window closes, in simulation seconds: the first hour ahead
        whose need passes both the need now and the GPUs of the service's nodes before ``j``;
        None: not within WINDOW_HORIZON_H, or ``j`` is not lent."""
        if self.service is None or j not in self._cum_before:
            return None
        need = self.service.need
        floor = max(need(clock), self._cum_before[j])
        hour = int(clock // HOUR_S)
        for k in range(hour + 1, hour + 1 + WINDOW_HORIZON_H):
            if need(k * HOUR_S) > floor:
                return k * HOUR_S
        return None

    def predicted(self, i: int, clock: float, booked: int) -> runtime.Prediction | None:
        """Pod ``i``'s predicted run time for what it has left, from a fit on the pods finished
        by the last refit (every REFIT_S); None before the market has enough, or unpredicted."""
        if not self.predict:
            return None
        due = math.floor(clock / REFIT_S) * REFIT_S
        if due != self._fitted_at:
            done = self._by_end[: int(np.searchsorted(self._ends, due, side="right"))]
            self._model = runtime.fit([record(self.pods[k]) for k in done.tolist()])
            self._fitted_at = due
        r = record(self.pods[i])
        assert self._model is not None
        return self._model.predict(buyer=r.buyer, workload=r.workload, gpus=r.gpus, model=r.model, cap_s=booked)

    def p90(self, i: int, clock: float, booked: int) -> int | None:
        """Pod ``i``'s predicted p90 run time (what backfill trusts)."""
        got = self.predicted(i, clock, booked)
        return None if got is None else max(1, math.ceil(got.p90_s))

    def offer(self, j: int, free: int, clock: float = 0.0) -> engine.Offer:
        """Node ``j``'s offer of its ``free`` GPUs; a service's lent node sells to spot bids
        only, until its window closes (``window``)."""
        n = self.nodes[j]
        lent = j in self.spot_only
        until = self.window(j, clock) if lent else None
        return engine.Offer(id=j + 1, provider_id=j // 8 + 1, machine_id=j + 1, region=n.region, gpu_model=n.model,
                            gpus=free, ask=self.ask(j), min_duration_s=0, max_duration_s=engine.limits.MAX_DURATION_S,
                            available_from=0, available_until=None if until is None else EPOCH + until, spot_allowed=True,
                            reserved_only=False, reliability=RELIABILITY, created_at=EPOCH, spot_only=lent)

    def ask(self, j: int) -> int:
        """Node ``j``'s ask: its own, or ``LENT_ASK`` of it where a service lends it."""
        return round(self.asks[j] * LENT_ASK) if j in self.spot_only else self.asks[j]

    def bid(self, i: int, left: float, clock: float = 0.0) -> engine.Bid:
        """Pod ``i``'s bid for the ``left`` seconds it still has to run, booked in whole hours;
        a spot bid carries its predicted p90 where the policy predicts."""
        p = self.pods[i]
        klass = self.klass(i)
        booked = booked_s(left)
        return engine.Bid(id=i + 1, buyer_id=p.team + 1, gpus=p.gpus, gpu_models=p.models, min_memory_gib=0,
                          min_compute_units=0.0, vendor=None, same_machine=True, allowed_regions=(),
                          preferred_regions=(), location_region=None, max_latency_ms=None,
                          max_price=self.limits[i], duration_s=booked,
                          deadline=None, klass=klass, min_reliability=0.0,
                          weights=self.weights, created_at=EPOCH + int(p.arrival),
                          runtime_p90_s=self.p90(i, clock, booked) if klass == "spot" and self._cum_before else None)

    @property
    def weights(self) -> engine.Weights:
        """The default weights, with carbon at ``carbon_weight`` (gridbid-carbon) or at nothing."""
        return dataclasses.replace(engine.DEFAULT_WEIGHTS, carbon_per_kg=self.carbon_weight if self.carbon_aware else 0.0)

    @property
    def hourly(self) -> bool:
        """Whether ``sim.run`` must wake the market each hour: pods waiting for a cleaner hour
        bid when it comes, though nothing arrives or ends then."""
        return self.carbon_aware

    def grid(self, clock: float) -> tuple[engine.Region, ...]:
        """The regions at ``clock``: each grid's hour now and the forecast after it
        (``carbon.Feed.ahead``: the same hour of the 3 days before), as a live round sees them."""
        hour = int(clock // HOUR_S)
        if self._feed is None:
            return self.regions
        if self._ahead is None or self._ahead[0] != hour:
            t = EPOCH + hour * HOUR_S
            regs = []
            for r in self.regions:
                got = self._feed.ahead(r.id, t, FORECAST_HOURS)
                fed = got.source != "constant"
                regs.append(engine.Region(r.id, got.g_per_kwh[0], got.g_per_kwh if fed else ()))
            self._ahead = (hour, tuple(regs))
        return self._ahead[1]

    def waits(self, clock: float, waiting: list[int], offers: Sequence[engine.Offer], regions: Sequence[engine.Region]) -> set[int]:
        """The deferrable pods (``DEFER_QOS``, until ``DEFER_S`` after they arrived) that wait
        for a cleaner hour this round, by the live market's rule (``carbon.defer``): over the
        regions of the round's offers each could take, its run its predicted median (else its
        booking) on the most frugal of those offers' models."""
        if not self.carbon_aware:
            return set()
        ahead = {r.id: r.carbon_hourly or (r.carbon_g_per_kwh,) for r in regions}
        tdp = {m.id: m.tdp_watts for m in self.models}
        now = EPOCH + int(clock)
        out = set()
        for i in waiting:
            p = self.pods[i]
            latest = p.arrival + DEFER_S
            if p.qos not in DEFER_QOS or clock >= latest:
                continue
            mine = [o for o in offers if o.gpus >= p.gpus and (not p.models or o.gpu_model in p.models)
                    and (not o.spot_only or self.klass(i) == "spot")]
            if not mine:
                continue
            got = self.predicted(i, clock, booked_s(p.runtime))
            span = booked_s(p.runtime) if got is None else max(1, math.ceil(got.p50_s))
            kw = min(tdp[o.gpu_model] for o in mine) / 1000
            if carbon.defer(now=now, latest_start=EPOCH + int(latest), span_s=span, kwh=p.gpus * kw * span / 3600,
                            value_per_kg=self.carbon_weight, ahead={o.region: ahead[o.region] for o in mine}) is not None:
                out.add(i)
        self.deferred |= out
        return out

    def klass(self, i: int) -> str:
        """Pod ``i``'s class: spot where the run marks it preemptible, else by its QoS."""
        if i in self.spot:
            return "spot"
        return KLASS.get(self.pods[i].qos, "on_demand")

    def book(self, waiting: list[int], free: I64) -> list[int]:
        """The nodes whose offers are in the round's book: per bucket (model x region) and
        per size ``g`` of a waiting bid, the cheapest nodes (by ask, then index) with at least
        ``g`` GPUs free, one more than the bids of ``g`` GPUs or more. Every waiting bid can
        still be placed whole on its own node of any bucket it could have used, the cheapest
        losing ask of each bucket is there for the price, and the engine reads dozens of
        offers a round, not the cluster's 1,213 (a 1-day window: 4.9 s of engine time with
        every node, 2.0 s with these, for the same trades)."""
        sizes = sorted({self.pods[i].gpus for i in waiting})
        at_least = {g: sum(1 for i in waiting if self.pods[i].gpus >= g) for g in sizes}
        spot = [i for i in waiting if self.klass(i) == "spot"]
        spot_at_least = {g: sum(1 for i in spot if self.pods[i].gpus >= g) for g in sizes}
        buckets: dict[tuple[str, str, bool], list[int]] = {}
        for j in np.flatnonzero(free > 0).tolist():
            if j in self.closed:
                continue
            n = self.nodes[j]
            buckets.setdefault((n.model, n.region, j in self.spot_only), []).append(j)
        keep: set[int] = set()
        for (_, _, lent), js in sorted(buckets.items()):
            js.sort(key=lambda j: (self.ask(j), j))
            for g in sizes:
                room = [j for j in js if free[j] >= g]
                want = spot_at_least[g] if lent else at_least[g]  # a lent node sells to spot bids only
                if want:
                    keep.update(room[: want + 1])
        return sorted(keep)

    def preempted(self, pod: int, ran: float) -> None:
        """A trade stopped after ``ran`` seconds is billed for those only, as the live market
        bills a preempted job by the GPU-seconds of its signed receipt."""
        price, runs = self.charged.pop(pod)
        unrun = max(0.0, runs - ran)
        self.paid -= price * self.pods[pod].gpus * unrun / 3600 / 1_000_000

    def __call__(self, clock: float, waiting: list[int], free: I64, left: F64) -> list[tuple[int, int]]:
        """One round over the open offers; a service's idle GPUs, where it lends them, are
        offers that sell to spot bids only (``engine.Offer.spot_only``, as a lent offer of
        the live market is)."""
        offers = tuple(self.offer(j, int(free[j]), clock) for j in self.book(waiting, free))
        if not offers or not waiting:
            return []
        regions = self.grid(clock)
        later = self.waits(clock, waiting, offers, regions)
        bidding = [i for i in waiting if i not in later]
        if not bidding:
            return []
        inp = engine.RoundInput(now=EPOCH + int(clock), offers=offers, bids=tuple(self.bid(i, float(left[i]), clock) for i in bidding),
                                gpu_models=self.models, regions=regions, latency_ms=self.latency,
                                running=(), config=engine.RoundConfig(pack_band=self.pack_band))
        t = time.perf_counter()
        res = engine.clear_round(inp)
        self.engine_s += time.perf_counter() - t
        self.rounds += 1
        out = []
        for tr in res.trades:
            i = tr.bid_id - 1
            out.append((i, tr.offer_id - 1))
            # the booking is refunded past what the pod runs, as the live market settles a receipt
            self.paid += tr.price * tr.gpus * float(left[i]) / 3600 / 1_000_000
            self.charged[i] = (tr.price, float(left[i]))
            self.trades += 1
            self.backfilled += tr.backfill_until is not None
        return out
