"""Words for buyers: why a bid got nothing, and why an offer won.

Money is written as base units with thousands separators per GPU-hour
("2,400,000/h"); models and regions by their catalogue ids.

For an unmatched bid the engine looks at the offers of the GPU models it
accepts and reports, for each hard constraint, the offers that fail *only*
that constraint - the ones the buyer could reach by relaxing it - with the
nearest such offer. When every constraint passes for some offer, the bid
lost on competition (or the fair-share cap), and it says so.
"""

from __future__ import annotations

import numpy as np

from .market import I64, BoolA, Market


def money(v: int) -> str:
    return f"{v:,}/h"


def _hours(seconds: int) -> str:
    h = seconds / 3600
    return f"{h:g} h" if h < 48 else f"{h / 24:g} days"


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


class Explainer:
    def __init__(self, mkt: Market) -> None:
        self.mkt = mkt
        nr = len(mkt.region_ids)
        key = mkt.o_model * nr + mkt.o_region
        self.order: I64 = np.lexsort((mkt.o_id, mkt.o_ask, key)).astype(np.int64)
        ks = key[self.order]
        nb = len(mkt.model_ids) * nr
        self.start = np.searchsorted(ks, np.arange(nb), side="left")
        self.end = np.searchsorted(ks, np.arange(nb), side="right")
        self._by_models: dict[bytes, I64] = {}

    def _offers(self, buckets: BoolA) -> I64:
        idx = np.flatnonzero(buckets.reshape(-1))
        parts = [self.order[self.start[k] : self.end[k]] for k in idx.tolist()]
        if not parts:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate(parts)

    def unmatched(self, b: int, *, outbid: int, capped: bool) -> tuple[tuple[str, ...], str | None]:
        mkt = self.mkt
        bid = mkt.bids[b]
        g = bid.gpus
        want = (
            ", ".join(bid.gpu_models) if bid.gpu_models else self._spec(bid.min_memory_gib, bid.min_compute_units, bid.vendor)
        )
        reasons: list[str] = []
        if not mkt.b_deadline_ok[b]:
            assert bid.deadline is not None
            reasons.append(
                f"your deadline is {bid.deadline - mkt.now:,} s away but the job runs "
                f"{bid.duration_s:,} s"
            )
        model_ok = mkt.model_ok[b]
        if not model_ok.any():
            reasons.append(f"no GPU model in the catalogue is {want}")
            return tuple(reasons), None
        region_ok = mkt.region_allowed[b]
        lat_ok = mkt.latency_ok[b]
        # bucket level: model ok, then region, then latency
        sig = model_ok.tobytes()
        offs = self._by_models.get(sig)
        if offs is None:
            offs = self._offers(model_ok[:, None] & np.ones_like(region_ok)[None, :])
            self._by_models[sig] = offs
        if len(offs) == 0:
            reasons.append(f"no offers of {want} this round")
            return tuple(reasons), None
        r = mkt.o_region[offs]
        f_region = ~region_ok[r]
        f_lat = ~lat_ok[r]
        dur = bid.duration_s
        f_time = ~(
            (mkt.o_from[offs] <= mkt.now)
            & (mkt.o_until[offs] >= mkt.now + dur)
            & (mkt.o_min_dur[offs] <= dur)
            & (dur <= mkt.o_max_dur[offs])
        )
        k = int(mkt.b_klass[b])
        f_class = (mkt.o_resv[offs] & (k != 0)) | ((k == 2) & ~mkt.o_spot[offs])
        if bid.same_machine:
            f_gpus = mkt.o_gpus[offs] < g
        else:
            f_gpus = np.zeros(len(offs), dtype=np.bool_)
        f_rel = mkt.o_rel[offs] < bid.min_reliability
        f_price = mkt.o_ask[offs] > bid.max_price
        fails = [f_region, f_lat, f_time, f_class, f_gpus, f_rel, f_price]
        nfail = np.zeros(len(offs), dtype=np.int64)
        for f in fails:
            nfail += f
        nearest: str | None = None
        only = [f & (nfail == 1) for f in fails]
        # price first: it is the constraint buyers most often choose to relax
        for i in (6, 1, 0, 4, 5, 2, 3):
            sel = offs[only[i]]
            if len(sel) == 0:
                continue
            text, near = self._reason(b, i, sel)
            reasons.append(text)
            if nearest is None:
                nearest = near
        feasible = offs[nfail == 0]
        if len(feasible):
            if capped:
                reasons.append(
                    "the fair-share cap: you already hold the most one buyer may take "
                    "of this scarce bucket this round"
                )
            elif outbid:
                reasons.append(
                    f"outbid: {_plural(len(feasible), 'offer')} fit your job but were taken "
                    f"by higher-scoring bids (best ask {money(int(mkt.o_ask[feasible].min()))})"
                )
            else:
                reasons.append(
                    f"{_plural(len(feasible), 'offer')} fit, but your latency, region and carbon "
                    f"penalties exceed your price margin on every one"
                )
        elif not any(len(offs[o]) for o in only):
            n = [int(f.sum()) for f in fails]
            worst = max(range(len(n)), key=lambda i: (n[i], -i))
            reasons.append(
                f"{_plural(len(offs), 'offer')} of {want}, but each fails several of your "
                f"constraints (most often: {self._name(worst)})"
            )
        return tuple(reasons), nearest

    def _spec(self, mem: int, cu: float, vendor: str | None) -> str:
        parts = []
        if vendor:
            parts.append(vendor)
        if mem:
            parts.append(f">= {mem} GiB")
        if cu:
            parts.append(f">= {cu:g} compute units")
        return "any GPU " + ", ".join(parts) if parts else "any GPU"

    @staticmethod
    def _name(i: int) -> str:
        return (
            "region",
            "latency",
            "availability window",
            "class rules",
            "GPUs per machine",
            "reliability",
            "price",
        )[i]

    def _describe(self, o: int) -> str:
        mkt = self.mkt
        off = mkt.offers[o]
        return f"offer {off.id}: {off.gpus} x {off.gpu_model} in {off.region} at {money(off.ask)}"

    def _reason(self, b: int, i: int, sel: I64) -> tuple[str, str]:
        mkt = self.mkt
        bid = mkt.bids[b]
        n = len(sel)
        regions = sorted(mkt.region_ids[int(x)] for x in np.unique(mkt.o_region[sel]).tolist())
        where = ", ".join(regions[:3]) + (f" and {len(regions) - 3} more" if len(regions) > 3 else "")
        if i == 6:
            o = int(sel[np.argmin(mkt.o_ask[sel])])
            off = mkt.offers[o]
            text = (
                f"{_plural(n, 'offer')} in {where} fit except on price; cheapest ask "
                f"{money(off.ask)} ({off.gpus} x {off.gpu_model} in {off.region}) is above "
                f"your max {money(bid.max_price)}"
            )
            return text, self._describe(o) + f", {money(off.ask - bid.max_price)} above your max"
        if i == 1:
            lat = mkt.latency[b][mkt.o_region[sel]]
            o = int(sel[np.argmin(lat)])
            text = (
                f"{_plural(n, 'offer')} in {where} at {float(lat.min()):g} ms or more exceed your "
                f"{bid.max_latency_ms:g} ms from {bid.location_region}"
            )
            return text, self._describe(o) + f", {float(mkt.latency[b][mkt.o_region[o]]):g} ms"
        o = int(sel[np.argmin(mkt.o_ask[sel])])
        if i == 0:
            allowed = ", ".join(bid.allowed_regions)
            text = f"{_plural(n, 'offer')} in {where}, outside your allowed regions ({allowed})"
        elif i == 4:
            most = int(mkt.o_gpus[sel].max())
            text = (
                f"{_plural(n, 'offer')} in {where} have fewer than {bid.gpus} free GPUs on one "
                f"machine (largest {most}); allow multi-machine or ask for fewer GPUs"
            )
        elif i == 5:
            best = float(mkt.o_rel[sel].max())
            text = (
                f"{_plural(n, 'offer')} in {where} are below your minimum reliability "
                f"{bid.min_reliability:g} (best {best:g})"
            )
        elif i == 2:
            text = (
                f"{_plural(n, 'offer')} in {where} are not available for {_hours(bid.duration_s)} "
                f"from now (their window or duration limits)"
            )
        else:
            what = "are reserved-only" if bid.klass != "reserved" else "do not allow spot"
            if bid.klass == "spot":
                what = "do not take spot bids or are reserved-only"
            text = f"{_plural(n, 'offer')} in {where} {what}"
        return text, self._describe(o)


def trade_reason(mkt: Market, b: int, o: int, rank_of: int, score: int) -> str:
    off = mkt.offers[o]
    bid = mkt.bids[b]
    bits = [f"ask {money(off.ask)} within your max {money(bid.max_price)}"]
    if bid.location_region is not None:
        bits.append(f"{float(mkt.latency[b][mkt.o_region[o]]):g} ms from {bid.location_region}")
    if bid.preferred_regions:
        pref = "preferred" if off.region in bid.preferred_regions else "not preferred"
        bits.append(f"{off.region} {pref}")
    bits.append(f"reliability {off.reliability:g}")
    lead = "best-scoring feasible offer" if rank_of == 0 else "best feasible offer with room left"
    return f"{lead} (score {score:,}): " + ", ".join(bits)
