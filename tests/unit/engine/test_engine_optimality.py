"""The assignment against independent solvers: brute force and an exact MILP."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from market.engine import Bid, Offer, RoundInput, assign, bound, clear_round
from market.engine.market import (
    CUT_TIERS,
    BidViews,
    Candidates,
    Market,
    build_market,
    candidates,
    cut_caps,
    price_out,
    size_tier,
    top_candidates,
)
from tests.bench.instances import make_round
from tests.unit.engine.engine_builders import bid, offer, round_of


def pair_table(inp: RoundInput) -> tuple[list[int], list[int], dict[tuple[int, int], int]]:
    """Every feasible (bid, offer) pair with the engine's score, nothing pruned."""
    mkt = build_market(inp)
    c = candidates(mkt, 0, 0)
    scores = {
        (int(b), int(o)): int(s)
        for b, o, s in zip(c.pair_bid.tolist(), c.pair_offer.tolist(), c.pair_score.tolist(), strict=True)
    }
    return mkt.b_gpus.tolist(), mkt.o_gpus.tolist(), scores


def brute_force(inp: RoundInput) -> int:
    gpus, cap, scores = pair_table(inp)
    best = 0
    choices: list[list[int | None]] = [
        [None, *[o for (b2, o) in scores if b2 == b]] for b in range(len(gpus))
    ]
    for combo in itertools.product(*choices):
        used = [0] * len(cap)
        total = 0
        for b, o in enumerate(combo):
            if o is not None:
                used[o] += gpus[b]
                total += scores[(b, o)]
        if all(u <= c for u, c in zip(used, cap, strict=True)):
            best = max(best, total)
    return best


small_offer = st.builds(
    lambda g, ask, region, model: offer(0, gpus=g, ask=ask, region=region, gpu_model=model),
    st.sampled_from([1, 2, 4, 8]), st.integers(1_000_000, 3_000_000),
    st.sampled_from(["eu-west", "us-east"]), st.sampled_from(["H100", "A100"]),
)
small_bid = st.builds(
    lambda g, maxp, hours, models, loc: bid(
        0, gpus=g, max_price=maxp, duration_s=3600 * hours, gpu_models=models, location_region=loc
    ),
    st.sampled_from([1, 2, 4, 8]), st.integers(1_000_000, 3_500_000), st.integers(1, 24),
    st.sampled_from([("H100",), ("A100",), ("A100", "H100")]),
    st.sampled_from([None, "eu-west", "us-east"]),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(small_offer, min_size=1, max_size=4), st.lists(small_bid, min_size=1, max_size=5))
def test_small_rounds_reach_the_brute_force_optimum(offers: list[Offer], bids: list[Bid]) -> None:
    offers = [dataclasses.replace(o, id=i + 1, machine_id=i + 1) for i, o in enumerate(offers)]
    bids = [dataclasses.replace(b, id=i + 1) for i, b in enumerate(bids)]
    inp = round_of(offers, bids)
    res = clear_round(inp)
    best = brute_force(inp)
    assert res.stats.surplus == best
    # "exact" only where HiGHS's tolerances are under a unit of these scores; a bound anyway
    assert res.stats.method in ("exact", "mip-lexicographic")
    assert res.stats.upper_bound is not None and res.stats.upper_bound >= best
    assert res.stats.method != "exact" or res.stats.upper_bound == best


def exact_milp(inp: RoundInput) -> float:
    gpus, cap, scores = pair_table(inp)
    keys = sorted(scores)
    n, nb, no = len(keys), len(gpus), len(cap)
    rows = [b for b, _ in keys] + [nb + o for _, o in keys]
    vals = [1.0] * n + [float(gpus[b]) for b, _ in keys]
    a = coo_matrix((vals, (rows, list(range(n)) * 2)), shape=(nb + no, n))
    res = milp(
        -np.asarray([scores[k] for k in keys], dtype=float),
        constraints=LinearConstraint(a, -np.inf, np.r_[np.ones(nb), cap]),
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
    )
    return float(-res.fun)


