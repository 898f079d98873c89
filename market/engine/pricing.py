"""What each trade pays.

Uniform clearing price (the default)
------------------------------------
Prices are set per bucket (GPU model x region). Within a bucket let

* ``lo`` = the highest ask among offers that traded,
* ``hi`` = the lowest max price among bids that traded,
* ``ub`` = the highest max price among bids that got nothing but could have
  traded on one of the bucket's offers: every hard constraint holds on it
  (model, region, latency, deadline, price, class, reliability, duration and
  window, and the job's GPUs on one machine - or, for a job that may span
  machines, across the offers that pass) and the buyer values the pair above
  nothing. A bid no offer of the bucket can serve never trades there, so it
  must not move the price: else a shill bid that cannot lose money (say
  ``min_reliability=1.0`` where no offer has it) lifts the price at no risk,
* ``ua`` = the lowest ask among the bucket's offers that sold nothing.

The clearing interval is ``[max(lo, ub + 1), min(hi, ua - 1)]``: every
matched bid can afford any price in it, every matched offer accepts it, no
unmatched bid would have paid it and no unmatched offer would have sold at
it. The price sits at ``RoundConfig.price_point`` within the interval: by
default (0) at its bottom, the lowest price that clears the bucket, so a
buyer never pays more than the market needs and every provider gets at least
its ask (with 0.5 it is the midpoint, a k = 1/2 double auction splitting the
marginal surplus evenly). The bottom matters in thin buckets: a lone buyer
with a generous maximum would otherwise pay halfway up to it.

When the interval is empty, and what each trade pays
----------------------------------------------------
The assignment also weighs latency, carbon, reliability and machine sizes, so
an order can lose, or win, on something other than price, and the interval
is often empty: a servable loser bid more than a winner (``ub >= hi``), or an
unsold offer asked less than a sold one (``ua <= lo``). The bucket price
``P`` is then the same point of ``[lo, hi]``, the interval that keeps every
matched trade individually rational: ``P = lo + int((hi - lo) * price_point)``.

Exactly two cases, then:

* ``lo <= hi`` (always so when the interval is non-empty, as it lies within
  ``[lo, hi]``): every trade of the bucket pays the bucket's price - the
  point of the interval, or ``P`` when the interval is empty - one price.
* ``lo > hi``: a bid that traded has a lower max price than an ask that
  traded (the assignment paired the cheap bid with a cheap offer and the
  dear offer with a generous bid). No single price is then within every
  trade's limits - the trade on the ask ``lo`` needs at least ``lo``, the
  bid with max ``hi`` pays at most ``hi`` - so there is no uniform price to
  be had without undoing trades. ``P`` (in ``[hi, lo]``; ``lo`` by default)
  is published as the bucket's price, and each trade pays ``P`` clamped to
  its own limits: ``min(max(P, its offer's ask), its bid's max price)``. By
  default that is ``min(lo, its bid's max price)``: the bids whose max price
  is below ``lo`` pay their max price, the others pay ``lo``.

In every case no trade pays above its bid's max price nor below its offer's
ask. This is not rare: over the bench families (tests/bench/instances.py,
11 families x 20/60/150/300 orders a side x seeds 0-2, 2,283 traded buckets;
``python -m tests.bench.pricing_rule``) the interval was empty in 54.7% of
traded buckets, ``lo > hi`` held - and trades paid more than one price - in
19.4% (from 2.9% of buckets in the catalogue family to 35% in heavy_tailed),
and 7.6% of trades (1,056 of 13,977) paid other than the bucket's price.
tests/unit/engine/test_pricing_rule.py pins this rule.

Properties: individually rational (every trade pays between its ask and its
max price), budget balanced (the buyer pays exactly what the provider is
paid; the operator neither subsidises nor skims), and - in every bucket
with ``lo <= hi`` - one price for one good in one round, so a bidder who does not set the marginal price cannot change
what it pays by shading its bid. It is not strategy-proof for the marginal
orders - no mechanism is that is also efficient, budget balanced and
individually rational (Myerson-Satterthwaite) - but in a thick market the
marginal order's influence on the price, and so the gain from misreporting,
shrinks towards zero. The assignment maximises reported surplus, so truthful
reports give the efficient allocation.

Spot is priced apart (engine 1.8.0)
-----------------------------------
Spot work may be preempted (issue 31), so it is a different good: within a bucket the
reserved and on-demand trades form one group and the spot trades another, and each group
gets the rule above on its own - its own ``lo`` and ``hi`` from its own trades, its own
``ub`` from its own losing bids - while ``ua`` (the unsold asks) is the bucket's. A spot
job therefore pays what the spot bids set, not the on-demand bids' price: on one 2-GPU
offer at 1.00, an on-demand winner for 1 GPU at up to 3.00 whose losing rival offered 1.90
for both GPUs pays 1.900001, and a spot winner for the other GPU at up to 1.50 pays 1.00
(before, 1.50: the on-demand price clamped to its own max). The
bucket's published price is the first group's, or spot's where only spot traded;
``BucketPrice.spot_price`` is what spot paid.

Pay-as-ask (alternative)
------------------------
Every trade pays its offer's ask. Individually rational and budget balanced,
and buyers keep the whole surplus; but a provider who expects to be marginal
gains by asking above its cost, as in any pay-as-bid market, so asks drift
up over time. The bucket's published price is the highest ask that traded.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .assign import Part
from .market import I64, Market, pair_scores
from .types import CLASSES

SERVABLE_CHUNK = 64  # losing bids checked at once, highest max price first


SPOT_CLASS = CLASSES.index("spot")


@dataclass(frozen=True)
class BucketQuote:
    price: int | None
    best_ask: int | None
    best_bid: int | None
    spot_price: int | None = None  # what spot paid, priced apart; None: no spot trade


def bucket_prices(
    mkt: Market,
    assigned: dict[int, list[Part]],
    bucket_bids: dict[tuple[int, int], list[int]],
    rule: str,
    price_point: float = 0.0,
) -> tuple[dict[tuple[int, int], BucketQuote], dict[tuple[int, int], int]]:
    """Bucket quotes and, per (bid, offer) trade, the price it pays. Spot is priced apart
    (the module's docstring): its own trades, its own losers."""
    spot = mkt.b_klass == SPOT_CLASS
    traded_offers: dict[tuple[int, int, bool], set[int]] = {}
    traded_bids: dict[tuple[int, int, bool], set[int]] = {}
    for b, parts in assigned.items():
        for o, _, _ in parts:
            gk = (int(mkt.o_model[o]), int(mkt.o_region[o]), bool(spot[b]))
            traded_offers.setdefault(gk, set()).add(o)
            traded_bids.setdefault(gk, set()).add(b)
    # offers per bucket: the tier-1 view holds every offer available now
    quotes: dict[tuple[int, int], BucketQuote] = {}
    pay: dict[tuple[int, int], int] = {}
    is_assigned = np.zeros(len(mkt.bids), dtype=np.bool_)
    is_assigned[list(assigned)] = True
    sold = np.zeros(len(mkt.offers), dtype=np.bool_)
    for tos_ in traded_offers.values():
        sold[list(tos_)] = True
    buckets = sorted({(m, r) for (m, r, _) in mkt.views} | set(bucket_bids))
    for key in buckets:
        view = mkt.views.get((key[0], key[1], 1))
        asks = mkt.o_ask[view] if view is not None else np.zeros(0, dtype=np.int64)
        best_ask = int(asks.min()) if len(asks) else None
        wanting = np.asarray(bucket_bids.get(key, []), dtype=np.int64)
        best_bid = int(mkt.b_maxp[wanting].max()) if len(wanting) else None
        prices: dict[bool, int] = {}
        for group in (False, True):
            tos = traded_offers.get((key[0], key[1], group))
            if not tos:
                continue
            tbs = traded_bids[(key[0], key[1], group)]
            lo = max(int(mkt.o_ask[o]) for o in tos)
            hi = min(int(mkt.b_maxp[b]) for b in tbs)
            if rule == "pay_as_ask":
                price = lo
            else:
                losers = wanting[~is_assigned[wanting] & (spot[wanting] == group)]
                losers = losers[mkt.b_maxp[losers] >= lo]  # the others cannot lift the bottom
                ub = _best_servable(mkt, losers, view) if view is not None else -1
                unsold = asks[~sold[view]] if view is not None else asks
                ua = int(unsold.min()) if len(unsold) else None
                low = max(lo, ub + 1)
                high = hi if ua is None else min(hi, ua - 1)
                if low > high:
                    low, high = lo, hi
                # exact for prices below 2**53 base units (the API caps them at 10**15)
                price = low + int((high - low) * price_point)
            prices[group] = price
            for b in sorted(tbs):
                for o, _, _ in assigned[b]:
                    if (int(mkt.o_model[o]), int(mkt.o_region[o])) != key:
                        continue
                    if rule == "pay_as_ask":
                        pay[(b, o)] = int(mkt.o_ask[o])
                    else:
                        pay[(b, o)] = min(max(price, int(mkt.o_ask[o])), int(mkt.b_maxp[b]))
        # the bucket's price is the reserved and on-demand trades'; spot's where only spot traded
        quotes[key] = BucketQuote(prices.get(False, prices.get(True)), best_ask, best_bid, prices.get(True))
    return quotes, pay


def _best_servable(mkt: Market, losers: I64, view: I64) -> int:
    """The highest max price among ``losers`` that could have traded on one of the
    offers of ``view`` (a bucket's offers available now), or -1 for none."""
    order = losers[np.lexsort((mkt.bids_id[losers], -mkt.b_maxp[losers]))]
    for lo in range(0, len(order), SERVABLE_CHUNK):
        bids = order[lo : lo + SERVABLE_CHUNK]
        same = mkt.b_same[bids]
        _, ok = pair_scores(mkt, bids, view, same=True)
        if not same.all():
            # a job that may span machines needs all its GPUs across the offers that pass
            _, ok_multi = pair_scores(mkt, bids, view, same=False)
            enough = (ok_multi * mkt.o_gpus[view][None, :]).sum(axis=1) >= mkt.b_gpus[bids]
            ok = np.where(same[:, None], ok, ok_multi & enough[:, None])
        hit = np.flatnonzero(ok.any(axis=1))
        if len(hit):
            return int(mkt.b_maxp[bids[hit[0]]])
    return -1
