"""One auction round: validate, find candidates, assign, price, explain."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from . import bound as bound_mod
from . import exact, pack, shares
from . import parts as submarkets
from .assign import Snapshot, Solver, State, fair_share_limits, priority_order
from .explain import Explainer, money, trade_reason
from .market import BidViews, Candidates, Market, build_market, candidates, top_candidates
from .pricing import bucket_prices
from .types import (
    CLASSES,
    BucketPrice,
    Preemption,
    RoundInput,
    RoundResult,
    RoundStats,
    RunningJob,
    Stopwatch,
    Trade,
    Unmatched,
    no_lap,
)
from .validate import materialised, validate

SMALL_PAIRS = 50_000  # at most this many feasible bid x offer pairs: nothing is pruned
FULL_SCAN_PAIRS = 250_000  # at most this many bid x offer pairs: every one is scored to count the feasible
EXACT_MAX_BIDS = 40  # per class; branch and bound above this rarely finishes
BNB_NODES = 20_000  # the LP path's branch and bound (pure Python: a node is a few microseconds)


class _CollectorPause:
    """Python's cyclic garbage collector off while any round clears in this
    process, and back as it was once the last one is done: rounds may clear on
    several threads at once (the round task, quotes, replays), so the state is
    saved by the first in and restored by the last out, under a lock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.was_on = False

    def __enter__(self) -> None:
        with self.lock:
            if self.depth == 0:
                self.was_on = gc.isenabled()
                gc.disable()
            self.depth += 1

    def __exit__(self, *exc: object) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth == 0 and self.was_on:
                gc.enable()


_PAUSE = _CollectorPause()


def clear_round(inp: RoundInput, stopwatch: Stopwatch | None = None, workers: int = 1) -> RoundResult:
    """Clear one sealed-bid round. Same input, same result, byte for byte.

    A large round that splits into independent sub-markets clears each on its own
    (``parts.py``); with ``workers`` above 1 they clear in that many processes at
    once. The result does not depend on ``workers``.

    With a ``stopwatch``, the engine calls its ``lap`` at the end of each of the
    ``STAGES`` (the operator's rounds page and ``make bench`` show where the
    time went); the result does not depend on it.

    Python's cyclic garbage collector is paused while it runs: the round makes
    millions of small lists and tuples, none in a reference cycle (a 100k round
    ran 30 full collections that freed nothing), and each full collection walks
    every one of them: a 100k round took 158 s with them, 121 s without.
    Memory is freed as usual by reference counting, and the collector comes
    back as it was once the last round in the process is done, error or not;
    other threads' cycles wait that long to be collected."""
    with _PAUSE:
        return _clear(inp, no_lap if stopwatch is None else stopwatch.lap, workers)


def _clear(inp: RoundInput, lap: Callable[[str], None], workers: int = 1) -> RoundResult:
    inp = materialised(inp)
    validate(inp)
    inp, back = shares.split(inp)
    pieces = submarkets.split(inp)
    if len(pieces) == 1:
        return shares.join(_cleared(inp, lap), back)
    if workers <= 1:
        results = [_cleared(p, lap, part=True) for p in pieces]  # a stage's laps add up over the parts
    else:
        lap("validate")
        try:
            results = list(_pool(workers).map(_cleared_part, pieces))
        except BrokenProcessPool:  # a pool process died (killed, out of memory): the parts clear here
            _POOLS.pop(workers, None)
            results = [_cleared(p, no_lap, part=True) for p in pieces]
        lap("explain")  # the parts' stages, run elsewhere, are timed as one
    return shares.join(submarkets.join(inp, pieces, results), back)


