"""Hours of the UTC day, as a lent offer's reclaim schedule: the hours its owner takes its
GPUs back (issue 31, tides). Shared by the market, which enforces the schedule, and the
agent, which writes it.

A schedule is written as ranges of whole UTC hours, ``start-end`` with the end exclusive,
joined by commas: ``08-20`` is 08:00 to 20:00 UTC; ``22-06`` runs past midnight;
``9`` is the one hour from 09:00; ``""`` is none. It is kept as a 24-bit mask (bit ``h``:
hour ``h`` is reclaimed), and written back in one canonical form (``text``): sorted,
merged, two digits (``00-06,22-24`` is written ``22-06``).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

ALL = (1 << 24) - 1
_RANGE = re.compile(r"^(\d{1,2})(?::00)?(?:-(\d{1,2})(?::00)?)?$")


class HoursError(ValueError):
    """A schedule that cannot be read; the message says what to write instead."""


def parse(text: str) -> int:
    """The mask of ``text`` (see the module's docstring); ``HoursError`` names what is wrong."""
    mask = 0
    for part in (p.strip() for p in text.split(",")):
        if not part:
            if text.strip():
                raise HoursError(f"{text!r} has an empty range; write ranges of UTC hours like 08-20 or 22-06, joined by commas")
            continue
        m = _RANGE.match(part)
        if m is None:
            raise HoursError(f"{part!r} is not a range of UTC hours; write it like 08-20 (08:00 to 20:00 UTC) or 9 (09:00 to 10:00)")
        start = int(m.group(1))
        end = int(m.group(2)) if m.group(2) is not None else start + 1
        if start > 23 or end > 24:
            raise HoursError(f"{part!r}: an hour starts at 0-23 and a range ends at 1-24")
        if start == end % 24 and m.group(2) is not None and not (start == 0 and end == 24):
            raise HoursError(f"{part!r} is an empty range; its end must differ from its start")
        hours = range(start, end) if start < end else [*range(start, 24), *range(0, end)]
        for h in hours:
            mask |= 1 << h
    return mask


def text(mask: int) -> str:
    """The canonical form of ``mask``: ``""`` for none, ``00-24`` for every hour."""
    if not 0 <= mask <= ALL:
        raise HoursError(f"{mask!r} is not a mask of the day's 24 hours")
    if mask == ALL:
        return "00-24"
    runs: list[list[int]] = []
    for h in range(24):
        if mask >> h & 1:
            if runs and runs[-1][1] == h:
                runs[-1][1] = h + 1
            else:
                runs.append([h, h + 1])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][1] == 24:  # one range past midnight, written last
        runs[-1][1] = runs.pop(0)[1]
    return ",".join(f"{a:02d}-{b:02d}" for a, b in runs)


def covers(mask: int, when: datetime) -> bool:
    """Whether ``when`` falls in one of the schedule's hours."""
    return bool(mask >> when.astimezone(UTC).hour & 1)


def next_change(mask: int, when: datetime) -> datetime | None:
    """When ``covers`` next changes after ``when`` (on the hour); None if it never does."""
    if mask in (0, ALL):
        return None
    now = covers(mask, when)
    hour = when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    for k in range(1, 25):
        t = hour + timedelta(hours=k)
        if covers(mask, t) != now:
            return t
    return None
