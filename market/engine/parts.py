"""Independent sub-markets: a large round split into the parts no bid spans, each cleared on
its own, and the results joined.

A part is a set of GPU models. Two models are in one part when a bid would take either (its
``gpu_models``, memory, compute and vendor allow both), so no bid can trade outside its part,
and no offer, spot job or bucket price is seen by two parts. Regions stay whole inside a part:
a bid's explanation names offers of its models in every region ("allow us-east"), so it reads
the same whichever way the round is split. Each part is a round of its own (its own candidate
lists, exact path where it is small, score unit and bound); what couples buckets in the engine
(a buyer's fair share, pricing, preemption) is per bucket, so nothing crosses a part.

Only rounds of more than ``SPLIT_PAIRS`` bid x offer pairs are split (``clear.py`` clears the
others whole, the same as before parts existed). The parts' results are joined in the order a
whole round lists them (trades by bid then offer, prices by bucket, unmatched bids by id,
preemptions by waiting order), so the result depends on the input alone, not on how many
processes cleared the parts or in which order they finished (``clear_round(workers=...)``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from .market import ModelTable
from .types import Bid, Preemption, RoundInput, RoundResult, RoundStats

SPLIT_PAIRS = 250_000  # a round of more bid x offer pairs than this clears part by part (clear.FULL_SCAN_PAIRS)


def split(inp: RoundInput) -> list[RoundInput]:
    """The round's parts, largest first (bids x offers, then the first model's id); the round
    itself, alone, where it is not large or does not split. Bids that no offered model would
    take join the first part, where they are explained as in a whole round."""
    if len(inp.bids) * len(inp.offers) <= SPLIT_PAIRS:
        return [inp]
    models = sorted(inp.gpu_models, key=lambda m: m.id)
    index = {m.id: i for i, m in enumerate(models)}
    accepts = ModelTable(models)  # build_market's model_ok rows
    offered = {index[o.gpu_model] for o in (*inp.offers, *inp.occupied)}
    parent = list(range(len(models)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    seen: dict[tuple[object, ...], tuple[int, ...]] = {}
    takes: list[tuple[int, ...]] = []
    for b in inp.bids:
        key = (b.gpu_models, b.min_memory_gib, b.min_compute_units, b.vendor)
        acc = seen.get(key)
        if acc is None:
            acc = seen[key] = tuple(int(i) for i in np.flatnonzero(accepts.row(b)) if i in offered)
            for i in acc[1:]:
                ra, rb = root(acc[0]), root(i)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
        takes.append(acc)
    roots = sorted({root(i) for i in offered})
    if len(roots) < 2:
        return [inp]
    part_of = {r: k for k, r in enumerate(roots)}
    offers: list[list[object]] = [[] for _ in roots]
    occupied: list[list[object]] = [[] for _ in roots]
    bids: list[list[Bid]] = [[] for _ in roots]
    offer_part: dict[int, int] = {}
    for o in inp.offers:
        k = part_of[root(index[o.gpu_model])]
        offers[k].append(o)
        offer_part[o.id] = k
    for o in inp.occupied:
        k = part_of[root(index[o.gpu_model])]
        occupied[k].append(o)
        offer_part.setdefault(o.id, k)
    lost: list[Bid] = []
    for b, acc in zip(inp.bids, takes, strict=True):
        if acc:
            bids[part_of[root(acc[0])]].append(b)
        else:
            lost.append(b)
    running: list[list[object]] = [[] for _ in roots]
    for j in inp.running:
        if j.offer_id in offer_part:  # a job on no offer of the round is never preempted by it
            running[offer_part[j.offer_id]].append(j)
    order = sorted(range(len(roots)), key=lambda k: (-len(bids[k]) * len(offers[k]), models[roots[k]].id))
    bids[order[0]].extend(lost)
    return [
        dataclasses.replace(inp, offers=tuple(offers[k]), bids=tuple(bids[k]), occupied=tuple(occupied[k]),  # type: ignore[arg-type]
                            running=tuple(running[k]))  # type: ignore[arg-type]
        for k in order
    ]


def join(inp: RoundInput, parts: Sequence[RoundInput], results: Sequence[RoundResult]) -> RoundResult:
    """The parts' results as one round's: each list in a whole round's order, the statistics
    added up, and the method and bound of each part named."""
    trades = sorted((t for r in results for t in r.trades), key=lambda t: (t.bid_id, t.offer_id))
    prices = sorted((p for r in results for p in r.prices), key=lambda p: (p.gpu_model, p.region))
    unmatched = sorted((u for r in results for u in r.unmatched), key=lambda u: u.bid_id)
    bid = {b.id: b for b in inp.bids}
    klass = {"reserved": 0, "on_demand": 1, "spot": 2}

    def waiting(p: Preemption) -> tuple[int, int, int, int]:  # clear._preemptions' order of waiting bids
        b = bid[p.for_bid_id]
        return klass.get(b.klass, 3), -b.max_price, b.created_at, b.id

    preemptions = sorted((p for r in results for p in r.preemptions), key=waiting)
    stats = [r.stats for r in results]

    def total(field: str) -> int:
        return sum(int(getattr(s, field)) for s in stats)

    surplus = total("surplus")
    bound = None if any(s.upper_bound is None for s in stats) else sum(int(s.upper_bound or 0) for s in stats)
    gap = None if bound is None else 0.0 if bound <= 0 else max(0.0, round((bound - surplus) / bound, 9))
    names = [_models(p) for p in parts]
    methods = sorted({s.method for s in stats})
    method = f"{len(parts)} independent parts: " + ("; ".join(methods) if len(methods) > 1 else methods[0])
    scope = (f"{len(parts)} independent parts (GPU models no bid spans), each cleared on its own: "
             + " | ".join(f"{n} ({len(p.bids):,} bids, {len(p.offers):,} offers): {s.method}; {s.bound_scope}"
                          for n, p, s in zip(names, parts, stats, strict=True)))
    return RoundResult(
        trades=tuple(trades),
        prices=tuple(prices),
        unmatched=tuple(unmatched),
        preemptions=tuple(preemptions),
        stats=RoundStats(
            bids=total("bids"), offers=total("offers"), matched_bids=total("matched_bids"), trades=total("trades"),
            matched_gpus=total("matched_gpus"), offered_gpus=total("offered_gpus"), feasible_pairs=total("feasible_pairs"),
            candidate_pairs=total("candidate_pairs"), surplus=surplus, method=method, upper_bound=bound, gap=gap,
            bound_scope=scope,
        ),
    )


def _models(part: RoundInput) -> str:
    ids = sorted({o.gpu_model for o in (*part.offers, *part.occupied)})
    return ", ".join(ids) if len(ids) <= 4 else f"{', '.join(ids[:3])} and {len(ids) - 3} more models"
