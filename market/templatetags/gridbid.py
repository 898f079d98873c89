"""Template filters for money, durations and sparklines."""

from __future__ import annotations

from django import template
from django.utils.html import format_html
from django.utils.safestring import SafeString

register = template.Library()

TOKEN_DECIMALS = 6


@register.filter
def money(base_units: int | None) -> str:
    """Token base units -> '2.35' (the stablecoin has 6 decimals)."""
    if base_units is None:
        return "—"
    return f"{base_units / 10**TOKEN_DECIMALS:,.2f}"


@register.filter
def hours(seconds: int | None) -> str:
    if seconds is None:
        return "—"
    h = seconds / 3600
    return f"{h:g} h" if h >= 1 else f"{seconds // 60} min"


@register.filter
def pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1f}%"


@register.simple_tag
def sparkline(points: list[int], width: int = 120, height: int = 28) -> SafeString:
    """An inline SVG sparkline of clearing prices (no JavaScript needed)."""
    if not points:
        return format_html('<span class="muted">no trades yet</span>')
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
def per_cu(price: int, compute_units: float) -> int | None:
    """Price per compute-unit-hour, in base units: compares GPUs of different speeds."""
    return round(price / compute_units) if compute_units else None
