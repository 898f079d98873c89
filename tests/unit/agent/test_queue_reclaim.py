"""Lent GPUs taken back when the provider's own queue runs deep (providers.agent.tides)."""

from __future__ import annotations

import sys

import pytest

from providers.agent.config import PricingRule
from providers.agent.pricing import PricingError, validate_rule
from providers.agent.tides import QueueError, QueueWatch, read_queue


def rule(**kw: object) -> PricingRule:
    base: dict[str, object] = {"gpu_model": "L4-24GB", "price": 800_000, "reclaimable": True,
                               "reclaim_queue_command": "echo 3", "reclaim_queue_above": 50.0, "release_after_s": 60.0}
    return PricingRule(**{**base, **kw})  # type: ignore[arg-type]


def test_the_queue_is_the_first_number_its_command_prints() -> None:
    assert read_queue(f"{sys.executable} -c 'print(\"57 jobs waiting\")'") == 57
    for command, says in (("/no/such/program", "not a program"), (f"{sys.executable} -c 'print(\"many\")'", "not a number"),
                          (f"{sys.executable} -c 'import sys; sys.exit(3)'", "exited 3"), ("'unclosed", "cannot split"),
                          (f"{sys.executable} -c 'print(-1)'", "a number >= 0")):
        with pytest.raises(QueueError, match=says):
            read_queue(command)
    with pytest.raises(QueueError, match="no answer within 0.2 s"):
        read_queue(f"{sys.executable} -c 'import time; time.sleep(5)'", timeout_s=0.2)


def test_deep_takes_back_an_open_offer_and_quiet_long_enough_lends_again_only_what_it_took() -> None:
    w = QueueWatch()
    r = rule()
    open_ = {"id": 7, "state": "open"}
    taken = {"id": 7, "state": "paused", "paused_by": "reclaimed"}
    assert w.decide(r, 51, open_, now=0) == "reclaim"
    assert w.decide(r, 51, taken, now=1) is None, "taken back already"
    assert w.decide(r, 10, taken, now=2) is None, "not ours: the rule did not record taking it"
    w.taken.add(7)
    assert w.decide(r, 30, taken, now=3) is None, "between the marks: neither"
    assert w.decide(r, 25, taken, now=10) is None, "quiet (<= half of 50) from 10"
    assert w.decide(r, 20, taken, now=69) is None
    assert w.decide(r, 20, taken, now=70) == "release", "quiet for 60 s"
    w2 = QueueWatch(taken={7})
    assert w2.decide(r, 0, {"id": 7, "state": "paused", "paused_by": "schedule"}, now=0) is None, "the market's hours are the market's"
    assert w2.decide(r, 0, {"id": 7, "state": "paused", "paused_by": "schedule"}, now=1000) is None


def test_a_queue_rule_is_checked_before_it_is_saved() -> None:
    assert validate_rule(rule()).reclaim_queue_command == "echo 3"
    for bad, says in (({"reclaimable": False}, "only lent GPUs"), ({"reclaim_queue_above": 0.0}, "--reclaim-above N"),
                      ({"release_queue_below": 50.0}, "below --reclaim-above"), ({"reclaim_queue_command": "'x"}, "cannot be split"),
                      ({"reclaim_queue_command": "", "reclaim_queue_above": 5.0}, "need --reclaim-queue CMD"),
                      ({"release_after_s": -1.0}, "0-86400")):
        with pytest.raises(PricingError, match=says):
            validate_rule(rule(**bad))
