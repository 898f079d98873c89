"""Template filters for money, timestamps, durations, sparklines and the round-time bar."""

from __future__ import annotations

import datetime as dt
import math
import re
from typing import Any

from django import template
from django.utils.html import conditional_escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

from contracts import hours as utc_schedule
from market import money as m
from market import runtime
from market.engine import STAGES
from providers.catalogue import cuda_text

register = template.Library()


def _units(value: object) -> int | None:
    if value is None or value == "" or isinstance(value, bool):
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None


@register.filter
def money(base_units: object) -> str:
    """An amount's figure, where the unit is written beside it: base units -> '12.50'."""
    v = _units(base_units)
    return "—" if v is None else m.figure(v)


@register.filter
def usdc(base_units: object) -> str:
    """An amount: token base units -> '12.50 USDC'."""
    v = _units(base_units)
    return "—" if v is None else m.usdc(v)


@register.filter
def price(base_units: object) -> str:
    """A price: token base units per GPU-hour -> '2.26 USDC/GPU-h'."""
    v = _units(base_units)
    return "—" if v is None else m.price(v)


@register.filter
def usdc_input(base_units: object) -> str:
    """Base units as a form field's value, in USDC without the unit ('12.5')."""
    v = _units(base_units)
    return "" if v is None else m.figure(v).replace(",", "")


@register.filter
def per_cu(price_: object, compute_units: float) -> str:
    """Price per compute-unit-hour ('0.5707 USDC/CU-h'): compares GPUs of different speeds."""
    v = _units(price_)
    return (v is not None and m.price_per_cu(v, compute_units)) or "—"


TS_FORMAT = "%Y-%m-%d %H:%M:%S UTC"  # app.js rewrites it in the reader's zone, same shape


def _moment(value: object) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    if isinstance(value, (int, float)) and not isinstance(value, bool) or isinstance(value, str) and value.isascii() and value.isdigit():
        try:
            return dt.datetime.fromtimestamp(int(value), tz=dt.UTC)  # type: ignore[arg-type]
        except (OverflowError, OSError, ValueError):
            return None
    if isinstance(value, str) and value:
        try:
            parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)
    return None


@register.filter
def when(value: object, default: str = "—") -> SafeString:
    """A moment (datetime, ISO text or Unix seconds) as one format everywhere:
    '2026-12-04 13:25:07 UTC', which app.js shows in the reader's own zone."""
    at = _moment(value)
    if at is None:
        return format_html("{}", default)
    at = at.astimezone(dt.UTC).replace(microsecond=0)
    return format_html('<time class="ts" datetime="{}">{}</time>', at.isoformat().replace("+00:00", "Z"), at.strftime(TS_FORMAT))


@register.simple_tag
def trade_money(money_: object) -> SafeString:
    """A trade's money in three figures, as the chain moved it: locked, paid, refunded
    (``ledger.selectors.TradeMoney``; None: nothing locked on chain yet)."""
    if money_ is None or not getattr(money_, "locked", 0):
        return mark_safe('<span class="money-line" data-locked="0">nothing locked on chain yet</span>')  # noqa: S308 - a constant
    locked, paid, refunded = money_.locked, money_.paid, money_.refunded  # type: ignore[attr-defined]
    if not paid and not refunded:
        return format_html('<span class="money-line" data-locked="{}" data-paid="0" data-refunded="0">locked <b>{}</b>, not settled yet</span>',
                           locked, m.usdc(locked))
    return format_html('<span class="money-line" data-locked="{}" data-paid="{}" data-refunded="{}">locked <b>{}</b> · paid <b>{}</b> · refunded <b>{}</b></span>',
                       locked, paid, refunded, m.usdc(locked), m.usdc(paid), m.usdc(refunded))


_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2}) (\d{2}:\d{2}:\d{2}) UTC")


@register.filter
def times(text: object) -> SafeString:
    """Text with every 'YYYY-MM-DD HH:MM:SS UTC' in it (a bid's explanation, written once by
    the server) as a ``when`` <time>, which app.js shows in the reader's zone; the rest escaped."""
    escaped = str(conditional_escape("" if text is None else text))
    return mark_safe(_STAMP.sub(  # noqa: S308 - the text is escaped above; only the stamps become markup
        lambda g: f'<time class="ts" datetime="{g[1]}T{g[2]}Z">{g[0]}</time>', escaped))


@register.filter
def tokens(base_units: object) -> str:
    """Token base units exactly, at least two decimals: 1400 -> '0.0014', 2000000 -> '2.00'.
    For money a provider reconciles with the chain to the unit."""
    v = _units(base_units)
    return "—" if v is None else m.figure(v)


@register.filter
def hours(seconds: int | None) -> str:
    if seconds is None:
        return "—"
    h = seconds / 3600
    return f"{h:g} h" if h >= 1 else f"{seconds // 60} min"


