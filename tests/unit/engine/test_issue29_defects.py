"""Issue 29's reproducers: overflow, a crash, a price a losing bid could move,
wrong explanations and validation gaps, each on input the engine accepts."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np
import pytest
from scipy.sparse import csc_matrix

from market.engine import (
    EngineInputError,
    Region,
    RoundInput,
    Weights,
    bound,
    clear,
    clear_round,
    exact,
    limits,
)
from tests.bench.instances import FAMILIES, make_round
from tests.unit.engine import exact_milp as milp_check
from tests.unit.engine.engine_builders import LATENCY, REGIONS, bid, offer, round_of, with_config
from tests.unit.engine.test_engine_optimality import exact_milp, one_class, one_class_same_machine

FLAT = Weights(0.0, 0.0, 0.0, 0.0)
TEN_YEARS = limits.MAX_DURATION_S


# 1. scores above 2**63 --------------------------------------------------------------


def test_a_job_worth_more_than_int64_still_trades_at_its_true_score() -> None:
    """1,000 GPUs for 10 years at the maximum price: about 8.76e19 base units of surplus,
    past 2**63. It used to overflow to a negative score: no trade, and the buyer was told
    its penalties exceeded its margin."""
    ask = 1_000_000
    inp = round_of(
        [offer(1, gpus=1000, ask=ask, max_duration_s=TEN_YEARS)],
        [bid(1, gpus=1000, max_price=limits.MAX_PRICE, duration_s=TEN_YEARS, weights=FLAT)],
    )
    res = clear_round(inp)
    assert [t.bid_id for t in res.trades] == [1]
    true_score = 1000 * (TEN_YEARS / 3600) * (limits.MAX_PRICE - ask)
    assert true_score > 2**63
    assert res.trades[0].score == pytest.approx(true_score, rel=1e-12)
    assert res.stats.surplus == res.trades[0].score
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= res.stats.surplus
    assert not res.unmatched


def test_several_jobs_worth_more_than_int64_together_all_trade() -> None:
    """Each score fits in an int64 on its own, their sum does not."""
    offers = [offer(i, gpus=1000, ask=1_000_000, max_duration_s=TEN_YEARS) for i in range(1, 5)]
    bids = [
        bid(i, gpus=1000, max_price=limits.MAX_PRICE // 4, duration_s=TEN_YEARS, weights=FLAT)
        for i in range(1, 5)
    ]
    res = clear_round(round_of(offers, bids))
    assert sorted(t.bid_id for t in res.trades) == [1, 2, 3, 4]
    assert res.stats.surplus > 2**63
    assert res.stats.surplus == sum(t.score for t in res.trades)


def test_small_bids_beside_a_huge_one_keep_their_trades_and_scores() -> None:
    """A round holding one astronomically valued job clears the ordinary ones as it would
    without it; their scores are counted in a coarser unit (tens of base units), so they
    match to within one."""
    models = ("H100", "A100", "L4")
    small_offers = [offer(i, gpus=1, gpu_model=models[i - 1], ask=1_000_000 + 10_000 * i) for i in range(1, 4)]
    small_bids = [
        bid(i, gpu_models=(models[i - 1],), max_price=1_050_000 + 10_000 * i, weights=FLAT) for i in range(1, 4)
    ]
    alone = clear_round(round_of(small_offers, small_bids))
    huge = round_of(
        [*small_offers, offer(9, gpus=1000, gpu_model="MI300X", ask=1_000_000, max_duration_s=TEN_YEARS)],
        [*small_bids, bid(9, gpus=1000, gpu_models=("MI300X",), max_price=limits.MAX_PRICE,
                          duration_s=TEN_YEARS, weights=FLAT)],
    )
    both = clear_round(huge)
    small = [t for t in both.trades if t.bid_id != 9]
    assert [(t.bid_id, t.offer_id) for t in small] == [(t.bid_id, t.offer_id) for t in alone.trades]
    assert [t.score for t in small] == pytest.approx([t.score for t in alone.trades], abs=64)
    assert [t.price for t in small] == [t.price for t in alone.trades]
    assert any(t.bid_id == 9 for t in both.trades)


@pytest.mark.filterwarnings("error")
def test_a_penalty_past_int64_rules_the_pair_out_cleanly() -> None:
    """The other side: a latency weight at its limit makes a pair worth about -8.8e28, which
    the int64 cast left undefined (numpy warned); the pair is simply out, the other trades."""
    huge = Weights(limits.MAX_WEIGHT, 0.0, 0.0, 0.0)
    inp = round_of(
        [offer(1, gpus=1000, region="us-east", max_duration_s=TEN_YEARS)],
        [bid(1, gpus=1000, duration_s=TEN_YEARS, location_region="eu-west", weights=huge),
         bid(2, gpus=1000, duration_s=TEN_YEARS, max_price=limits.MAX_PRICE, weights=FLAT)],
    )
    res = clear_round(inp)
    assert [t.bid_id for t in res.trades] == [2]
    assert [u.bid_id for u in res.unmatched] == [1]


# 2. a crash explaining an unmatched bid ---------------------------------------------


def test_unmatched_bid_with_location_but_no_latency_row_is_explained_not_crashed() -> None:
    regions = (*REGIONS, Region("ap-south", 600.0))
    inp = dataclasses.replace(
        round_of([offer(1, region="ap-south")], [bid(1, location_region="eu-west")]),
        regions=regions,
    )
    res = clear_round(inp)
    assert not res.trades
    (u,) = res.unmatched
    text = " ".join(u.reasons)
    assert "ap-south" in text and "latency" in text
    assert "None" not in text


# 3. a losing bid that could never trade moves the price -------------------------------


def test_a_bid_no_offer_can_serve_does_not_move_the_uniform_price() -> None:
    shill = bid(2, max_price=4_900_000, min_reliability=1.0, weights=FLAT)
    winner = bid(1, max_price=5_000_000, weights=FLAT)
    honest = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner]))
    shilled = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner, shill]))
    assert [t.price for t in honest.trades] == [1_000_000]
    assert [(t.bid_id, t.price) for t in shilled.trades] == [(1, 1_000_000)]


def test_a_bid_of_the_wrong_class_does_not_move_the_uniform_price() -> None:
    winner = bid(1, max_price=5_000_000, weights=FLAT, klass="reserved")
    shill = bid(2, max_price=4_900_000, weights=FLAT, klass="spot")
    res = clear_round(round_of([offer(1, gpus=1, ask=1_000_000, spot_allowed=False)], [winner, shill]))
    assert [(t.bid_id, t.price) for t in res.trades] == [(1, 1_000_000)]


def test_a_losing_bid_that_could_have_traded_still_sets_the_price() -> None:
    winner = bid(1, max_price=5_000_000, weights=FLAT)
    loser = bid(2, max_price=4_900_000, weights=FLAT)
    res = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner, loser]))
    assert [(t.bid_id, t.price) for t in res.trades] == [(1, 4_900_001)]


# 4. explanations ----------------------------------------------------------------------


def test_a_bid_past_its_deadline_is_not_told_its_penalties_exceed_its_margin() -> None:
    inp = round_of([offer(1)], [bid(1, duration_s=7200)])
    inp = dataclasses.replace(inp, bids=(dataclasses.replace(inp.bids[0], deadline=inp.now + 3600),))
    (u,) = clear_round(inp).unmatched
    text = " ".join(u.reasons)
    assert "deadline" in text
    assert "penalties" not in text and "outbid" not in text


def test_a_region_is_zero_ms_from_itself_without_a_latency_row() -> None:
    no_self = tuple(row for row in LATENCY if row[0] != row[1])
    inp = dataclasses.replace(
        round_of([offer(1, region="eu-west")], [bid(1, location_region="eu-west", max_latency_ms=5.0)]),
        latency_ms=no_self,
    )
    res = clear_round(inp)
    assert [t.bid_id for t in res.trades] == [1]
    assert "0 ms from eu-west" in res.trades[0].reason


# 5. validation gaps -------------------------------------------------------------------


def test_none_among_the_bids_is_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, bids=(inp.bids[0], None)))  # type: ignore[arg-type]
    assert err.value.field == "bids[1]"


def test_none_among_the_offers_is_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, offers=(None, inp.offers[0])))  # type: ignore[arg-type]
    assert err.value.field == "offers[0]"


def test_generators_of_orders_clear_like_tuples() -> None:
    inp = round_of([offer(1), offer(2)], [bid(1), bid(2)])
    want = clear_round(inp)
    lazy = dataclasses.replace(
        inp,
        offers=(o for o in inp.offers),  # type: ignore[arg-type]
        bids=(b for b in inp.bids),  # type: ignore[arg-type]
        latency_ms=(row for row in inp.latency_ms),  # type: ignore[arg-type]
    )
    got = clear_round(lazy)
    assert got == want and len(got.trades) == 2


def test_orders_that_are_not_a_collection_are_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, bids=None))  # type: ignore[arg-type]
    assert err.value.field == "bids"


# 6. the bound after branch and bound runs out of nodes ----------------------------------


def ladder() -> RoundInput:
    """The issue's smallest case: 8 one-GPU offers (asks 1.00 + 0.10 j), 16 on-demand one-GPU
    bids (max 3.00 + 0.01 i); too many ties for branch and bound within its node limit."""
    offers = [offer(j + 1, gpus=1, ask=1_000_000 + 100_000 * j) for j in range(8)]
    bids = [bid(i + 1, max_price=3_000_000 + 10_000 * i, weights=FLAT) for i in range(16)]
    return round_of(offers, bids)


def class_bounds(scope: str) -> dict[str, tuple[int, int]]:
    """Per class, (surplus, bound) as the bound's scope reports them."""
    found = re.findall(r"(reserved|on_demand|spot) ([\d,]+) <= ([\d,]+)", scope)
    return {k: (int(s.replace(",", "")), int(u.replace(",", ""))) for k, s, u in found}


