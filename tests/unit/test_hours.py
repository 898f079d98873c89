"""A lent offer's reclaim hours (contracts.hours): read, written back, and asked."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from contracts import hours


@pytest.mark.parametrize(("text", "canonical"), [
    ("08-20", "08-20"), ("8-12, 12-20", "08-20"), ("9", "09-10"), ("", ""), ("22-06", "22-06"),
    ("0-6,22-24", "22-06"), ("20:00-04:00", "20-04"), ("00-24", "00-24"), ("1,3", "01-02,03-04"), ("23,0", "23-01"),
])
def test_a_schedule_reads_and_writes_back_in_one_form(text: str, canonical: str) -> None:
    assert hours.text(hours.parse(text)) == canonical
    assert hours.parse(canonical) == hours.parse(text)


@pytest.mark.parametrize(("text", "says"), [
    ("8-8", "empty range"), ("25", "an hour starts at 0-23"), ("8-25", "a range ends at 1-24"), ("mornings", "not a range"),
    ("8-", "not a range"), (",", "empty range"), ("8-12,,14", "empty range"),
])
def test_a_schedule_that_cannot_be_read_says_what_to_write(text: str, says: str) -> None:
    with pytest.raises(hours.HoursError, match=says):
        hours.parse(text)


def test_whether_an_instant_is_in_the_hours_and_when_that_changes() -> None:
    mask = hours.parse("22-06")
    assert hours.covers(mask, datetime(2026, 12, 6, 23, 59, tzinfo=UTC))
    assert hours.covers(mask, datetime(2026, 12, 7, 5, 0, tzinfo=UTC))
    assert not hours.covers(mask, datetime(2026, 12, 7, 6, 0, tzinfo=UTC))
    assert hours.next_change(mask, datetime(2026, 12, 6, 23, 30, tzinfo=UTC)) == datetime(2026, 12, 7, 6, 0, tzinfo=UTC)
    assert hours.next_change(mask, datetime(2026, 12, 7, 12, 0, tzinfo=UTC)) == datetime(2026, 12, 7, 22, 0, tzinfo=UTC)
    assert hours.next_change(0, datetime(2026, 12, 7, tzinfo=UTC)) is None
