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
from datetime import datetime

from django.conf import settings

from market import carbon
from market.models import Job
from providers.models import Region

FEED_TIMEOUT_S = 2.0
FORECAST_HOURS = 48  # the hours ahead a round sees; a job expected to run longer is priced at the last one past them
RETRY_FAILED_S = 60.0

_lock = threading.Lock()
_feed: tuple[str, carbon.Feed] | None = None
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


def carbon_ahead(now: datetime) -> dict[str, carbon.Reading]:
    """Each region's intensity for FORECAST_HOURS from the hour of ``now``: the hour now, then
    the feed's forecast (``carbon.Feed.ahead``: the replay's from the same hour of the days
    before); a constant region its figure repeated; and its source."""
    f = feed()
    t = int(now.timestamp())
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
    meta = {**(job.checkpoint or {}), "carbon": {"g_per_kwh": round(mean, 1), "kwh": round(kwh, 4), "source": " and ".join(sorted(sources))}}
    Job.objects.filter(pk=job.pk, kg_co2__isnull=True).update(kg_co2=kg, checkpoint=meta)
    return kg