def test_a_class_whose_branch_and_bound_ran_out_reports_a_bound_above_its_surplus() -> None:
    """The exact path (a MIP) proves the ladder optimal; past its work limit (one node a
    class) it keeps a feasible solution and reports a bound at or above it."""
    res = clear_round(ladder())
    assert res.stats.surplus == 14_120_000
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= 14_120_000
    assert res.stats.method in ("exact", "mip-lexicographic")
    cut = clear_round(with_config(ladder(), exact_node_limit=1))
    assert cut.stats.surplus <= 14_120_000
    assert cut.stats.upper_bound is not None and cut.stats.upper_bound >= 14_120_000
    per_class = class_bounds(cut.stats.bound_scope)
    assert all(u >= s for s, u in per_class.values())
    if cut.stats.method != "exact":
        assert per_class, cut.stats.bound_scope
        assert cut.stats.gap == round((cut.stats.upper_bound - cut.stats.surplus) / cut.stats.upper_bound, 9)


@pytest.mark.parametrize("nodes", [1, 50, 2_000])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_bound_covers_the_optimum_whatever_the_node_limit(seed: int, nodes: int) -> None:
    inp = with_config(one_class_same_machine(make_round(25, 30, seed=seed)), exact_node_limit=nodes)
    res = clear_round(inp)
    opt = exact_milp(inp)
    assert res.stats.surplus <= opt + 1
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= opt - 1
    for s, u in class_bounds(res.stats.bound_scope).values():
        assert u >= s


