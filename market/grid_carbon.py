"""The market's carbon feed (issue 37): ``market.carbon``'s ``Feed``, built once per process
from CARBON_FEED, with each region's catalogue constant (the ``Region`` table) as the
fallback. Rounds and quotes price carbon at the hour they clear; ``/readyz`` and the
operator page say where each region's figure came from.

A reading is kept per region and hour: the replay's hour never changes, and a live feed is
asked at most once an hour per region and process, or once a minute while it fails. One
call asks it for FEED_TIMEOUT_S in all: the regions left once that is spent take their
constant until the next minute, so a feed that hangs costs a round or a quote at most that,
once a minute, however many regions there are.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db import transaction

from market import carbon, engine
from market.models import Job
from providers.models import Region

FEED_TIMEOUT_S = 2.0
FORECAST_HOURS = 48  # the hours ahead a round sees; a job expected to run longer is priced at the last one past them
RETRY_FAILED_S = 60.0

_lock = threading.Lock()
_feed: tuple[str, carbon.Feed] | None = None
_origin: float | None = None  # when this process first read the feed's clock (GRIDBID_CARBON_CLOCK_SPEED)
_readings: dict[tuple[str, int], tuple[float, carbon.Reading]] = {}


def feed() -> carbon.Feed:
    """The process's feed for CARBON_FEED (rebuilt if the setting changed: tests)."""
    global _feed
    name = settings.CONFIG.carbon_feed
    with _lock:
        if _feed is None or _feed[0] != name:
            source: carbon.Source | None
            if name == "eia-2022":
                source = carbon.EiaReplay()
            elif name == "constant":
                source = None
            else:
                source = carbon.HttpSource(name, timeout_s=FEED_TIMEOUT_S)
            _feed = (name, carbon.Feed(source, {}))
            _readings.clear()
        return _feed[1]


def feed_time(now: datetime) -> int:
    """The feed's clock at ``now`` (unix seconds): the wall clock, or under
    GRIDBID_CARBON_CLOCK_SPEED (tests and demos) a clock that runs that many times faster from
    the moment this process first read it. The engine still integrates a job's hours at wall
    speed; only which hour of the grid it is, and so what a deferrable bid waits for, runs fast."""
    global _origin
    t = now.timestamp()
    speed = settings.CONFIG.carbon_clock_speed
    if speed == 1:
        return int(t)
    if _origin is None:
        _origin = t
    return int(_origin + (t - _origin) * speed)


def wall_time(t: int) -> float:
    """The wall clock's unix second at the feed's second ``t`` (``feed_time``'s inverse)."""
    speed = settings.CONFIG.carbon_clock_speed
    return float(t) if speed == 1 or _origin is None else _origin + (t - _origin) / speed


def carbon_ahead(now: datetime) -> dict[str, carbon.Reading]:
    """Each region's intensity for FORECAST_HOURS from the hour of ``now``: the hour now, then
    the feed's forecast (``carbon.Feed.ahead``: the replay's from the same hour of the days
    before); a constant region its figure repeated; and its source."""
    f = feed()
    t = feed_time(now)
    hour = t - t % 3600
    out = {}
    spent = 0.0
    rows = list(Region.objects.order_by("id").values_list("id", "carbon_g_per_kwh"))
    f.constants = {**f.constants, **{r: float(c) for r, c in rows}}
    for region, constant in rows:
        key = (region, hour)
        kept = _readings.get(key)
        if kept is not None and (kept[1].source != "constant" or f.source is None or time.monotonic() - kept[0] < RETRY_FAILED_S):
            out[region] = kept[1]
            continue
        if f.source is not None and spent >= FEED_TIMEOUT_S:
            why = f"the carbon feed took {spent:.1f} s for the regions before {region}; it is asked again within a minute"
            got = carbon.Reading((float(constant),) * FORECAST_HOURS, "constant", why)
            f.status[region] = (got.source, why)
        else:
            began = time.monotonic()
            got = f.ahead(region, t, FORECAST_HOURS)
            spent += time.monotonic() - began
        _readings[key] = (time.monotonic(), got)
        out[region] = got
    if len(_readings) > 4096:  # old hours: a long-running process keeps the current ones only
        for k in [k for k in _readings if k[1] < hour]:
            del _readings[k]
    return out


def carbon_summary(readings: dict[str, carbon.Reading]) -> tuple[bool, str]:
    """(whether the configured feed served every region it should, one line for /readyz)."""
    name = settings.CONFIG.carbon_feed
    fed = sorted(r for r, x in readings.items() if x.source != "constant")
    constant = {r: x.why for r, x in readings.items() if x.source == "constant"}
    if name == "constant":
        return True, "CARBON_FEED=constant: every region at its catalogue figure"
    failing = {r: why for r, why in constant.items() if "has no series" not in why}
    if failing:
        region, why = sorted(failing.items())[0]
        return False, (f"{len(failing)} region(s) fell back to their constant because the feed failed ({region}: {why}); "
                       f"{len(fed)} from {name}")
    return True, f"{', '.join(fed) or 'no region'} hourly from {'the ' + name + ' series' if name == 'eia-2022' else name}; " \
                 f"{len(constant)} other region(s) at their constant (no series)"


