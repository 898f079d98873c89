"""When a bid that waits is likely to start (issue 36): from the predicted ends of the jobs
holding the GPUs it could take.

For a bid the round could not place because no offer it could take has room:
- **The offers it could take.** Open offers of a model it names (any model if it names
  none), in a region it allows, asking at most its maximum, of its class, each with at least
  its GPUs (same-machine bids; a bid spread over machines gets no estimate).
- **When each offer's GPUs come back.** Each held booking's job ends at the median its bid
  was placed with (``Bid.runtime_prediction``). Once past that, it ends at its p80. Past
  that too, or with no prediction, it ends at its booking's end (the time it bought, plus
  the grace every booking has).
- **The estimate.** The earliest moment some such offer has the bid's GPUs free, and which
  model and region that is: "likely in about 40 min, when 4 × H100-SXM-80GB in us-east free
  up".

It is an estimate: bids placed meanwhile, new offers and jobs that end early or late all
move it. It checks the bid's model, region, price, class, size and the offer's window, not
its latency, reliability or host needs. A bid that some offer could take now (outbid, or
held back by a limit checked here) gets none, and so does a bid no offer could take at any
time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from market import runtime
from market.models import Bid, BidClass, Booking, Offer
from market.states import BookingState, OfferState

SCAN = 256  # offers looked at per bucket and bid, soonest first: a bound on a round's work


@dataclass(frozen=True)
class Start:
    at: datetime
    gpus: int
    gpu_model: str
    region: str

    def text(self, now: datetime) -> str:
        wait = max((self.at - now).total_seconds(), 0.0)
        return (f"likely to start in about {runtime.span(wait)} ({self.at:%Y-%m-%d %H:%M:%S} UTC), when {self.gpus} × {self.gpu_model} "
                f"in {self.region} free up, from the predicted ends of the jobs holding them")


@dataclass
class _Offer:
    id: int
    model: str
    region: str
    ask: int
    gpus: int
    free: int
    spot_allowed: bool
    reserved_only: bool
    lent: bool
    releases: list[tuple[datetime, int]]  # (when, GPUs), in time order

    def free_by(self, gpus: int, now: datetime) -> datetime | None:
        """When this offer first has ``gpus`` free: now, or a release's time; None: never."""
        have = self.free
        if have >= gpus:
            return now
        for when, g in self.releases:
            have += g
            if have >= gpus:
                return when
        return None

    def takes(self, bid: Bid) -> bool:
        spot = bid.klass == BidClass.SPOT
        return (self.ask <= bid.max_price and self.gpus >= bid.gpus and (not self.reserved_only or bid.klass == BidClass.RESERVED)
                and (not self.lent or spot) and (not spot or self.spot_allowed))


def _release_time(now: datetime, started: datetime, ends_at: datetime, prediction: object) -> datetime:
    p = prediction if isinstance(prediction, dict) else {}
    for q in ("p50_s", "p80_s"):
        v = p.get(q)
        if isinstance(v, int | float) and v > 0:
            at = started + timedelta(seconds=float(v))
            if at > now:
                return min(at, ends_at)
    return max(ends_at, now)


def starts_estimate(bids: Iterable[Bid], *, now: datetime) -> dict[int, Start]:
    """Per bid (by id; an unsaved bid counts as id 0) its likely start, where there is one
    and no offer it could take has room now."""
    wanted = [b for b in bids if b.same_machine]
    if not wanted:
        return {}
    rows = Offer.objects.filter(state=OfferState.OPEN, available_from__lte=now).values_list(
        "id", "gpu_model_id", "machine__region_id", "price", "gpus", "gpus_free", "spot_allowed", "reserved_only", "reclaimable",
        "available_until")
    offers = {r[0]: _Offer(r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], []) for r in rows}
    until = {r[0]: r[9] for r in rows}
    held = Booking.objects.filter(state=BookingState.HELD, offer_id__in=list(offers)).values_list(
        "offer_id", "gpus", "starts_at", "ends_at", "trade__job__started_at", "trade__bid__runtime_prediction")
    for offer_id, gpus, starts_at, ends_at, started, prediction in held:
        offers[offer_id].releases.append((_release_time(now, started or starts_at, ends_at, prediction), gpus))
    buckets: dict[tuple[str, str], list[_Offer]] = defaultdict(list)
    for o in offers.values():
        o.releases.sort()
        buckets[(o.model, o.region)].append(o)
    soonest: dict[tuple[str, str, int], list[tuple[datetime, int, _Offer]]] = {}

    def by_time(key: tuple[str, str], gpus: int) -> list[tuple[datetime, int, _Offer]]:
        k = (*key, gpus)
        if k not in soonest:
            got = [(t, o.id, o) for o in buckets[key] if (t := o.free_by(gpus, now)) is not None]
            soonest[k] = sorted(got, key=lambda x: (x[0], x[1]))
        return soonest[k]

    out: dict[int, Start] = {}
    for bid in wanted:
        models, regions = set(bid.gpu_models or ()), set(bid.allowed_regions or ())
        best: tuple[datetime, _Offer] | None = None
        room_now = False
        for key in buckets:
            if (models and key[0] not in models) or (regions and key[1] not in regions):
                continue
            for t, _, o in by_time(key, bid.gpus)[:SCAN]:
                if best is not None and t >= best[0]:
                    break
                end = until[o.id]
                if not o.takes(bid) or (end is not None and end < t + timedelta(seconds=bid.duration_s)):
                    continue
                if t <= now:
                    room_now = True
                    break
                best = (t, o)
                break
            if room_now:
                break
        if best is not None and not room_now:
            out[bid.pk or 0] = Start(best[0], bid.gpus, best[1].model, best[1].region)
    return out