def one_class_same_machine(inp: RoundInput) -> RoundInput:
    return same_machine_all_classes(one_class(inp))


def test_medium_round_is_within_half_a_percent_of_the_milp_optimum() -> None:
    inp = one_class_same_machine(make_round(300, 300, seed=11))
    res = clear_round(inp)
    opt = exact_milp(inp)
    assert res.stats.surplus <= opt + 1
    assert res.stats.surplus >= 0.995 * opt


def test_reported_upper_bound_covers_the_milp_optimum_of_a_pruned_round() -> None:
    inp = one_class_same_machine(make_round(300, 300, seed=5))
    res = clear_round(inp)
    assert res.stats.upper_bound is not None and res.stats.gap is not None
    assert res.stats.upper_bound >= exact_milp(inp) - 1
    assert res.stats.surplus <= res.stats.upper_bound
    assert "every feasible pair" in res.stats.bound_scope


def same_machine_all_classes(inp: RoundInput) -> RoundInput:
    bids = tuple(dataclasses.replace(b, same_machine=True, gpus=min(b.gpus, 8)) for b in inp.bids)
    return dataclasses.replace(inp, bids=bids)


@pytest.mark.parametrize("lp_columns", [400_000, 0], ids=["lp", "lagrangian"])
def test_per_class_bound_covers_each_class_optimum_on_the_capacity_left(
    lp_columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(assign, "LP_MAX_COLUMNS", lp_columns)
    inp = same_machine_all_classes(make_round(300, 300, seed=7))
    res = clear_round(inp)
    assert res.stats.method != "exact" and res.stats.upper_bound is not None
    assert "per class in priority order" in res.stats.bound_scope
    mkt = build_market(inp)
    c = candidates(mkt, 0, 0)
    offer_at = {int(i): o for o, i in enumerate(mkt.o_id.tolist())}
    klass_of = {b.id: b.klass for b in inp.bids}
    free = mkt.o_gpus.astype(float)
    total = 0.0
    for k in ("reserved", "on_demand", "spot"):
        sel = np.asarray([mkt.bids[int(b)].klass == k for b in c.pair_bid], dtype=bool)
        pb, po, ps = c.pair_bid[sel], c.pair_offer[sel], c.pair_score[sel]
        if len(pb):
            nb, no, n = len(mkt.bids), len(mkt.offers), len(pb)
            a = coo_matrix(
                (np.r_[np.ones(n), mkt.b_gpus[pb]], (np.r_[pb, nb + po], np.r_[np.arange(n), np.arange(n)])),
                shape=(nb + no, n),
            )
            r = milp(-ps.astype(float), constraints=LinearConstraint(a, -np.inf, np.r_[np.ones(nb), free]),
                     integrality=np.ones(n), bounds=Bounds(0, 1))
            total += float(-r.fun)
        for t in res.trades:  # the capacity the engine's class k leaves to the next
            if klass_of[t.bid_id] == k:
                free[offer_at[t.offer_id]] -= t.gpus
    assert res.stats.surplus <= res.stats.upper_bound
    assert total <= res.stats.upper_bound + 1


def test_pricing_out_finds_the_best_reduced_score_of_every_bid() -> None:
    mkt = build_market(make_round(200, 200, seed=3))
    views = top_candidates(mkt, 4).views
    assert isinstance(views, BidViews)
    lam = np.random.default_rng(0).integers(0, 400_000, len(mkt.offers)).astype(np.int64)
    bids = np.arange(len(mkt.bids), dtype=np.int64)
    red, _, _, _ = price_out(mkt, bids, lam, np.zeros(len(bids), dtype=np.int64), views, mkt.o_gpus)
    c = candidates(mkt, 0, 0)
    want = np.zeros(len(bids), dtype=np.int64)
    np.maximum.at(want, c.pair_bid, c.pair_score - mkt.b_gpus[c.pair_bid] * lam[c.pair_offer])
    assert (want > 0).sum() > 20
    assert red.tolist() == want.tolist()


def test_divisibility_rows_keep_the_bound_to_whole_jobs_on_a_leftover() -> None:
    """7 free GPUs hold one 4-GPU job, not 7/4 of one: the plain relaxation
    would bound the pair at 1.75 jobs, the divisibility rows at exactly one."""
    from market.engine.bound import class_lp

    inp = round_of([offer(1, gpus=7)], [bid(1, gpus=4), bid(2, gpus=4, max_price=2_900_000)])
    mkt = build_market(inp)
    c = candidates(mkt, 0, 0)
    bids = np.arange(len(mkt.bids), dtype=np.int64)
    lp = class_lp(mkt, bids, (c.pair_bid, c.pair_offer, c.pair_score), mkt.o_gpus, None, None)
    assert lp is not None
    best = int(c.pair_score.max())
    assert lp.bound == pytest.approx(best, abs=2)
    assert lp.lam[:, 2].sum() > 0  # the 4-GPU row, not the plain capacity, carries the price


def test_the_warm_lp_built_column_by_column_is_the_cold_lp() -> None:
    """The warm LP writes a row when a column first needs it (bid, capacity,
    divisibility rows); columns that arrive in later rounds, some opening rows no
    column used before, give the same optimum and prices as one cold solve."""
    from market.engine.bound import _lp, _WarmLP

    inp = make_round(60, 60, seed=3)
    mkt = build_market(inp)
    c = candidates(mkt, 0, 0)
    single = mkt.b_same[c.pair_bid]
    pb, po, ps = c.pair_bid[single], c.pair_offer[single], c.pair_score[single]
    free = np.maximum(mkt.o_gpus - 1, 0)  # odd leftovers: divisibility rows cut
    cold = _lp(mkt, pb, po, ps, free)
    assert cold is not None
    warm = _WarmLP(mkt, free)
    for part in np.array_split(np.argsort(ps, kind="stable"), 3):  # the weakest pairs first
        warm.add(pb[part], po[part], ps[part])
        assert warm.solve() is not None
    got = warm.solve()
    assert got is not None
    assert got[0] == pytest.approx(cold[0], rel=1e-9)
    # a row for each bid and offer some column uses, and each divisibility row that cuts one
    jp, caps = size_tier(mkt.b_gpus[pb], mkt.b_same[pb]), cut_caps(free)
    cuts = [len(np.unique(po[(jp >= j) & (caps[po, j] < caps[po, 0])])) for j in range(1, CUT_TIERS)]
    assert sum(cuts) > 0
    assert warm.rows == len(np.unique(pb)) + len(np.unique(po)) + sum(cuts)
    order = np.argsort(ps, kind="stable")
    assert float(got[1] @ ps[order]) == pytest.approx(cold[0], rel=1e-9)


def one_class(inp: RoundInput) -> RoundInput:
    """Every bid on-demand, multi-machine bids kept: one class, so the
    lexicographic optimum is the plain one."""
    return dataclasses.replace(inp, bids=tuple(dataclasses.replace(b, klass="on_demand") for b in inp.bids))


@pytest.mark.parametrize("seed", [5, 13])
def test_bound_and_surplus_against_the_milp_with_multi_machine_bids(seed: int) -> None:
    """Multi-machine bids are whole in one bucket: the bound (with their exact
    fills) still covers the MILP optimum that models that, and the rounding
    (both orders, evictions for the multi-machine bids) stays close to it."""
    from tests.bench.bench_engine import optimum

    inp = one_class(make_round(300, 300, seed=seed))
    assert sum(not b.same_machine for b in inp.bids) >= 5
    res = clear_round(inp)
    opt, how = optimum(inp, res)
    assert opt is not None and "time limit" not in how
    assert res.stats.upper_bound is not None
    # the reference MILP stops within scipy's default relative gap (1e-4): since a 300-a-side
    # round counts its feasible pairs and clears by a MIP, the engine beats it by up to that
    assert res.stats.surplus <= opt * (1 + 1e-4) + 1
    assert res.stats.upper_bound >= opt - 1
    assert res.stats.surplus >= 0.995 * opt


def spanning_job(offers: list[Offer]) -> tuple[Market, Candidates]:
    """A round of one 16-GPU job that may span machines (of one bucket) on
    ``offers``, and every feasible pair of it."""
    job = bid(1, gpus=16, same_machine=False, max_price=3_000_000, duration_s=7200)
    mkt = build_market(round_of(offers, [job]))
    return mkt, candidates(mkt, 0, 0)


def test_multi_fill_bound_is_the_best_whole_bucket_not_the_best_pair() -> None:
    """A 16-GPU job may span machines of one bucket only. us-east is cheaper
    but holds 12 GPUs; eu-west holds 16. The LP's term for the bid is its best
    single pair (all 16 GPUs at us-east's ask); the fill bound is eu-west's."""
    from market.engine.bound import multi_fill_bound

    offers = [
        offer(1, gpus=8, ask=2_000_000), offer(2, gpus=8, ask=2_000_000),
        offer(3, gpus=8, ask=1_000_000, region="us-east"), offer(4, gpus=4, ask=1_000_000, region="us-east"),
    ]
    mkt, c = spanning_job(offers)
    bids = np.asarray([0], dtype=np.int64)
    zero = np.zeros(len(mkt.offers), dtype=np.int64)
    fill = int(multi_fill_bound(mkt, bids, zero, mkt.o_gpus, c.views)[0])
    eu = [int(s) for o, s in zip(c.pair_offer.tolist(), c.pair_score.tolist(), strict=True)
          if mkt.region_ids[int(mkt.o_region[o])] == "eu-west"]
    assert fill == pytest.approx(max(eu), abs=2)
    assert fill < int(c.pair_score.max())
    # at a price of the whole margin on eu-west's GPUs, nothing is left to gain there
    price = zero.copy()
    price[[i for i in range(len(mkt.offers)) if mkt.region_ids[int(mkt.o_region[i])] == "eu-west"]] = 10**9
    assert int(multi_fill_bound(mkt, bids, price, mkt.o_gpus, c.views)[0]) <= 1


def test_lp_keeps_a_multi_machine_job_whole_in_one_bucket() -> None:
    """A 16-GPU job may span machines of one bucket only. Each region has 8
    cheap and 8 dear GPUs. As pairs, the LP took the cheap 8 of each region
    (half the job in each); as whole fills (one column per placement), its
    optimum and its bound are the best whole placement: the cheap and the
    dear 8 of one region."""
    from market.engine.bound import class_lp

    offers = [
        offer(1, gpus=8, ask=1_000_000), offer(2, gpus=8, ask=2_000_000),
        offer(3, gpus=8, ask=1_000_000, region="us-east"), offer(4, gpus=8, ask=2_000_000, region="us-east"),
    ]
    mkt, c = spanning_job(offers)
    score = {int(mkt.o_id[o]): int(s) for o, s in zip(c.pair_offer.tolist(), c.pair_score.tolist(), strict=True)}
    whole = max(score[1] + score[2], score[3] + score[4]) / 2
    split = (score[1] + score[3]) / 2
    bids = np.asarray([0], dtype=np.int64)
    cols = (c.pair_bid, c.pair_offer, c.pair_score)
    lp = class_lp(mkt, bids, cols, mkt.o_gpus.copy(), None, None, fills=c.views)
    assert lp is not None
    assert lp.value == pytest.approx(whole, abs=2)
    assert whole <= lp.bound <= whole + 16 + 3  # slack: a unit per part, the bid's GPUs + 1
    (j,) = np.flatnonzero(lp.fx > 1e-9).tolist()
    assert lp.fx[j] == pytest.approx(1.0)
    assert len({mkt.region_ids[int(mkt.o_region[o])] for o, _ in lp.fills.parts(j)}) == 1
    as_pairs = class_lp(mkt, bids, cols, mkt.o_gpus.copy(), None, None)
    assert as_pairs is not None and as_pairs.value == pytest.approx(split, abs=2)


def test_lagrangian_bound_prices_out_pruned_pairs_and_stays_near_the_lp_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """Classes too big for the LP get the Lagrangian bound; with column
    generation it stays a few percent above the LP's (2.5% here). Without it,
    offers no column touched kept a price of 0: 17% above at 20k orders."""
    inp = make_round(2000, 2000, seed=3)
    lp = clear_round(inp)
    monkeypatch.setattr(assign, "LP_MAX_COLUMNS", 0)
    lag = clear_round(inp)
    assert lp.stats.upper_bound is not None and lag.stats.upper_bound is not None
    assert lag.stats.surplus <= lag.stats.upper_bound
    assert lag.stats.upper_bound <= 1.04 * lp.stats.upper_bound


def test_a_class_lp_stopped_at_its_work_limit_keeps_its_last_whole_round(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``LP_WORK_LIMIT`` simplex iterations the round of column generation running is
    dropped and the one before stands: its solution over its own columns, and a bound (any
    prices give one) no tighter than the whole LP's and never below the LP's own optimum.
    Capping the fills (``LP_MAX_FILLS``) keeps the bound too: a multi-machine bid's term is
    its exact best fill whether or not its fills are columns."""
    from market.engine.bound import class_lp

    inp = one_class(make_round(300, 300, seed=13))
    mkt = build_market(inp)
    c = top_candidates(mkt, 2)  # short lists: the LP's columns grow round by round
    assert isinstance(c.views, BidViews) and c.rest is not None
    bids = np.arange(len(mkt.bids), dtype=np.int64)
    sizes = [len(o) for o in c.offers]
    cols = (np.repeat(bids, sizes), np.asarray([o for x in c.offers for o in x], dtype=np.int64),
            np.asarray([v for x in c.scores for v in x], dtype=np.int64))

    def lp() -> bound.ClassLP:
        got = class_lp(mkt, bids, cols, mkt.o_gpus.copy(), c.rest, c.views, rounds=12, fills=c.views)
        assert got is not None
        return got

    whole = lp()
    monkeypatch.setattr(bound, "LP_WORK_LIMIT", 0)
    cut = lp()
    monkeypatch.setattr(bound, "LP_MAX_FILLS", 0)
    no_fills = lp()
    assert whole.columns_added > 0 and not whole.limited and cut.limited
    assert len(cut.x) == len(cut.pb) and len(cut.fx) == len(cut.fills)
    assert cut.value <= whole.value + 1 and cut.bound >= whole.bound - 1
    assert float(cut.x @ cut.ps + cut.fx @ cut.fills.score) == pytest.approx(cut.value, rel=1e-6)
    assert no_fills.capped and len(no_fills.fills) == 0 and no_fills.bound >= whole.bound - 1


def test_a_round_whose_lps_stop_at_their_work_limit_says_so_and_keeps_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round large enough for column generation over pruned pairs: with every class LP
    stopped after its first round, the round is feasible, says so in its method and scope,
    and reports a bound no tighter than the whole LPs' and still above its surplus; a
    replay clears the same (the limit is counted, not timed)."""
    inp = make_round(2000, 2000, seed=3)
    full = clear_round(inp)
    monkeypatch.setattr(bound, "LP_WORK_LIMIT", 0)
    cut = clear_round(inp)
    assert full.stats.upper_bound is not None and cut.stats.upper_bound is not None
    assert "(work limit)" not in full.stats.method
    assert cut.stats.method.endswith("(work limit)") and "stopped at its work limit" in cut.stats.bound_scope
    assert cut.stats.surplus <= cut.stats.upper_bound
    assert cut.stats.upper_bound >= 0.999 * full.stats.upper_bound
    assert clear_round(inp).trades == cut.trades