@pytest.mark.parametrize("seed", [2, 5, 9])
def test_a_class_whose_branch_and_bound_ran_out_does_no_worse_than_without_it(seed: int) -> None:
    """Running out of nodes used to leave the class with its incumbent plus whatever the LP
    placed in what it left: 0.89 of the LP path alone on seed 2."""
    inp = one_class(make_round(60, 60, seed=seed))
    with_bnb = clear_round(inp)
    lp_only = clear_round(with_config(inp, exact_node_limit=0))
    assert with_bnb.stats.method != "exact"
    assert with_bnb.stats.surplus >= lp_only.stats.surplus
    assert with_bnb.stats.upper_bound is not None and with_bnb.stats.upper_bound >= with_bnb.stats.surplus


# 7. the exact path: a MIP over every class, spanning bids and lower classes included -------


def test_a_spanning_bid_leaves_the_big_machine_to_the_bid_that_needs_it() -> None:
    """Offers A (8 GPUs at 1.00) and B (4 at 1.50); a bid for 4 GPUs that may span machines
    (max 3.00) and one for 8 on one machine (max 2.00). Branch and bound gave the spanning bid
    one option, its greedy fill on A, and the 8-GPU bid nothing: 8,000,000 of 14,000,000."""
    offers = [offer(1, gpus=8, ask=1_000_000), offer(2, gpus=4, ask=1_500_000)]
    bids = [bid(1, gpus=4, same_machine=False, max_price=3_000_000, weights=FLAT),
            bid(2, gpus=8, max_price=2_000_000, weights=FLAT)]
    res = clear_round(round_of(offers, bids))
    assert res.stats.surplus == 14_000_000
    assert sorted((t.bid_id, t.offer_id, t.gpus) for t in res.trades) == [(1, 2, 4), (2, 1, 8)]
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= 14_000_000