@register.filter
def span(seconds: float | None) -> str:
    """A run time as the runtime predictor words it: 45 s, 12 min, 1.6 h, 2.3 d."""
    return "—" if seconds is None else runtime.span(float(seconds))


@register.filter
def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}%"


@register.simple_tag
def sparkline(points: list[int], width: int = 120, height: int = 28) -> SafeString:
    """An inline SVG sparkline of clearing prices (no JavaScript needed)."""
    if not points:
        return mark_safe('<span class="muted">no trades yet</span>')
    if len(points) == 1:
        points = [points[0], points[0]]
    lo, hi = min(points), max(points)
    span = (hi - lo) or 1
    step = width / (len(points) - 1)
    coords = " ".join(f"{i * step:.1f},{height - 2 - (p - lo) / span * (height - 4):.1f}" for i, p in enumerate(points))
    up = points[-1] >= points[0]
    return format_html(
        '<svg class="spark {}" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="price trend"><polyline fill="none" stroke-width="1.5" points="{}"/></svg>',
        "up" if up else "down", width, height, width, height, coords,
    )


@register.filter
def selling_window(offer: Any) -> str:
    """When an offer sells, if not from now on for ever: 'sells from 14 Dec 08:00 until 18 Dec
    18:00 UTC' (issue 40: offers state their windows, and a buyer sees them)."""
    from django.utils import timezone

    start, end = getattr(offer, "available_from", None), getattr(offer, "available_until", None)
    fmt = "%d %b %H:%M"
    words = []
    if start is not None and start > timezone.now():
        words.append(f"from {start.astimezone(dt.UTC).strftime(fmt)}")
    if end is not None:
        words.append(f"until {end.astimezone(dt.UTC).strftime(fmt)}")
    return f"sells {' '.join(words)} UTC" if words else ""


@register.simple_tag
def forward_calendar(windows: list[Any], last_price: int | None = None, width: int = 640, height: int = 130) -> SafeString:
    """The market ahead (``market.forward``) as an inline SVG: a bar per window for the GPUs
    free in all of it (scale on the left), the window's best ask as a line and the last
    clearing price dashed (scale on the right). Hovering a bar names its window, its GPUs
    and its ask. Every sixth hour (or every day) is labelled under the axis."""
    if not windows:
        return mark_safe('<p class="empty-inline">Nothing on sale ahead.</p>')
    top = max(w.gpus_free for w in windows) or 1
    left, right, plot = 26, width - 44, height - 16  # room for the scales and the labels
    step = (right - left) / len(windows)
    day = (windows[0].ends_at - windows[0].starts_at).total_seconds() >= 86_400
    prices = [w.best_ask for w in windows if w.best_ask is not None] + ([last_price] if last_price is not None else [])
    lo, hi = (min(prices), max(prices)) if prices else (0, 1)
    if hi == lo:
        lo, hi = lo * 0.9, hi * 1.1 or 1

    def price_y(p: int) -> float:
        return plot - 4 - (p - lo) / (hi - lo) * (plot - 8)

    bars, labels, line, runs = [], [], [], []
    for k, w in enumerate(windows):
        x = left + k * step
        h = w.gpus_free / top * (plot - 2)
        when = w.starts_at.strftime("%a %d %b" if day else "%a %H:%M") + " UTC"
        ask = f"from {price(w.best_ask)}" if w.best_ask is not None else "none free"
        bars.append(format_html(
            '<rect class="fwd{}" x="{}" y="{}" width="{}" height="{}" data-gpus-free="{}" data-best-ask="{}"><title>{}: {} GPU{} free, {}</title></rect>',
            "" if w.gpus_free else " fwd-none", f"{x + 1:.1f}", f"{plot - h:.1f}", f"{max(step - 2, 1):.1f}", f"{h:.1f}",
            w.gpus_free, "" if w.best_ask is None else w.best_ask, when, w.gpus_free, "" if w.gpus_free == 1 else "s", ask))
        if w.best_ask is None:  # no ask: the line breaks
            if line:
                runs.append(line)
            line = []
        else:
            line.append(f"{x + step / 2:.1f},{price_y(w.best_ask):.1f}")
        if day or k % 6 == 0:
            labels.append(format_html('<text x="{}" y="{}">{}</text>', f"{x + 1:.1f}", height - 3, w.starts_at.strftime("%d %b" if day else "%H:%M")))
    if line:
        runs.append(line)
    asks = "".join(format_html('<polyline class="fwd-ask" points="{}"/>', " ".join(r if len(r) > 1 else r * 2)) for r in runs)
    scales = [format_html('<text x="0" y="10">{}</text><text x="0" y="{}">0</text>', top, plot)]
    if prices:
        scales.append(format_html('<text x="{}" y="{}">{}</text><text x="{}" y="{}">{}</text>', right + 4, f"{price_y(hi) + 4:.1f}",
                                  m.figure(int(round(hi, -4))), right + 4, f"{price_y(lo) + 4:.1f}", m.figure(int(round(lo, -4)))))
    last = ""
    if last_price is not None:
        last = format_html('<line class="fwd-last" x1="{}" x2="{}" y1="{}" y2="{}"><title>last clearing price {}</title></line>',
                           left, right, f"{price_y(last_price):.1f}", f"{price_y(last_price):.1f}", price(last_price))
    return format_html(
        '<svg class="forward" id="forward-calendar" width="100%" viewBox="0 0 {} {}" role="img" '
        'aria-label="GPUs free in each {} ahead, at most {}, with the best ask of each">{}{}{}{}{}</svg>',
        width, height, "day" if day else "hour", top, mark_safe("".join(bars)), mark_safe(asks), last,
        mark_safe("".join(scales)), mark_safe("".join(labels)),
    )