def job_carbon(job_id: int) -> float | None:
    """Measure and keep an ended job's kg CO2: its receipts' GPU-seconds at its GPU model's
    TDP, at its region's grid intensity averaged over the hours between its start and its end
    (the feed's series for those hours; the constant where there is none). None: not ended,
    or measured already (it is measured once)."""
    job = Job.objects.select_related("trade__gpu_model").filter(pk=job_id).first()
    if job is None or job.kg_co2 is not None or job.ended_at is None or job.started_at is None:
        return None
    t0 = int(job.started_at.timestamp())
    seconds = max((job.ended_at - job.started_at).total_seconds(), 0.0)
    region = job.trade.region_id
    f = feed()
    constant = Region.objects.filter(pk=region).values_list("carbon_g_per_kwh", flat=True).first()
    f.constants = {**f.constants, region: float(constant or 0.0)}
    hours = max(1, int((t0 % 3600 + seconds) // 3600) + 1)
    values: list[float] = []
    sources = set()
    first = t0 - t0 % 3600
    for k in range(0, hours, carbon.MAX_HOURS):
        got = f.hourly(region, first + 3600 * k, min(carbon.MAX_HOURS, hours - k))
        values.extend(got.g_per_kwh)
        sources.add(got.source)
    mean = carbon.mean_over(values, t0, seconds) if seconds > 0 else values[0]
    kwh = job.gpu_seconds / 3600 * job.trade.gpu_model.tdp_watts / 1000
    kg = round(kwh * mean / 1000, 6)
    figures = {"g_per_kwh": round(mean, 1), "kwh": round(kwh, 4), "source": " and ".join(sorted(sources))}
    with transaction.atomic():  # merged into the checkpoint as it is now, under the row lock the receipt writer takes too
        locked = Job.objects.select_for_update().filter(pk=job.pk, kg_co2__isnull=True).first()
        if locked is None:
            return None
        locked.checkpoint = {**(locked.checkpoint or {}), "carbon": figures}
        locked.kg_co2 = kg
        locked.save(update_fields=["kg_co2", "checkpoint", "updated_at"])
    return kg


def _could_take(b: engine.Bid, o: engine.Offer, models: dict[str, engine.GpuModel]) -> bool:
    """Whether offer ``o`` is of a kind bid ``b`` could take: model or specs, region, price,
    size on one machine, class. The engine decides the rest when the bid bids."""
    m = models.get(o.gpu_model)
    if m is None:
        return False
    model_ok = o.gpu_model in b.gpu_models if b.gpu_models else (
        m.memory_gib >= b.min_memory_gib and m.compute_units >= b.min_compute_units and (b.vendor is None or m.vendor == b.vendor))
    return bool(
        model_ok
        and (not b.allowed_regions or o.region in b.allowed_regions)
        and o.ask <= b.max_price
        and (not b.same_machine or o.gpus >= b.gpus)
        and (not o.spot_only or b.klass == "spot")
        and (not o.reserved_only or b.klass == "reserved")
    )


def deferrals(inp: engine.RoundInput, latest: dict[int, datetime], now: datetime) -> dict[int, carbon.Wait]:
    """The deferrable bids of a round (``latest``: bid id -> the latest start it accepts) that
    wait for a cleaner hour, with why (``carbon.defer``, at the feed's clock). A bid's regions
    are those of the round's offers it could take, each with the forecast the round prices
    (``Region.carbon_hourly``; a constant region its figure now); its run is its predicted
    median, else its booking, on the most frugal GPU model of those offers (a wait must pay
    even there). A bid no offer could take bids as usual: waiting would not help it."""
    models = {m.id: m for m in inp.gpu_models}
    ahead = {r.id: tuple(r.carbon_hourly) or (r.carbon_g_per_kwh,) for r in inp.regions}
    t_now = feed_time(now)
    out: dict[int, carbon.Wait] = {}
    for b in inp.bids:
        until = latest.get(b.id)
        if until is None:
            continue
        offers = [o for o in inp.offers if _could_take(b, o, models)]
        if not offers:
            continue
        last = int(until.timestamp())
        if b.deadline is not None:
            last = min(last, b.deadline - b.duration_s)
        span = b.runtime_p50_s or b.duration_s
        kw = min(models[o.gpu_model].tdp_watts for o in offers) / 1000
        wait = carbon.defer(now=t_now, latest_start=feed_time(datetime.fromtimestamp(last, UTC)), span_s=span,
                            kwh=b.gpus * kw * span / 3600, value_per_kg=b.weights.carbon_per_kg,
                            ahead={o.region: ahead[o.region] for o in offers if o.region in ahead})
        if wait is not None:
            out[b.id] = wait
    return out


def wait_explanation(wait: carbon.Wait) -> dict[str, object]:
    """A waiting bid's explanation fields: the reason (times on the wall clock, UTC) and the figures."""
    at = datetime.fromtimestamp(wall_time(wait.at), UTC)
    return {
        "reasons": [wait.text(lambda t: datetime.fromtimestamp(wall_time(t), UTC).strftime("%H:%M UTC"))],
        "deferred": True,
        "cleaner_at": at.isoformat(),
        "carbon": {"region": wait.region, "expected_g_per_kwh": round(wait.expected, 1), "now_region": wait.now_region,
                   "now_g_per_kwh": round(wait.now_g, 1), "saving_kg": round(wait.saving_kg, 3)},
    }