def test_a_tie_in_a_higher_class_goes_the_way_that_serves_the_class_below() -> None:
    """A reserved and an on-demand 1-GPU bid, the on-demand one needing reliability 0.95;
    offers of reliability 0.90 and 0.99 at one ask. The reserved bid is worth the same on
    either, so it takes the 0.90 one and leaves the 0.99 one to the on-demand bid."""
    offers = [offer(1, gpus=1, reliability=0.99), offer(2, gpus=1, reliability=0.90)]
    bids = [bid(1, klass="reserved", weights=FLAT), bid(2, min_reliability=0.95, weights=FLAT)]
    res = clear_round(round_of(offers, bids))
    assert sorted((t.bid_id, t.offer_id) for t in res.trades) == [(1, 2), (2, 1)]


def test_a_round_stopped_at_its_work_limit_is_feasible_and_says_so() -> None:
    """One node a class: the round still clears, at least as well as the heuristic alone
    (the exact path switched off), and its statistics say which class stopped short and
    what bounds it."""
    inp = with_config(FAMILIES["ties"](3, 60), exact_node_limit=1)
    res = clear_round(inp)
    assert res.stats.method == "mip-lexicographic (work limit)"
    assert "stopped at its work limit" in res.stats.bound_scope
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= res.stats.surplus
    for s, u in class_bounds(res.stats.bound_scope).values():
        assert u >= s
    kl = {b.id: b.klass for b in inp.bids}
    heuristic = clear_round(with_config(inp, exact_node_limit=0))
    for k in ("reserved", "on_demand"):  # spot may lose what a class above gained
        got = sum(t.score for t in res.trades if kl[t.bid_id] == k)
        alone = sum(t.score for t in heuristic.trades if kl[t.bid_id] == k)
        assert got >= alone, k
        if got > alone:
            break


@pytest.mark.parametrize("family", ["multi_machine", "fair_share", "ties"])
def test_the_exact_path_clears_the_same_round_the_same_way_whatever_the_order(family: str) -> None:
    inp = FAMILIES[family](3, 60)
    first = clear_round(inp)
    again = clear_round(dataclasses.replace(inp, bids=tuple(reversed(inp.bids)), offers=tuple(reversed(inp.offers))))
    assert first == again
    assert first.stats.method.startswith(("exact", "mip-lexicographic"))


def test_a_round_whose_solver_raises_clears_by_the_lp_path_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    inp = FAMILIES["multi_machine"](3, 60)
    lp_path = clear_round(with_config(inp, exact_node_limit=0))

    def broken(*_: object) -> None:
        raise RuntimeError("HiGHS ran out of memory")

    monkeypatch.setattr(exact._Model, "solve", broken)
    res = clear_round(inp)
    assert res.stats.method == "lp-per-class+rounding+improve (exact path failed)"
    assert "the exact path failed (RuntimeError: HiGHS ran out of memory)" in res.stats.bound_scope
    assert [(t.bid_id, t.offer_id, t.gpus) for t in res.trades] == [(t.bid_id, t.offer_id, t.gpus) for t in lp_path.trades]
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= res.stats.surplus


# 8. work bounded by counts on every path ------------------------------------------------


def knapsack_model() -> Any:
    """A 0/1 knapsack of 40 items with awkward weights, presolve off: HiGHS checks in at its
    interrupt many times before it proves the optimum."""
    h = bound._highs._Highs()
    for name, value in (("output_flag", False), ("threads", 1), ("random_seed", 0), ("presolve", "off")):
        h.setOptionValue(name, value)
    n = 40
    w = np.asarray([1_000 + 37 * i + (i * i) % 53 for i in range(n)], dtype=np.float64)
    v = w + np.asarray([(i * 7919) % 97 for i in range(n)], dtype=np.float64)
    h.addRows(1, np.asarray([-np.inf]), np.asarray([w.sum() / 2 + 0.5]), 0, np.zeros(0, dtype=np.int32),
              np.zeros(0, dtype=np.int32), np.zeros(0))
    h.addCols(n, v, np.zeros(n), np.ones(n), n, np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int32), w)
    h.changeObjectiveSense(bound._highs.ObjSense.kMaximize)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, bound._highs.HighsVarType.kInteger, dtype=np.uint8))
    return h


