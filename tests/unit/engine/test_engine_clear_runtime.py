"""How a round runs, not what it decides: the stopwatch it reports to and the
garbage collector it pauses."""

from __future__ import annotations

import gc
import threading

import pytest

from market.engine import STAGES, EngineInputError, RoundInput, RoundResult, clear_round
from market.engine import clear as engine_clear
from market.engine.serialize import digest, result_to_dict
from market.stopwatch import StageTimes
from tests.bench.instances import make_round
from tests.unit.engine.engine_builders import bid, offer, round_of


class Names:
    """A stopwatch that keeps the order of the laps, not their times."""

    def __init__(self) -> None:
        self.laps: list[str] = []

    def lap(self, stage: str) -> None:
        self.laps.append(stage)


def test_the_stopwatch_hears_every_stage_in_order_and_the_result_does_not_change() -> None:
    inp = make_round(400, 400, seed=2)
    plain = digest(result_to_dict(clear_round(inp)))
    watch = Names()
    assert digest(result_to_dict(clear_round(inp, stopwatch=watch))) == plain
    assert set(watch.laps) == set(STAGES)  # this round has all three classes, each with an LP bound
    first = [watch.laps.index(s) for s in STAGES]
    assert first == sorted(first), watch.laps  # each stage first shows up in the documented order
    assert watch.laps[:3] == ["validate", "market", "candidates"]
    assert watch.laps[-4:] == ["pricing", "packing", "trades", "explain"]


def test_stage_times_add_up_per_stage_in_milliseconds() -> None:
    times = StageTimes()
    for stage in ("validate", "spot", "validate"):
        times.lap(stage)
    assert set(times.seconds) == {"validate", "spot"}
    assert all(v >= 0 for v in times.seconds.values())
    assert times.ms() == {k: round(1000 * v, 2) for k, v in times.seconds.items()}


@pytest.mark.parametrize("was_on", [True, False])
def test_a_round_leaves_the_garbage_collector_as_it_found_it_even_on_bad_input(
    was_on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bool] = []
    real = engine_clear._clear

    def spy(inp: RoundInput, lap: object, workers: int) -> RoundResult:
        seen.append(gc.isenabled())
        return real(inp, lap, workers)  # type: ignore[arg-type]

    monkeypatch.setattr(engine_clear, "_clear", spy)
    (gc.enable if was_on else gc.disable)()
    try:
        clear_round(round_of([offer(1)], [bid(1)]))
        with pytest.raises(EngineInputError):
            clear_round(round_of([offer(1, ask=-5)], []))
        assert gc.isenabled() is was_on
    finally:
        gc.enable()
    assert seen == [False, False]  # paused while each round ran


def test_overlapping_rounds_on_two_threads_turn_the_collector_back_on_once_both_are_done() -> None:
    pause = engine_clear._CollectorPause()
    gc.enable()
    try:
        pause.__enter__()  # round A starts
        pause.__enter__()  # round B starts while A runs: it must not take "off" for the state to restore
        pause.__exit__()  # A ends first
        assert not gc.isenabled()  # B still runs
        pause.__exit__()
        assert gc.isenabled()
        # and for real, on threads that overlap
        inside = threading.Barrier(2)

        def one() -> None:
            with engine_clear._PAUSE:
                inside.wait(timeout=10)

        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
        assert gc.isenabled()
    finally:
        gc.enable()