_POOLS: dict[int, ProcessPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ProcessPoolExecutor:
    """A process pool of ``workers``, started once per process and kept: its processes are
    spawned (not forked from a server's threads) and import the engine alone, which takes them
    about a second, once."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))
        return pool


def _cleared_part(inp: RoundInput) -> RoundResult:
    """One part of a round, in a pool's process."""
    with _PAUSE:
        return _cleared(inp, no_lap, part=True)


def _cleared(inp: RoundInput, lap: Callable[[str], None], part: bool = False) -> RoundResult:
    """A round, or with ``part`` one part of a large round (``parts.py``): a part clears by a
    large round's path, as the whole round would, without the exact path or the branch and
    bound of small classes (at 2,000 a side, five parts that took them cleared in 18 s, 3 times
    the whole round, for 0.3% more surplus; the class branch and bound alone took 6.8 s)."""
    lap("validate")
    mkt = build_market(inp)
    lap("market")
    cfg = inp.config
    kmax = cfg.max_candidates if cfg.max_candidates > 0 else 16
    cand = None if part else _all_candidates(mkt)
    small = cand is not None
    if cand is None:
        cand = top_candidates(mkt, kmax)
    state = State(free=mkt.o_gpus.tolist(), limits=fair_share_limits(mkt, cand, cfg.fair_share_cap))
    solver = Solver(mkt, cand, state, scan_fallback=small, lap=lap)
    if part:
        solver.dive_pairs = 0
    live = [b for b in range(len(mkt.bids)) if cand.offers[b] or cand.truncated[b]]
    order = priority_order(mkt, cand, live)
    lap("candidates")
    unit = mkt.score_unit  # scores are counted in it; reported in base units
    plan: exact.Plan | None = None
    failed = ""
    if small and cfg.exact_node_limit > 0 and exact.fits(mkt, cand, live):
        empty = solver.snapshot()
        try:
            plan = _exact_path(solver, order, cfg.exact_node_limit, kmax, lap)
        except (RuntimeError, ValueError, ArithmeticError, MemoryError) as e:
            # HiGHS or its binding failing (none seen): the round clears by the LP path, and says so
            solver.restore(empty)
            failed = f"the exact path failed ({type(e).__name__}: {e}), so "
    if plan is not None:
        proven, bound, class_bounds = _place_plan(plan, unit)
        how = "lexicographic MIP (HiGHS) over every feasible pair and placement, fair-share cap included"
        method = "exact" if proven else "mip-lexicographic"
        if any(c.limited for c in plan.classes):
            method += " (work limit)"
    else:
        mip = cfg.exact_node_limit if small and not failed else 0
        proven, bound, class_bounds, mips = _per_class(solver, order, 0 if part else cfg.exact_node_limit, mip, small, kmax, unit, lap)
        how = (failed + "each on the capacity the classes before it left, over every feasible pair (LP relaxation "
               "with column generation; fair-share cap relaxed)")
        if mips:
            how += f"; {', '.join(mips)} by a MIP (HiGHS) over every feasible pair and placement of the class"
        if solver.limited:
            how += (f"; the LP of {', '.join(solver.limited)} stopped at its work limit ({bound_mod.LP_WORK_LIMIT:,} "
                    "simplex iterations): its last whole round of column generation stands, bound included")
        if solver.capped:
            how += (f"; the LP of {', '.join(solver.capped)} held its multi-machine placements at "
                    f"{bound_mod.LP_MAX_FILLS:,} (work limit): those bids' bound terms stay exact")
        method = "exact" if proven else "mip-per-class" if mips else "lp-per-class+rounding+improve"
        if failed:
            method += " (exact path failed)"
        if solver.limited or solver.capped:
            method += " (work limit)"
    assigned = solver.assigned
    surplus = sum(p[2] for parts in assigned.values() for p in parts) * unit

    bucket_bids: dict[tuple[int, int], list[int]] = {}
    if isinstance(cand.views, BidViews):
        bucket_bids = {k: v.tolist() for k, v in cand.views.buckets().items()}
    else:
        for b, keys in enumerate(cand.views):
            for m, r in sorted({(key[0], key[1]) for key in keys}):
                bucket_bids.setdefault((m, r), []).append(b)
    quotes, pay = bucket_prices(mkt, assigned, bucket_bids, cfg.pricing, cfg.price_point)
    lap("pricing")
    moved: dict[int, int] = {}
    saved, optimum = 0.0, surplus
    if cfg.pack_band > 0 and cfg.pricing == "uniform":
        assigned, pay, moved, saved = pack.pack(mkt, assigned, pay, cfg.pack_band, [*order, *sorted(set(assigned) - set(order))])
        surplus = sum(p[2] for parts in assigned.values() for p in parts) * unit
    lap("packing")

    trades: list[Trade] = []
    for b in sorted(assigned):
        bid = mkt.bids[b]
        for o, g, s in sorted(assigned[b], key=lambda p: int(mkt.o_id[p[0]])):
            off = mkt.offers[o]
            price = pay[(b, o)]
            rank = cand.offers[b].index(o) if o in cand.offers[b] else 1
            reason = trade_reason(mkt, b, o, rank, s * unit)
            if cfg.pricing == "uniform":
                what = "spot clearing price" if bid.klass == "spot" else "clearing price"
                reason += f"; pays the {off.gpu_model} {off.region} {what} {money(price)}"
            else:
                reason += f"; pays the ask {money(price)}"
            if b in moved:
                reason += (f"; packed: placed here rather than on offer {mkt.offers[moved[b]].id}, at the same price, which leaves "
                           f"whole machines for the larger bids of the book")
            until = int(mkt.o_until[o])
            backfill = until < mkt.now + bid.duration_s  # only a spot bid's p90 lets a pair past its window
            if backfill:
                assert bid.runtime_p90_s is not None
                reason += (f"; backfilled: the offer's window closes in {(until - mkt.now) / 3600:.1f} h, before the "
                           f"{bid.duration_s / 3600:.1f} h bought, and 9 in 10 jobs like this finished within "
                           f"{bid.runtime_p90_s / 3600:.1f} h; still running then, it is preempted (checkpoint first)")
            trades.append(
                Trade(
                    bid_id=bid.id,
                    offer_id=off.id,
                    machine_id=off.machine_id,
                    provider_id=off.provider_id,
                    buyer_id=bid.buyer_id,
                    gpu_model=off.gpu_model,
                    region=off.region,
                    gpus=g,
                    price=price,
                    duration_s=bid.duration_s,
                    amount=price * g * bid.duration_s // 3600,
                    reason=reason,
                    score=s * unit,
                    backfill_until=until if backfill else None,
                )
            )

    vol: dict[tuple[int, int], list[int]] = {}
    gh: dict[tuple[int, int], float] = {}
    for b, parts in assigned.items():
        for o, g, _ in parts:
            key = (int(mkt.o_model[o]), int(mkt.o_region[o]))
            v = vol.setdefault(key, [0, 0])
            v[0] += g
            v[1] += 1
            gh[key] = gh.get(key, 0.0) + g * mkt.bids[b].duration_s
    prices = tuple(
        BucketPrice(
            gpu_model=mkt.model_ids[m],
            region=mkt.region_ids[r],
            price=q.price,
            volume_gpus=vol.get((m, r), [0, 0])[0],
            volume_gpu_hours=round(gh.get((m, r), 0.0) / 3600, 6),
            trades=vol.get((m, r), [0, 0])[1],
            best_ask=q.best_ask,
            best_bid=q.best_bid,
            spot_price=q.spot_price,
        )
        for (m, r), q in sorted(quotes.items())
    )

    lap("trades")
    unmatched = _unmatched(mkt, solver, state)
    preemptions = _preemptions(inp, mkt, state, unmatched)
    if preemptions:
        # a bid that spot work blocks is told so, not only why nothing was free
        freed: dict[int, int] = {}
        for p in preemptions:
            freed[p.for_bid_id] = freed.get(p.for_bid_id, 0) + 1
        unmatched = tuple(
            dataclasses.replace(u, reasons=(*u.reasons, f"spot work holds GPUs that fit your job: {_plural_jobs(freed[u.bid_id])} "
                                            f"told to stop for you, and a coming round can match you there once they do"))
            if u.bid_id in freed else u
            for u in unmatched
        )
    lap("explain")

    feasible_all = cand.feasible_pairs
    gap: float | None = None
    scope = "none"
    if proven and moved:  # the optimum, given up within the tie band for less fragmentation
        bound, gap = optimum, 0.0 if optimum <= 0 else max(0.0, round((optimum - surplus) / optimum, 9))
        scope = "exact per class in priority order" + (f", {how}" if plan is not None or failed else "")
    elif proven:
        bound, gap = surplus, 0.0
        scope = "exact per class in priority order" + (f", {how}" if plan is not None or failed else "")
    elif bound is not None:
        gap = 0.0 if bound <= 0 else max(0.0, round((bound - surplus) / bound, 9))
        scope = f"per class in priority order, {how}: " + "; ".join(class_bounds)
    if moved:
        method += f" + packing ({len(moved)} moved, {saved:.2f} GPUs less fragmented)"
        scope += (f"; then packing moved {len(moved)} trade(s) within {cfg.pack_band:,} base units per GPU-hour of their best "
                  f"offer to leave {saved:.2f} GPUs fewer of the book's demand stranded, for {optimum - surplus:,} of surplus")
    stats = RoundStats(
        bids=len(mkt.bids),
        offers=len(mkt.offers),
        matched_bids=len(assigned),
        trades=len(trades),
        matched_gpus=sum(t.gpus for t in trades),
        offered_gpus=int(mkt.o_gpus.sum()),
        feasible_pairs=feasible_all,
        candidate_pairs=len(cand.pair_bid),
        surplus=surplus,
        method=method,
        upper_bound=bound,
        gap=gap,
        bound_scope=scope,
    )
    return RoundResult(
        trades=tuple(trades),
        prices=prices,
        unmatched=unmatched,
        preemptions=preemptions,
        stats=stats,
    )


def _all_candidates(mkt: Market) -> Candidates | None:
    """Every feasible pair of a small round, or None where the round is not small: more
    than ``SMALL_PAIRS`` feasible pairs. What counts is the feasible pairs, not bids x
    offers: a 300-a-side round has 90,000 of those and often under 10,000 feasible (narrow
    model sets, a scarce region), which the exact path clears whole. Scoring every pair
    costs about what the pruned scan does up to ``FULL_SCAN_PAIRS`` (10-30 ms at 300 and
    500 a side on the instance families); past it the round is taken as large unscored."""
    if len(mkt.bids) * len(mkt.offers) > FULL_SCAN_PAIRS:
        return None
    cand = candidates(mkt, 0, 0)
    return cand if len(cand.pair_bid) <= SMALL_PAIRS else None


def _exact_path(solver: Solver, order: list[int], node_limit: int, kmax: int,
                lap: Callable[[str], None]) -> exact.Plan:
    """The exact path (``exact.py``): class by class, the heuristic clears the class on
    what the MIP's classes above left, and the MIP starts from that placement. Leaves the
    solver holding the plan."""
    mkt = solver.mkt
    lex = exact.Lexicographic(mkt, solver.cand, order, solver.state.limits, node_limit)
    empty = solver.snapshot()
    for k in lex.present:
        solver.restore(empty)
        for b, parts in sorted(lex.placed(k).items()):
            solver.place(b, parts)
        cls = [b for b in order if mkt.b_klass[b] == k]
        _lp_path(solver, cls, k, True, kmax)
        lex.solve_class(k, {b: solver.assigned[b] for b in cls if b in solver.assigned})
        lap(CLASSES[k])
    solver.restore(empty)
    plan = lex.plan()
    for b in sorted(plan.assigned):
        solver.place(b, plan.assigned[b])
    return plan


def _place_plan(plan: exact.Plan, unit: int) -> tuple[bool, int | None, list[str]]:
    """Per class of the exact path's plan, its surplus and bound (base units)."""
    proven = True
    bound: int | None = 0
    class_bounds: list[str] = []
    for c in plan.classes:
        proven &= c.exact
        if c.exact:
            class_bounds.append(f"{CLASSES[c.klass]} {c.surplus * unit:,} exact")
        elif c.bound is not None:
            why = f"stopped at its work limit, {c.nodes:,} nodes" if c.limited else "HiGHS's tolerance"
            class_bounds.append(f"{CLASSES[c.klass]} {c.surplus * unit:,} <= {c.bound * unit:,} ({why})")
        if bound is not None and c.bound is not None:
            bound += c.bound * unit
        else:
            bound = None
    return proven, bound, class_bounds


def _per_class(
    solver: Solver, order: list[int], node_limit: int, mip_limit: int, small: bool, kmax: int, unit: int,
    lap: Callable[[str], None],
) -> tuple[bool, int | None, list[str], list[str]]:
    """Rounds past the exact path: class by class in priority order, each on what the
    classes before it left. Returns whether every class is proven optimal, the round's
    bound, each class's surplus and bound (base units) and the classes a MIP cleared.

    In a small round whose classes are each small enough for ``exact.fits`` (the whole
    round is not), each class's heuristic placement is the start of that class's MIP on
    what the classes above left (``mip_limit`` nodes, 0 for none): the classes above stay
    where they are, so a tie among them is not broken for the classes below."""
    mkt = solver.mkt
    cand = solver.cand
    proven = True
    bound: int | None = 0
    class_bounds: list[str] = []
    mips: list[str] = []
    for k in range(3):
        cls = [b for b in order if mkt.b_klass[b] == k]
        if not cls:
            continue
        if mip_limit > 0 and exact.fits(mkt, cand, cls, exact.CLASS_MAX_SPANS):
            got, ub, done, note = _class_mip(solver, cls, k, mip_limit, kmax)
            mips.append(note)
            proven &= done
            if bound is not None and ub is not None:
                bound += ub
                class_bounds.append(f"{CLASSES[k]} {got * unit:,} " + ("exact" if done else f"<= {ub * unit:,}"))
            else:
                bound = None
            lap(CLASSES[k])
            continue
        # branch and bound gives a spanning bid one option (its greedy fill): not exact
        exact_ok = (
            node_limit > 0
            and BNB_NODES > 0
            and len(cls) <= EXACT_MAX_BIDS
            and not any(cand.truncated[b] or not mkt.b_same[b] for b in cls)
        )
        before = solver.snapshot() if exact_ok else None
        if exact_ok and solver.exact(cls, BNB_NODES):
            got = _class_surplus(solver, cls)
            if bound is not None:
                bound += got
            class_bounds.append(f"{CLASSES[k]} {got * unit:,} exact")
            lap(CLASSES[k])
            continue
        proven = False
        incumbent: tuple[int, Snapshot] | None = None
        if before is not None:
            # branch and bound ran out of nodes with its incumbent placed: the LP from
            # here would bound only the capacity that incumbent left (a bound below the
            # class's own surplus). Its rounding from here is kept as a candidate; the
            # bound, and a second rounding, come from the capacity the class started with.
            _lp_path(solver, cls, k, small, kmax)
            incumbent = (_class_surplus(solver, cls), solver.snapshot())
            solver.restore(before)
        ub = _lp_path(solver, cls, k, small, kmax)
        if incumbent is not None and incumbent[0] >= _class_surplus(solver, cls):
            solver.restore(incumbent[1])
        if ub is None or bound is None:
            bound = None
        else:
            got = _class_surplus(solver, cls)
            ub = max(ub, got)  # a class's bound is never below what it got
            bound += ub
            class_bounds.append(f"{CLASSES[k]} {got * unit:,} <= {ub * unit:,}")
        lap(CLASSES[k])
    return proven, None if bound is None else bound * unit, class_bounds, mips


def _class_mip(solver: Solver, cls: list[int], k: int, node_limit: int,
               kmax: int) -> tuple[int, int | None, bool, str]:
    """Class ``k`` (bids ``cls``) by its MIP (``exact.Lexicographic`` of this class alone)
    on what is free, from the heuristic's placement; returns its surplus, its bound (the
    lower of the MIP's and the LP relaxation's, None if neither), whether it is proven
    and how the scope names it."""
    mkt = solver.mkt
    st = solver.state
    free = np.asarray(st.free, dtype=np.int64)
    used = {key: v for key, v in st.used.items() if v}
    before = solver.snapshot()
    lp = _lp_path(solver, cls, k, True, kmax)
    heuristic = {b: solver.assigned[b] for b in cls if b in solver.assigned}
    try:
        lex = exact.Lexicographic(mkt, solver.cand, cls, st.limits, node_limit, free=free, used=used)
        res = lex.solve_class(k, heuristic)
        plan = lex.plan()
    except (RuntimeError, ValueError, ArithmeticError, MemoryError) as e:
        # HiGHS or its binding failing (none seen): the class keeps the heuristic's placement
        got = _class_surplus(solver, cls)
        return got, None if lp is None else max(got, lp), False, f"{CLASSES[k]} (its MIP failed: {type(e).__name__})"
    solver.restore(before)
    for b in sorted(plan.assigned):
        solver.place(b, plan.assigned[b])
    got = _class_surplus(solver, cls)
    ubs = [u for u in (lp, res.bound) if u is not None]
    ub = max(got, min(ubs)) if ubs else None
    return got, ub, res.exact or (ub is not None and ub <= got), CLASSES[k]


def _lp_path(solver: Solver, cls: list[int], k: int, small: bool, kmax: int) -> int | None:
    """Clear class ``k`` (bids ``cls``) on what is free: its LP (column generation
    over fresh lists in larger rounds), rounded, refilled and improved; returns the
    LP's bound on the class over that capacity (None if the LP failed)."""
    rest = None if small else solver.refresh(cls, kmax)
    ub = solver.lp_class(cls, rest)
    if not small:
        solver.refill(cls, kmax)
    solver.improve(cls, k)
    return ub


def _class_surplus(solver: Solver, bids: list[int]) -> int:
    return sum(p[2] for b in bids for p in solver.assigned.get(b, ()))


def _unmatched(mkt: Market, solver: Solver, state: State) -> tuple[Unmatched, ...]:
    waiting = [b for b in range(len(mkt.bids)) if b not in solver.assigned]
    capped: list[bool] = []
    for b in waiting:
        hit = False
        if state.limits:
            g = int(mkt.b_gpus[b])
            for key in solver.cand.views[b]:
                lim = state.limits.get((key[0], key[1]))
                used = state.used.get((int(mkt.bids[b].buyer_id), key[0], key[1]), 0)
                if lim is not None and used + g > lim:
                    hit = True
        capped.append(hit)
    had = [len(solver.cand.offers[b]) + int(solver.cand.truncated[b]) for b in waiting]
    rows = Explainer(mkt).unmatched_many(waiting, had, capped)
    return tuple(
        Unmatched(bid_id=mkt.bids[b].id, reasons=reasons, nearest=nearest)
        for b, (reasons, nearest) in zip(waiting, rows, strict=True)
    )


def _plural_jobs(n: int) -> str:
    return "1 spot job is" if n == 1 else f"{n} spot jobs are"


def _preemptions(
    inp: RoundInput, mkt: Market, state: State, unmatched: tuple[Unmatched, ...]
) -> tuple[Preemption, ...]:
    """The spot jobs to stop for the higher-class bids that waited: per waiting bid (reserved
    first, then on-demand, the highest max price first), the offer where the fewest spot
    GPUs must go (then the cheapest), on the book (its free GPUs after this round count) or
    ``occupied`` (none free), and its spot jobs, the cheapest first, until the bid's GPUs
    are there. A job already told to stop counts without a new preemption."""
    jobs = sorted((j for j in inp.running if j.klass == "spot"), key=lambda j: (not j.stopping, j.price, j.trade_id))
    if not jobs or not unmatched:
        return ()
    # one market over the book's offers and the occupied ones, for the hard constraints
    pm = build_market(dataclasses.replace(inp, offers=inp.offers + inp.occupied, running=(), occupied=())) if inp.occupied else mkt
    in_book = {int(i): o for o, i in enumerate(mkt.o_id.tolist())}
    index = {int(i): o for o, i in enumerate(pm.o_id.tolist())}
    on_offer: dict[int, list[RunningJob]] = {}
    for j in jobs:
        if j.offer_id in index:
            on_offer.setdefault(j.offer_id, []).append(j)
    bid_index = {bid.id: i for i, bid in enumerate(pm.bids)}
    waiting = [bid_index[u.bid_id] for u in unmatched]
    waiting = [b for b in waiting if pm.b_klass[b] < 2 and pm.b_same[b] and pm.b_deadline_ok[b]]
    waiting.sort(key=lambda b: (int(pm.b_klass[b]), -int(pm.b_maxp[b]), pm.bids[b].created_at, pm.bids[b].id))
    used: set[int] = set()
    free_left: dict[int, int] = {}
    out: list[Preemption] = []
    for b in waiting:
        bid = pm.bids[b]
        best: tuple[int, int, int, list[RunningJob]] | None = None
        for offer_id, on in sorted(on_offer.items()):
            o = index[offer_id]
            m, r = int(pm.o_model[o]), int(pm.o_region[o])
            if not (pm.model_ok[b, m] and pm.region_allowed[b, r] and pm.latency_ok[b, r]):
                continue
            if not pm.offer_ok(b, o, check_gpus=False) or pm.value(b, o) <= 0:
                continue
            have = free_left.get(offer_id, state.free[in_book[offer_id]] if offer_id in in_book else 0)
            take: list[RunningJob] = []
            for j in on:
                if have >= bid.gpus:
                    break
                if j.trade_id not in used:
                    take.append(j)
                    have += j.gpus
            if have < bid.gpus or not take:
                continue
            key = (sum(j.gpus for j in take if not j.stopping), int(pm.o_ask[o]), offer_id, take)
            if best is None or key[:3] < best[:3]:
                best = key
        if best is None:
            continue
        o = index[best[2]]
        # the free GPUs it counted are this bid's now: no other waiting bid counts them again
        was = free_left.get(best[2], state.free[in_book[best[2]]] if best[2] in in_book else 0)
        free_left[best[2]] = max(0, was - bid.gpus)
        for j in best[3]:
            used.add(j.trade_id)
            if j.stopping:
                continue
            out.append(
                Preemption(
                    trade_id=j.trade_id,
                    for_bid_id=bid.id,
                    reason=(
                        f"spot job of {j.gpus} GPUs at {money(j.price)} on machine {j.machine_id} "
                        f"({pm.model_ids[int(pm.o_model[o])]}, {pm.region_ids[int(pm.o_region[o])]}) blocks {bid.klass} bid "
                        f"{bid.id} for {bid.gpus} GPUs at up to {money(bid.max_price)}"
                    ),
                )
            )
    return tuple(out)
