"""The market's future, window by window (issue 40, part 2): for each hour or day ahead, the
GPUs of one market (GPU model x region) free for the whole window, the offers they are on
and the best ask among them.

What sells in a window, from what the market holds now:
- an offer that is open, or paused by its own reclaim schedule (it opens again when its
  hours end); an offer paused by hand, by its machine going quiet or by the engine's limits
  has no known return, so it counts in no window;
- whose selling window (`available_from` / `available_until`) covers the whole window, and,
  for a lent offer, none of whose reclaim hours fall inside it (its owner takes those GPUs
  back then);
- less the GPUs its held bookings take at any moment of the window (by GPU index: two
  bookings one after the other on the same GPUs take them once): a booking holds its GPUs
  until its `ends_at` (the job may end sooner and give them back earlier: the calendar
  never promises a GPU that is not free).

A window's best ask is the lowest ask of the offers with a GPU free in all of it. Offers'
duration limits are not applied: the calendar shows capacity; a bid's own duration decides
which of it it can take (`GET /api/v1/quote/`). The last clearing price is the market's,
as the markets list shows it: a forward bid does not clear yet, so no window has one of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from contracts import hours as reclaim
from market.models import Booking, Offer
from market.states import BookingState, OfferState

STEPS = {"hour": 3600, "day": 86_400}
MAX_WINDOWS = {"hour": 168, "day": 60}  # a week of hours, two months of days
DEFAULT_WINDOWS = {"hour": 48, "day": 14}


@dataclass(frozen=True)
class Window:
    starts_at: datetime
    ends_at: datetime
    gpus_free: int
    offers: int  # the offers with a GPU free in the whole window
    best_ask: int | None


@dataclass(frozen=True)
class _Selling:
    price: int
    gpus: int
    available_from: datetime
    available_until: datetime | None
    reclaim_hours: int
    held: tuple[tuple[datetime, datetime, int, tuple[int, ...]], ...]  # (starts_at, ends_at, GPUs, their indexes) of its held bookings


def window_start(now: datetime, step: str) -> datetime:
    """The start of the window `now` falls in: the hour, or the UTC day."""
    start = now.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return start.replace(hour=0) if step == "day" else start


def _reclaimed_in(mask: int, start: datetime, end: datetime) -> bool:
    """Whether any of a lent offer's reclaim hours (UTC) falls in [start, end)."""
    if not mask:
        return False
    hour = start.replace(minute=0, second=0, microsecond=0)
    while hour < end:
        if reclaim.covers(mask, hour):
            return True
        hour += timedelta(hours=1)
    return False


def _held_in(held: tuple[tuple[datetime, datetime, int, tuple[int, ...]], ...], start: datetime, end: datetime) -> int:
    """The GPUs bookings hold at some moment of [start, end): each GPU index once; a booking
    without its indexes counts its GPUs."""
    indexes: set[int] = set()
    unnamed = 0
    for b_start, b_end, gpus, named in held:
        if b_start < end and b_end > start:
            if named:
                indexes.update(named)
            else:
                unnamed += gpus
    return len(indexes) + unnamed


def forward_windows(gpu_model: str, region: str, *, now: datetime, step: str = "hour", count: int | None = None) -> list[Window]:
    """`count` windows of one `step` from the one `now` is in, for one market. Two queries:
    its offers, and their bookings still held past `now`."""
    if step not in STEPS:
        raise ValueError(f"step must be one of {', '.join(STEPS)}, not {step!r}")
    count = DEFAULT_WINDOWS[step] if count is None else count
    if not 1 <= count <= MAX_WINDOWS[step]:
        raise ValueError(f"count must be 1-{MAX_WINDOWS[step]} for step {step}, not {count}")
    offers = list(
        Offer.objects.filter(gpu_model_id=gpu_model, machine__region_id=region)
        .filter(state__in=(OfferState.OPEN, OfferState.PAUSED))
        .values("id", "state", "paused_by", "price", "gpus", "available_from", "available_until", "reclaim_hours")
    )
    offers = [o for o in offers if o["state"] == OfferState.OPEN or o["paused_by"] == "schedule"]
    held: dict[int, list[tuple[datetime, datetime, int, tuple[int, ...]]]] = {}
    for b in (Booking.objects.filter(offer_id__in=[o["id"] for o in offers], state=BookingState.HELD, ends_at__gt=now)
              .values("offer_id", "starts_at", "ends_at", "gpus", "gpu_indexes")):
        indexes = tuple(i for i in b["gpu_indexes"] or () if isinstance(i, int))
        held.setdefault(b["offer_id"], []).append((b["starts_at"], b["ends_at"], b["gpus"], indexes if len(indexes) == b["gpus"] else ()))
    selling = [
        _Selling(o["price"], o["gpus"], o["available_from"], o["available_until"], o["reclaim_hours"], tuple(held.get(o["id"], ())))
        for o in offers
    ]
    size = timedelta(seconds=STEPS[step])
    first = window_start(now, step)
    out = []
    for k in range(count):
        start, end = first + k * size, first + (k + 1) * size
        free_total = offers_free = 0
        best: int | None = None
        for s in selling:
            if s.available_from > max(start, now) or (s.available_until is not None and s.available_until < end):
                continue  # it does not sell for the whole window (the window under way: from now)
            if _reclaimed_in(s.reclaim_hours, start, end):
                continue
            free = s.gpus - _held_in(s.held, start, end)
            if free <= 0:
                continue
            free_total += free
            offers_free += 1
            best = s.price if best is None else min(best, s.price)
        out.append(Window(start, end, free_total, offers_free, best))
    return out
