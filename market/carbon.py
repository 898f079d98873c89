"""Grid carbon intensity by the hour (issue 37): one time series per region, from a source
that can be swapped, with the region's constant as the fallback.

Real grids swing by a factor of two or more within a day. The catalogue's one number per
region (``providers/data/regions.json``) is the fallback, never the first choice.

- **Regions onto grids** (the one mapping, ``GRID_OF_REGION``). us-east is PJM
  (Mid-Atlantic, with Virginia), us-central is MISO (the Midwest, with Iowa) and us-west is
  BPAT (Bonneville, the Pacific Northwest, with Oregon). The simulator maps its regions the
  same way. Regions outside the US have no hourly feed here and keep their constant.
- **The shipped source** (``EiaReplay``) is the EIA-930 hourly series of 2022
  (``market/data/carbon-eia-2022/``, with its attribution), replayed by hour of year: hour
  ``h`` of any year reads hour ``h`` of 2022, and the 366th day of a leap year reads the
  365th again. A forecast from it is the same replay ahead.
- **A live source** (``HttpSource``) is any HTTP endpoint that answers
  ``GET {url}?region=R&start=T&hours=N`` with
  ``{"region": R, "start": T, "g_co2_per_kwh": [N numbers]}``: hourly values from the hour
  that holds unix second ``T``; hours still to come are the feed's forecast. It may add
  ``"updated": U``, the unix second its figures were last refreshed: figures more than
  ``stale_s`` (6 h) old are stale. Answers are checked; a bad or stale one is a
  ``CarbonFeedError`` naming what was wrong.
- **The forecast** (``Feed.ahead``). A live feed forecasts itself. The replay is history, and
  reading its next hours would be knowing the future, so the hours ahead of a source that
  does not forecast (``Source.forecasts``) are the mean of the same hour on the previous
  ``FORECAST_DAYS`` days it has passed (``seasonal``); the hour now is its own.
- **Waiting for a cleaner hour** (``defer``, the rule deferrable bids follow; below).
- **The fallback** (``Feed``). Where the source has no series for a region, fails, or is
  stale, the region's constant is used, and ``Feed.status`` says so and why (``/readyz``
  and the operator page show it).

Pure: no Django, no clock (times are passed in), and the network and the clock (for
staleness) only in ``HttpSource``.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

DATA = Path(__file__).resolve().parent / "data" / "carbon-eia-2022"
GRID_OF_REGION: dict[str, str] = {"us-east": "PJM", "us-central": "MISO", "us-west": "BPAT"}
HOURS = 8760  # a series holds one non-leap year, hour by hour from 1 January 00:00 UTC
MAX_HOURS = 24 * 14  # the most hours one request may ask of a source
MAX_G_PER_KWH = 5000.0  # above any grid's intensity (coal alone is about 1,000)
STALE_S = 6 * 3600.0  # a live feed whose figures were updated longer ago than this is stale
FORECAST_DAYS = 3  # a forecast from history: the mean of the same hour on this many previous days
DEFER_MIN_CUT = 0.10  # a deferrable bid waits only for an hour at least this much cleaner than now
DEFER_MIN_VALUE = 10_000  # ... and only where the carbon it saves is worth this much to its buyer (base units: 0.01 USD)


class CarbonDataError(ValueError):
    """A series file that cannot be read: the message names the file, line and field."""


class CarbonFeedError(RuntimeError):
    """A source that did not answer, or answered something unusable: the message says which."""


@dataclass(frozen=True)
class Series:
    """One grid's hourly intensity over a year, g CO2 per kWh."""

    grid: str
    year: int
    g_per_kwh: tuple[float, ...]  # HOURS values

    def hour_of_year(self, t: int) -> int:
        """The series' hour for unix second ``t``: its hour of its own year (UTC); the last
        day of a leap year reads the day before."""
        at = datetime.fromtimestamp(t, UTC)
        h = int((at - datetime(at.year, 1, 1, tzinfo=UTC)).total_seconds() // 3600)
        return h - 24 if h >= HOURS else h

    def at(self, t: int) -> float:
        return self.g_per_kwh[self.hour_of_year(t)]

    def hourly(self, start: int, hours: int) -> tuple[float, ...]:
        """``hours`` values from the hour that holds ``start``, replayed past the year's end."""
        h0 = self.hour_of_year(start)
        return tuple(self.g_per_kwh[(h0 + k) % HOURS] for k in range(hours))


def read_series(path: Path, grid: str) -> Series:
    """A grid's file (``timestamp,g_co2_per_kwh``, gzipped or not): 8,760 consecutive hours of
    one year from 1 January 00:00 UTC, each a finite intensity from 0 to MAX_G_PER_KWH."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CarbonDataError(f"{path}: no such carbon series; the shipped ones are in {DATA}") from None
    try:
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CarbonDataError(f"{path}: not a readable CSV file ({exc})") from None
    rows = list(csv.reader(io.StringIO(text)))
    if not rows or [c.strip() for c in rows[0]] != ["timestamp", "g_co2_per_kwh"]:
        raise CarbonDataError(f"{path} line 1: the header must be 'timestamp,g_co2_per_kwh'")
    body = rows[1:]
    if len(body) != HOURS:
        raise CarbonDataError(f"{path}: {len(body)} hours; a series holds {HOURS}, one non-leap year from 1 January 00:00 UTC")
    values, year = [], 0
    for k, row in enumerate(body):
        line = k + 2
        if len(row) != 2:
            raise CarbonDataError(f"{path} line {line}: expected 2 fields (timestamp, g_co2_per_kwh), got {len(row)}")
        try:
            at = datetime.fromisoformat(row[0].strip().replace("Z", "+00:00"))
        except ValueError:
            raise CarbonDataError(f"{path} line {line}: timestamp {row[0]!r} is not ISO 8601 (2022-01-01T00:00:00Z)") from None
        if at.tzinfo is None:
            raise CarbonDataError(f"{path} line {line}: timestamp {row[0]!r} has no time zone; write it in UTC (Z)")
        if k == 0:
            year = at.astimezone(UTC).year
        want = datetime(year, 1, 1, tzinfo=UTC).timestamp() + 3600 * k
        if at.timestamp() != want:
            raise CarbonDataError(f"{path} line {line}: timestamp {row[0]} is not hour {k} of {year}: the hours must run on, one a row")
        try:
            v = float(row[1])
        except ValueError:
            raise CarbonDataError(f"{path} line {line}: g_co2_per_kwh {row[1]!r} is not a number") from None
        if not math.isfinite(v) or not 0 <= v <= MAX_G_PER_KWH:
            raise CarbonDataError(f"{path} line {line}: g_co2_per_kwh {row[1]!r} must be from 0 to {MAX_G_PER_KWH:g}")
        values.append(v)
    return Series(grid, year, tuple(values))


class Source(Protocol):
    """Where hourly intensity comes from: ``hours`` values from the hour that holds
    ``start`` for ``region``, or None where it has no series for that region."""

    name: str
    forecasts: bool  # whether its hours still to come are a forecast (a live feed), not history to be forecast from

    def hourly(self, region: str, start: int, hours: int) -> tuple[float, ...] | None: ...


class EiaReplay:
    """The shipped EIA-930 series of 2022, by ``GRID_OF_REGION``, replayed by hour of year."""

    name = "eia-2022 replay"
    forecasts = False  # 2022 as it happened: its next hours are forecast from the days before (``seasonal``)

    def __init__(self, data: Path = DATA, grids: Mapping[str, str] = GRID_OF_REGION) -> None:
        self.grids = dict(grids)
        self.series = {g: read_series(data / f"{g}.csv.gz", g) for g in sorted(set(self.grids.values()))}

    def hourly(self, region: str, start: int, hours: int) -> tuple[float, ...] | None:
        grid = self.grids.get(region)
        return None if grid is None else self.series[grid].hourly(start, hours)


class HttpSource:
    """A live feed over HTTP (the module's docstring gives the protocol)."""

    name = "http"
    forecasts = True

    def __init__(self, url: str, timeout_s: float = 5.0, stale_s: float = STALE_S, clock: Callable[[], float] = time.time) -> None:
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"carbon feed URL {url!r} must be http:// or https:// with a host")
        self.url, self.timeout_s, self.stale_s, self.clock = url, timeout_s, stale_s, clock

    def hourly(self, region: str, start: int, hours: int) -> tuple[float, ...] | None:
        if not 1 <= hours <= MAX_HOURS:
            raise ValueError(f"hours must be from 1 to {MAX_HOURS}, got {hours}")
        query = urllib.parse.urlencode({"region": region, "start": start, "hours": hours})
        sep = "&" if urllib.parse.urlsplit(self.url).query else "?"
        try:
            with urllib.request.urlopen(f"{self.url}{sep}{query}", timeout=self.timeout_s) as r:  # noqa: S310 - scheme checked above
                body = r.read(1 << 20)
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None  # the feed has no series for this region
            raise CarbonFeedError(f"carbon feed {self.url} answered HTTP {exc.code} for {region}") from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            raise CarbonFeedError(f"carbon feed {self.url} did not answer for {region}: {getattr(exc, 'reason', exc)}") from None
        return _checked(body, region, start, hours, self.url, stale_s=self.stale_s, now=self.clock())


def _checked(body: bytes, region: str, start: int, hours: int, url: str, *, stale_s: float = math.inf, now: float = 0.0) -> tuple[float, ...]:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise CarbonFeedError(f"carbon feed {url} answered something that is not JSON for {region}") from None
    if not isinstance(doc, dict) or doc.get("region") != region:
        raise CarbonFeedError(f"carbon feed {url} answered for region {doc.get('region') if isinstance(doc, dict) else None!r}, not {region!r}")
    if doc.get("start") != start - start % 3600 and doc.get("start") != start:
        raise CarbonFeedError(f"carbon feed {url} answered from {doc.get('start')!r}, not the hour of {start}")
    updated = doc.get("updated")
    if updated is not None:
        if isinstance(updated, bool) or not isinstance(updated, int | float) or not math.isfinite(updated):
            raise CarbonFeedError(f"carbon feed {url} answered updated={updated!r} for {region}: give unix seconds, or leave it out")
        if now - updated > stale_s:
            raise CarbonFeedError(f"carbon feed {url} is stale for {region}: its figures were updated {(now - updated) / 3600:.1f} h ago, "
                                  f"more than {stale_s / 3600:g} h")
    vals = doc.get("g_co2_per_kwh")
    if not isinstance(vals, list) or len(vals) != hours:
        raise CarbonFeedError(f"carbon feed {url} answered {len(vals) if isinstance(vals, list) else 'no'} hourly values for {region}, not {hours}")
    out = []
    for k, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not 0 <= v <= MAX_G_PER_KWH:
            raise CarbonFeedError(f"carbon feed {url}: hour {k} for {region} is {v!r}, not an intensity from 0 to {MAX_G_PER_KWH:g} g/kWh")
        out.append(float(v))
    return tuple(out)


@dataclass(frozen=True)
class Reading:
    """One region's intensity for a span of hours, and where it came from: ``source`` is the
    feed's name, or "constant" with ``why`` the feed was not used."""

    g_per_kwh: tuple[float, ...]
    source: str
    why: str = ""


@dataclass
class Feed:
    """A source with each region's constant as the fallback. ``status`` keeps, per region, the
    last reading's source and why (what /readyz and the operator page show)."""

    source: Source | None
    constants: Mapping[str, float]
    status: dict[str, tuple[str, str]] = field(default_factory=dict)

    def hourly(self, region: str, start: int, hours: int) -> Reading:
        constant = float(self.constants[region])
        if self.source is None:
            got = Reading((constant,) * hours, "constant", "no carbon feed is configured")
        else:
            try:
                series = self.source.hourly(region, start, hours)
            except CarbonFeedError as exc:
                series, why = None, str(exc)
            else:
                why = f"{self.source.name} has no series for {region}"
            got = Reading(series, self.source.name) if series is not None else Reading((constant,) * hours, "constant", why)
        self.status[region] = (got.source, got.why)
        return got

    def now(self, region: str, t: int) -> Reading:
        return self.hourly(region, t, 1)

    def ahead(self, region: str, t: int, hours: int) -> Reading:
        """``hours`` values from the hour that holds ``t``, the first the hour now and the rest a
        forecast: the source's own where it forecasts, else ``seasonal`` of its history."""
        if self.source is None or self.source.forecasts:
            return self.hourly(region, t, hours)
        back = history_hours(hours)
        got = self.hourly(region, t - 3600 * back, back + 1)
        if got.source == "constant":
            return Reading(got.g_per_kwh[: hours], got.source, got.why)
        return Reading(seasonal(got.g_per_kwh, hours), got.source, got.why)


def history_hours(hours: int, days: int = FORECAST_DAYS) -> int:
    """How many hours before the hour now ``seasonal`` needs to forecast ``hours`` values."""
    return 24 * (days + math.ceil(max(hours - 1, 0) / 24))


def seasonal(history: Sequence[float], hours: int, days: int = FORECAST_DAYS) -> tuple[float, ...]:
    """A forecast of ``hours`` values from hourly ``history`` whose last value is the hour now:
    the hour now itself, then for hour ``k`` ahead the mean of the same hour of day on the
    ``days`` most recent days already past (``k - 24 d`` hours from now, for the ``days``
    smallest ``d`` with ``24 d >= k``). ``history`` holds ``history_hours(hours, days) + 1``
    values or more."""
    need = history_hours(hours, days) + 1
    if len(history) < need:
        raise ValueError(f"a forecast of {hours} hours from {days} days needs {need} hours of history, got {len(history)}")
    last = len(history) - 1
    out = [float(history[last])]
    for k in range(1, hours):
        first = math.ceil(k / 24)
        out.append(sum(float(history[last + k - 24 * d]) for d in range(first, first + days)) / days)
    return tuple(out)


@dataclass(frozen=True)
class Wait:
    """Why a deferrable bid waits: ``expected`` g/kWh over its run from ``at`` (the start of an
    hour ahead) in ``region``, against ``now_g`` from now at best (in ``now_region``)."""

    region: str
    at: int
    expected: float
    now_region: str
    now_g: float
    saving_kg: float

    def text(self, clock: Callable[[int], str]) -> str:
        elsewhere = "" if self.now_region == self.region else f" in {self.now_region}"
        return (f"waiting for a cleaner hour: {self.expected:.0f} g/kWh expected at {clock(self.at)} in {self.region} "
                f"vs {self.now_g:.0f} now{elsewhere}; {self.saving_kg:.2f} kg CO2 less")


def defer(*, now: int, latest_start: int, span_s: int, kwh: float, value_per_kg: float,
          ahead: Mapping[str, Sequence[float]], min_cut: float = DEFER_MIN_CUT, min_value: float = DEFER_MIN_VALUE) -> Wait | None:
    """The waiting rule of a deferrable bid. ``ahead``: for each region it could run in, the
    hourly forecast from the hour that holds ``now`` (``Feed.ahead``); ``span_s`` the run it
    expects (its predicted median, else its booking); ``kwh`` what that run draws;
    ``value_per_kg`` its buyer's carbon weight (base units per kg).

    The best start now is the region with the least mean intensity over ``[now, now +
    span_s)``. The best later start is the (hour, region) with the least mean over the span
    from the start of an hour ahead, up to ``latest_start`` and inside the forecast (ties: the
    earlier hour, then the region's name). The bid waits (a ``Wait``) when that later start
    is at least ``min_cut`` cleaner than now and the carbon it saves, at the buyer's weight,
    is worth at least ``min_value``; else it bids now (None). Asked again each round, so a
    forecast that changes moves the wait, and at ``latest_start`` it bids whatever the hour."""
    if not ahead or span_s <= 0 or kwh <= 0 or value_per_kg <= 0 or latest_start <= now:
        return None
    now_g, now_region = min((mean_over(v, now, span_s), r) for r, v in sorted(ahead.items()) if v)
    hour0 = now - now % 3600
    best: tuple[float, int, str] | None = None
    for r, v in sorted(ahead.items()):
        for k in range(1, len(v)):
            at = hour0 + 3600 * k
            if at > latest_start:
                break
            g = mean_over(v[k:], at, span_s)
            if best is None or (g, at, r) < best:
                best = (g, at, r)
    if best is None:
        return None
    g, at, region = best
    saving_kg = (now_g - g) * kwh / 1000
    if g > now_g * (1 - min_cut) or saving_kg * value_per_kg < min_value:
        return None
    return Wait(region, at, g, now_region, now_g, saving_kg)


def mean_over(values: Sequence[float], start: int, seconds: float) -> float:
    """The mean intensity over ``seconds`` from unix second ``start``, ``values`` being hourly
    from the hour that holds ``start`` (each hour weighted by the part of it the span covers;
    past the last value, the last value)."""
    if seconds <= 0 or not values:
        return values[0] if values else 0.0
    first = start - start % 3600
    total, t, end = 0.0, float(start), start + seconds
    while t < end:
        k = int((t - first) // 3600)
        nxt = min(first + 3600 * (k + 1), end)
        total += values[min(k, len(values) - 1)] * (nxt - t)
        t = nxt
    return total / seconds