def test_a_mip_stops_at_its_checkpoint_count_with_its_best_solution_so_far() -> None:
    """The LP path's MILPs had a node limit and nothing else: a 1,000-a-side ties round's
    fractional rest ran for many minutes at its root, where no node is counted. Every MIP the
    engine runs now stops at a count of HiGHS's interrupt checks, as the exact path's did."""
    whole = knapsack_model()
    bound.run_counted(whole, 10**9)
    assert whole.modelStatusToString(whole.getModelStatus()) == "Optimal"
    cut = knapsack_model()
    bound.run_counted(cut, 2)
    assert cut.modelStatusToString(cut.getModelStatus()) == "Interrupted by user"
    again = knapsack_model()
    bound.run_counted(again, 2)  # a count, not a clock: the same stop, the same solution
    assert list(again.getSolution().col_value) == list(cut.getSolution().col_value)


def test_the_lp_paths_milp_runs_under_its_checkpoint_count(monkeypatch: pytest.MonkeyPatch) -> None:
    counts: list[int] = []
    real = bound.run_counted

    def spy(h: Any, checkpoints: int) -> None:
        counts.append(checkpoints)
        real(h, checkpoints)

    monkeypatch.setattr(bound, "run_counted", spy)
    a = csc_matrix(np.ones((1, 3)))
    x = bound._mip(a, np.asarray([3.0, 2.0, 1.0]), np.ones(3), np.asarray([-np.inf]), np.asarray([2.0]), 10, 0.0)
    assert x is not None and x.tolist() == [1.0, 1.0, 0.0]
    assert counts == [bound.MIP_CHECKPOINTS]


# 9. rounds past one model: small by their feasible pairs, and a MIP per class ------------


def test_a_round_of_many_orders_but_few_feasible_pairs_is_small_and_takes_the_exact_path() -> None:
    """230 orders a side are 52,900 bid x offer pairs, past ``clear.SMALL_PAIRS``; but with
    each bid held to its few models and regions only 1,443 can trade. Counting bid x offer
    pairs sent such rounds to the LP path (narrow_models and scarce_region at 300 a side:
    0.986-0.994 of the optimum); counting the feasible ones clears them whole."""
    inp = FAMILIES["catalogue"](3, 230)
    res = clear_round(inp)
    assert len(inp.bids) * len(inp.offers) > clear.SMALL_PAIRS > res.stats.feasible_pairs
    assert res.stats.method.startswith(("exact", "mip-lexicographic")), res.stats.method
    c = milp_check.check_round("catalogue", 3, 230, inp, result=res)
    assert c.quality >= 0.995 and not c.bound_short(), (c.engine, c.optimum, c.bound_short())


def test_a_round_too_big_for_one_model_clears_each_class_by_its_own_mip(monkeypatch: pytest.MonkeyPatch) -> None:
    """A round whose whole model is past ``exact.fits`` (here 250 bucket choices of spanning
    bids, over a limit of 200) but whose classes each fit: each class is a MIP on what the
    classes above left, from the heuristic's placement, and is at that class's optimum there
    (multi-machine rounds of 150-300 a side were 0.51-0.96 of it on the LP path)."""
    inp = FAMILIES["multi_machine"](3, 60)
    monkeypatch.setattr(exact, "EXACT_MAX_SPANS", 200)
    res = clear_round(inp)
    assert res.stats.method in ("exact", "mip-per-class"), res.stats.method
    assert "reserved, on_demand, spot by a MIP" in res.stats.bound_scope, res.stats.bound_scope
    c = milp_check.check_round("multi_machine", 3, 60, inp, result=res)
    assert not c.infeasible
    for k, (got, best, ub) in enumerate(zip(c.engine, c.conditional, c.bounds, strict=True)):
        assert best is not None and ub is not None, k
        assert got >= best * 0.9999, (k, got, best)  # the class's optimum on what the classes above left
        assert ub >= best, (k, ub, best)


# 10. the LP path's large fractional rest: an LP dive, not a MILP at its root ------------


