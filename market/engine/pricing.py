"""What each trade pays.

Uniform clearing price (the default)
------------------------------------
Prices are set per bucket (GPU model x region). Within a bucket let

* ``lo`` = the highest ask among offers that traded,
* ``hi`` = the lowest max price among bids that traded,
* ``ub`` = the highest max price among bids that could use the bucket (model,
  region and latency allow it) but got nothing,
* ``ua`` = the lowest ask among the bucket's offers that sold nothing.

The clearing interval is ``[max(lo, ub + 1), min(hi, ua - 1)]``: every
matched bid can afford any price in it, every matched offer accepts it, no
unmatched bid would have paid it and no unmatched offer would have sold at
it. The price sits at ``RoundConfig.price_point`` within the interval: by
default (0) at its bottom, the lowest price that clears the bucket, so a
buyer never pays more than the market needs and every provider gets at least
its ask (with 0.5 it is the midpoint, a k = 1/2 double auction splitting the
marginal surplus evenly). The bottom matters in thin buckets: a lone buyer
with a generous maximum would otherwise pay halfway up to it. Because
the assignment also weighs latency, carbon, reliability and machine sizes, an
unmatched bid can have a higher max price than a matched one (it lost on
something other than price); the interval is then empty, and the price is
the same point of ``[lo, hi]`` - the interval that keeps every matched trade
individually rational. In the rare case where even that is empty, each trade
pays the bucket price clamped to ``[its offer's ask, its bid's max price]``.

Properties: individually rational (every trade pays between its ask and its
max price), budget balanced (the buyer pays exactly what the provider is
paid; the operator neither subsidises nor skims), and one price for one good
in one round, so a bidder who does not set the marginal price cannot change
what it pays by shading its bid. It is not strategy-proof for the marginal
orders - no mechanism is that is also efficient, budget balanced and
individually rational (Myerson-Satterthwaite) - but in a thick market the
marginal order's influence on the price, and so the gain from misreporting,
shrinks towards zero. The assignment maximises reported surplus, so truthful
reports give the efficient allocation.

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
from .market import Market


@dataclass(frozen=True)
class BucketQuote:
    price: int | None
    best_ask: int | None
    best_bid: int | None


def bucket_prices(
    mkt: Market,
    assigned: dict[int, list[Part]],
    bucket_bids: dict[tuple[int, int], list[int]],
    rule: str,
    price_point: float = 0.0,
) -> tuple[dict[tuple[int, int], BucketQuote], dict[tuple[int, int], int]]:
    """Bucket quotes and, per (bid, offer) trade, the price it pays."""
    traded_offers: dict[tuple[int, int], set[int]] = {}
    traded_bids: dict[tuple[int, int], set[int]] = {}
    for b, parts in assigned.items():
        for o, _, _ in parts:
            key = (int(mkt.o_model[o]), int(mkt.o_region[o]))
            traded_offers.setdefault(key, set()).add(o)
            traded_bids.setdefault(key, set()).add(b)
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
        tos = traded_offers.get(key)
        if not tos:
            quotes[key] = BucketQuote(None, best_ask, best_bid)
            continue
        tbs = traded_bids[key]
        lo = max(int(mkt.o_ask[o]) for o in tos)
        hi = min(int(mkt.b_maxp[b]) for b in tbs)
        if rule == "pay_as_ask":
            price = lo
        else:
            losers = wanting[~is_assigned[wanting]]
            ub = int(mkt.b_maxp[losers].max()) if len(losers) else -1
            unsold = asks[~sold[view]] if view is not None else asks
            ua = int(unsold.min()) if len(unsold) else None
            low = max(lo, ub + 1)
            high = hi if ua is None else min(hi, ua - 1)
            if low > high:
                low, high = lo, hi
            # exact for prices below 2**53 base units (the API caps them at 10**15)
            price = low + int((high - low) * price_point)
        quotes[key] = BucketQuote(price, best_ask, best_bid)
        for b in sorted(tbs):
            for o, _, _ in assigned[b]:
                if (int(mkt.o_model[o]), int(mkt.o_region[o])) != key:
                    continue
                if rule == "pay_as_ask":
                    pay[(b, o)] = int(mkt.o_ask[o])
                else:
                    pay[(b, o)] = min(max(price, int(mkt.o_ask[o])), int(mkt.b_maxp[b]))
    return quotes, pay
