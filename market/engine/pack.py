"""Packing (issue 38): once a round is cleared and priced, move a trade to another offer of
its own bucket where that fragments the bucket less, within a tie band of price.

Fragmentation is where a shared pool loses capacity: 1-GPU jobs scattered over 8-GPU
machines leave no machine whole for the 8-GPU job that comes next. The measure is FGD's
(Weng et al., USENIX ATC'23; ``market.packing`` has it for shares of GPUs too), on the
engine's whole GPUs:

- **The coming demand** is the round's book: every bid's GPU count, each weighing one.
  The bids that lost are the ones that next rounds will place; the ones that won tell the
  mix.
- **An offer's fragmentation** with ``f`` GPUs free is the expected GPUs a job of the
  demand could not use there: ``sum over sizes s of share(s) x (f if s > f else 0)``. An
  offer of 8 free loses nothing to a demand of 1s and 8s; left with 7, it loses 7 to
  every 8-GPU bid.
- **The move.** Bids in priority order (``bid_order``): a bid placed whole on one offer may
  move to another offer of the same bucket (GPU model x region) that it may take
  (``Market.offer_ok``, GPUs free after every trade of the round) when the two offers'
  fragmentation falls by moving it (strictly, ties to the least, then the higher value,
  then the lower offer id), and
  - **no buyer pays more**: the bucket's price is uniform, so the buyer pays what it paid
    (the price it was charged, spot or not), and the new offer's ask is at most that price,
    so its provider is paid at least its ask;
  - **the tie band**: the pair's value per GPU-hour (``Market.value``: the limit less the
    ask, latency, region and carbon, plus reliability) is within ``band`` base units of the
    pair it leaves. The round's surplus falls by at most ``band`` x GPU-hours per move,
    and the statistics say by how much.
- Multi-machine placements, and rounds priced pay-as-ask (where a move would change what
  the buyer pays), are left as they are.

Deterministic: the same round packs the same way.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .market import Market, pair_scores

Part = tuple[int, int, int]  # offer index, GPUs, score


def demand_of(mkt: Market) -> dict[int, float]:
    """The round's book as a demand: each bid size's share of the bids."""
    sizes = Counter(int(g) for g in mkt.b_gpus.tolist())
    total = sum(sizes.values())
    return {s: n / total for s, n in sorted(sizes.items())}


def fragmentation(free: int, demand: dict[int, float]) -> float:
    """The GPUs of an offer with ``free`` free that the demand could not use, expected."""
    return sum(w * free for s, w in demand.items() if s > free)


def pack(mkt: Market, assigned: dict[int, list[Part]], pay: dict[tuple[int, int], int], band: int,
         order: list[int]) -> tuple[dict[int, list[Part]], dict[tuple[int, int], int], dict[int, int], float]:
    """The round's placements after packing: (assigned, pay, the offer each moved bid left,
    GPUs of fragmentation saved). ``order``: the bids in priority order; ``band``: base
    units per GPU-hour."""
    if band <= 0 or not assigned:
        return assigned, pay, {}, 0.0
    demand = demand_of(mkt)
    free = mkt.o_gpus.astype(np.int64).copy()
    for placed in assigned.values():
        for o, g, _ in placed:
            free[o] -= g
    by_bucket: dict[tuple[int, int], list[int]] = {}
    for o in range(len(mkt.offers)):
        by_bucket.setdefault((int(mkt.o_model[o]), int(mkt.o_region[o])), []).append(o)
    assigned = {b: list(ps) for b, ps in assigned.items()}
    pay = dict(pay)
    moved: dict[int, int] = {}
    saved = 0.0
    for b in order:
        mine = assigned.get(b)
        if not mine or len(mine) != 1:
            continue
        o, g, _ = mine[0]
        price = pay[(b, o)]
        v0 = mkt.value(b, o)
        stay = fragmentation(int(free[o]), demand)
        best: tuple[float, float, int, int] | None = None
        for o2 in by_bucket[(int(mkt.o_model[o]), int(mkt.o_region[o]))]:
            if o2 == o or free[o2] < g or int(mkt.o_ask[o2]) > price or not mkt.offer_ok(b, o2, check_gpus=False):
                continue
            v2 = mkt.value(b, o2)
            if v2 < v0 - band:
                continue
            delta = (fragmentation(int(free[o]) + g, demand) + fragmentation(int(free[o2]) - g, demand)
                     - stay - fragmentation(int(free[o2]), demand))
            key = (delta, -v2, int(mkt.o_id[o2]), o2)
            if delta < -1e-12 and (best is None or key < best):
                best = key
        if best is None:
            continue
        o2 = best[3]
        score, ok = pair_scores(mkt, np.asarray([b], dtype=np.int64), np.asarray([o2], dtype=np.int64), cap=free + 0)
        if not bool(ok[0, 0]):
            continue
        free[o] += g
        free[o2] -= g
        assigned[b] = [(o2, g, int(score[0, 0]))]
        pay[(b, o2)] = pay.pop((b, o))
        moved[b] = o
        saved -= best[0]
    return assigned, pay, moved, saved