def rest_of(seed: int, bids: int, offers: int, per_bid: int) -> tuple[Any, Any, Any, Any, Any]:
    """A fractional rest as ``Solver._frac_milp`` hands it on: 1/2/4/8-GPU same-machine bids,
    each feasible on ``per_bid`` offers of 0-8 free GPUs, with tied asks (many equal scores)."""
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    gpus = rng.choice([1, 2, 4, 8], size=bids, p=[0.4, 0.25, 0.2, 0.15]).astype(np.int64)
    free = rng.choice([0, 1, 2, 4, 7, 8], size=offers, p=[0.1, 0.1, 0.15, 0.25, 0.05, 0.35]).astype(np.int64)
    value = rng.integers(200, 400, size=bids)
    ask = rng.choice([100, 120, 150], size=offers)
    pb = np.repeat(np.arange(bids, dtype=np.int64), per_bid)
    po = np.concatenate([rng.choice(offers, size=per_bid, replace=False) for _ in range(bids)]).astype(np.int64)
    ps = (gpus[pb] * (value[pb] - ask[po]) * 1_000).astype(np.int64)
    mkt = SimpleNamespace(b_gpus=gpus, b_same=np.ones(bids, dtype=np.bool_),
                          bids_id=np.arange(bids, dtype=np.int64) + 1, o_id=np.arange(offers, dtype=np.int64) + 1)
    return mkt, pb, po, ps, free


def feasible(mkt: Any, pb: Any, po: Any, pick: Any, free: Any) -> bool:
    used = np.zeros(len(free), dtype=np.int64)
    np.add.at(used, po[pick], mkt.b_gpus[pb[pick]])
    return len(set(pb[pick].tolist())) == len(pick) and bool((used <= free).all())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_dive_picks_a_feasible_rest_close_to_the_milp_under_its_lp_bound(seed: int) -> None:
    mkt, pb, po, ps, free = rest_of(seed, 150, 100, 10)
    pick, ub = bound.dive_pick(mkt, pb, po, ps, free)  # type: ignore[arg-type]
    assert feasible(mkt, pb, po, pick, free)
    best = bound.milp_pick(mkt, pb, po, ps, free, 10_000)  # type: ignore[arg-type]
    got, opt = int(ps[pick].sum()), int(ps[best].sum())
    assert got <= opt <= ub + 1e-6 * ub  # the LP's optimum bounds the MILP's
    assert got >= 0.99 * opt, (got, opt)
    again, ub2 = bound.dive_pick(mkt, pb, po, ps, free)  # type: ignore[arg-type]
    assert again.tolist() == pick.tolist() and ub2 == ub  # counted steps: the same dive


def test_a_dive_places_the_big_job_whole_where_the_lp_shared_its_machine() -> None:
    """Two 8-GPU machines; one 8-GPU job worth the most and five 2-GPU jobs. The LP may put
    the small jobs on both machines and half the big one on each; fixing what the LP holds
    whole first would leave the big job no machine. Biggest first, it gets one."""
    from types import SimpleNamespace

    gpus = np.asarray([8, 2, 2, 2, 2, 2], dtype=np.int64)
    mkt = SimpleNamespace(b_gpus=gpus, b_same=np.ones(6, dtype=np.bool_), bids_id=np.arange(1, 7), o_id=np.arange(1, 3))
    pb = np.repeat(np.arange(6, dtype=np.int64), 2)
    po = np.tile(np.arange(2, dtype=np.int64), 6)
    ps = np.asarray([1_000, 1_000] + [200, 200] * 5, dtype=np.int64)
    free = np.asarray([8, 8], dtype=np.int64)
    pick, ub = bound.dive_pick(mkt, pb, po, ps, free)  # type: ignore[arg-type]
    assert feasible(mkt, pb, po, pick, free)
    assert 0 in pb[pick].tolist() and int(ps[pick].sum()) == 1_800 == ub  # the big job and four small ones


def test_only_a_large_fractional_rest_is_dived(monkeypatch: pytest.MonkeyPatch) -> None:
    from market.engine import assign

    seen: list[int] = []
    real = bound.dive_pick

    def spy(mkt: Any, pb: Any, *rest: Any) -> Any:
        seen.append(len(pb))
        return real(mkt, pb, *rest)

    monkeypatch.setattr(assign, "dive_pick", spy)
    clear_round(FAMILIES["all_reserved"](0, 1000))
    assert seen and min(seen) > assign.DIVE_PAIRS, seen
    seen.clear()
    clear_round(FAMILIES["all_reserved"](0, 60))
    assert not seen