STAGE_COLOURS = dict(zip(STAGES, (  # per engine stage, in its order; a class's LP bound a darker shade
    "#8a93a6", "#6f7a91", "#5b8def",  # validate, market, candidates
    "#b07cf0", "#7c4fc0", "#3fb68b", "#237a5c", "#e0a23b", "#a8731f",  # reserved, on-demand, spot (and bounds)
    "#e36a6a", "#d68fb8", "#c7c96a", "#4fc1d6",  # pricing, packing, trades, explain
), strict=True))


def _ms(v: object) -> float | None:
    """A recorded stage time, if it is a finite, non-negative number of ms."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) and f >= 0 else None


def _stage_name(k: str) -> str:
    return k.replace("_", "-").replace(" bound", "'s LP bound")


@register.simple_tag
def stage_bar(stage_ms: object, width: int = 120, height: int = 10) -> SafeString:
    """Where a round's clearing time went: one inline SVG bar, a segment per
    engine stage in order, each as wide as its share; hovering names them all.
    Draws nothing for a round recorded without (or with unreadable) times."""
    if not isinstance(stage_ms, dict):
        return mark_safe("")
    parts = [(k, v) for k in STAGE_COLOURS if (v := _ms(stage_ms.get(k))) is not None and v > 0]
    total = sum(v for _, v in parts)
    if total <= 0:
        return mark_safe("")
    label = ", ".join(f"{_stage_name(k)} {v:,.0f} ms" for k, v in parts)
    x = 0.0
    rects = []
    for k, v in parts:
        w = v / total * width
        rects.append(format_html('<rect x="{}" y="0" width="{}" height="{}" fill="{}"/>', f"{x:.2f}", f"{w:.2f}", height,
                                 STAGE_COLOURS[k]))
        x += w
    return format_html(
        '<svg class="stagebar" width="{}" height="{}" viewBox="0 0 {} {}" role="img" aria-label="{}"><title>{}</title>{}</svg>',
        width, height, width, height, label, label, mark_safe("".join(rects)),
    )


@register.simple_tag
def stage_legend() -> SafeString:
    """The colours of ``stage_bar``, named (a class's LP bound is its darker shade)."""
    return format_html_join(
        " ", '<span class="stagekey"><i style="background:{}"></i>{}</span>',
        ((c, _stage_name(k)) for k, c in STAGE_COLOURS.items()),
    )


@register.filter
def cuda(code: object) -> str:
    """A CUDA version from its code: 1204 -> '12.4'."""
    return cuda_text(_units(code) or 0)


@register.filter
def disk(gb: object) -> str:
    """Free disk in GB (10^9 bytes), as '500 GB' or '1.2 TB'."""
    n = _units(gb) or 0
    return f"{n / 1000:.1f} TB".replace(".0 TB", " TB") if n >= 1000 else f"{n} GB"


@register.filter
def mbps(value: object) -> str:
    """A bandwidth in Mbit/s, as '940 Mbit/s' or '2.5 Gbit/s'; '?' when not measured."""
    n = _units(value) or 0
    if not n:
        return "?"
    return f"{n / 1000:.1f} Gbit/s".replace(".0 Gbit", " Gbit") if n >= 1000 else f"{n} Mbit/s"


@register.filter
def links(machine: object) -> str:
    """A machine's GPU links in a line: 'all NVLink', or each kind with its pairs."""
    topology = getattr(machine, "topology", None) or {}
    if not topology:
        return "— (one GPU, or not reported)"
    kinds: dict[str, list[str]] = {}
    for pair, kind in sorted(topology.items()):
        kinds.setdefault(str(kind), []).append(str(pair))
    if len(kinds) == 1:
        return f"all pairs {next(iter(kinds))}"
    return "; ".join(f"{kind} ({', '.join(pairs[:4])}{' …' if len(pairs) > 4 else ''})" for kind, pairs in sorted(kinds.items()))


@register.filter
def utc_hours(mask: object) -> str:
    """A lent offer's reclaim hours, as written (``contracts.hours``): ``08-20``."""
    return utc_schedule.text(mask) if isinstance(mask, int) and 0 <= mask <= utc_schedule.ALL else ""
