"""The domain events (market/events.py): one table says who reacts to what, `now` handlers
write inside the announcing transaction, after-commit handlers run only once it commits."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from django.db import transaction

from market import events

pytestmark = pytest.mark.django_db(transaction=True)


def _event_types() -> list[type[events.Event]]:
    return [v for v in vars(events).values() if inspect.isclass(v) and issubclass(v, events.Event) and v is not events.Event]


def test_every_event_has_a_handler_and_every_handler_takes_its_event():
    for event_type in _event_types():
        now, after = events.handlers_of(event_type)
        assert now or after, f"{event_type.__name__} is announced to nobody: subscribe a handler in MarketConfig.ready() or remove it"
        for handler in now + after:
            params = list(inspect.signature(handler).parameters)
            assert len(params) == 1, f"{handler.__module__}.{handler.__qualname__} must take the event alone"


def test_events_are_frozen_data():
    for event_type in _event_types():
        assert dataclasses.is_dataclass(event_type)
        assert event_type.__dataclass_params__.frozen, event_type.__name__  # type: ignore[attr-defined]


@pytest.fixture
def recorded():
    """A throwaway event type with one handler of each kind, removed afterwards."""
    @dataclasses.dataclass(frozen=True)
    class Probe(events.Event):
        n: int

    seen: list[tuple[str, int, bool]] = []
    now, after = dict(events._now), dict(events._after_commit)
    events._now[Probe] = [lambda e: seen.append(("now", e.n, transaction.get_connection().in_atomic_block))]
    events._after_commit[Probe] = [lambda e: seen.append(("after", e.n, transaction.get_connection().in_atomic_block))]
    yield Probe, seen
    events.subscribe(now=now, after_commit=after)


def test_now_handlers_run_inside_the_transaction_and_after_commit_ones_after_it(recorded):
    probe, seen = recorded
    with transaction.atomic():
        events.announce(probe(n=1))
        events.announce(probe(n=2))
        assert seen == [("now", 1, True), ("now", 2, True)]
    assert seen == [("now", 1, True), ("now", 2, True), ("after", 1, False), ("after", 2, False)]


def test_after_commit_handlers_never_run_for_a_rolled_back_transaction(recorded):
    probe, seen = recorded
    with pytest.raises(RuntimeError), transaction.atomic():
        events.announce(probe(n=3))
        raise RuntimeError("rolled back")
    assert seen == [("now", 3, True)]
