"""Words for buyers: why a bid got nothing, and why an offer won.

Prices are written as people read them, in USDC per GPU-hour ("2.40 USDC/GPU-h",
the same text as market/money.py writes; the engine may import nothing of ours, so the
few lines are repeated here and a test holds the two equal); models and regions by
their catalogue ids.

For an unmatched bid the engine looks at the offers of the GPU models it
accepts and reports, for each hard constraint, the offers that fail *only*
that constraint - the ones the buyer could reach by relaxing it - with the
nearest such offer. When every constraint passes for some offer, the bid
lost on competition (or the fair-share cap), and it says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from .market import CHUNK_CELLS, F64, I64, BoolA, Market

TOKEN = 10**6  # the stablecoin's base units per USDC


def money(v: int) -> str:
    """A price in base units per GPU-hour as USDC per GPU-hour: 2_400_000 -> '2.40 USDC/GPU-h'."""
    whole, frac = divmod(abs(int(v)), TOKEN)
    digits = f"{frac:06d}".rstrip("0").ljust(2, "0")
    return f"{'-' if v < 0 else ''}{whole:,}.{digits} USDC/GPU-h"


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
        return self.unmatched_many([b], [outbid], [capped])[0]

    def unmatched_many(
        self, bids: list[int], outbid: list[int], capped: list[bool]
    ) -> list[tuple[tuple[str, ...], str | None]]:
        """Reasons for many unmatched bids at once: bids that accept the same
        GPU models share one offer list, and each constraint is checked for a
        block of them against all those offers with numpy."""
        mkt = self.mkt
        out: list[tuple[tuple[str, ...], str | None]] = [((), None)] * len(bids)
        groups: dict[bytes, list[int]] = {}
        for j, b in enumerate(bids):
            groups.setdefault(mkt.model_ok[b].tobytes(), []).append(j)
        nr = len(mkt.region_ids)
        for sig, js in groups.items():
            model_ok = mkt.model_ok[bids[js[0]]]
            offs = self._by_models.get(sig)
            if offs is None:
                offs = self._offers(model_ok[:, None] & np.ones(nr, dtype=np.bool_)[None, :])
                self._by_models[sig] = offs
            step = max(1, CHUNK_CELLS // max(1, len(offs)))
            for lo in range(0, len(js), step):
                part = js[lo : lo + step]
                rows = self._block(np.asarray([bids[j] for j in part], dtype=np.int64), offs, bool(model_ok.any()),
                                   [outbid[j] for j in part], [capped[j] for j in part])
                for j, row in zip(part, rows, strict=True):
                    out[j] = row
        return out

    def _block(
        self, bs: I64, offs: I64, any_model: bool, outbid: list[int], capped: list[bool]
    ) -> list[tuple[tuple[str, ...], str | None]]:
        mkt = self.mkt
        res: list[tuple[tuple[str, ...], str | None]] = []
        heads: list[list[str]] = []
        for b in bs.tolist():
            bid = mkt.bids[b]
            head: list[str] = []
            if not mkt.b_deadline_ok[b]:
                assert bid.deadline is not None
                head.append(
                    f"your deadline is {bid.deadline - mkt.now:,} s away but the job runs "
                    f"{bid.duration_s:,} s"
                )
            heads.append(head)
        if not any_model or len(offs) == 0:
            for b, head in zip(bs.tolist(), heads, strict=True):
                want = self._want(b)
                head.append(f"no GPU model in the catalogue is {want}" if not any_model else f"no offers of {want} this round")
                res.append((tuple(head), None))
            return res
        r = mkt.o_region[offs]
        f_region = ~mkt.region_allowed[bs][:, r]
        f_lat = ~mkt.latency_ok[bs][:, r]
        dur = mkt.b_dur[bs][:, None]
        # the durations an offer takes: from its minimum to the shorter of its
        # maximum and what is left of its window (none before it opens)
        longest = np.where(mkt.o_from[offs] <= mkt.now,
                           np.minimum(mkt.o_max_dur[offs], mkt.o_until[offs] - mkt.now), -1)
        span = mkt.b_span[bs][:, None]  # a backfilled spot bid's window need is its p90
        f_time = (dur < mkt.o_min_dur[offs][None, :]) | (dur > mkt.o_max_dur[offs][None, :]) | (span > longest[None, :])
        resv = mkt.o_resv[offs]
        lent = mkt.o_spotonly[offs]
        by_class = np.stack([lent, resv | lent, resv | ~mkt.o_spot[offs]])
        f_class = by_class[mkt.b_klass[bs]]
        f_gpus = mkt.b_same[bs][:, None] & (mkt.o_gpus[offs][None, :] < mkt.b_gpus[bs][:, None])
        f_gpus |= mkt.b_nvl[bs][:, None] & (mkt.o_nvl[offs][None, :] < mkt.b_gpus[bs][:, None])
        f_rel = mkt.o_rel[offs][None, :] < mkt.b_minrel[bs][:, None]
        f_price = mkt.o_ask[offs][None, :] > mkt.b_maxp[bs][:, None]
        f_runtime = (mkt.b_cont[bs][:, None] & ~mkt.o_cont[offs][None, :]) | (mkt.b_ports[bs][:, None] & ~mkt.o_ports[offs][None, :])
        f_host = np.zeros(f_region.shape, dtype=np.bool_)
        need = mkt.b_hostneed[bs]
        if need.any():
            f_host[need] = (mkt.o_host[offs][None, :, :] < mkt.b_host[bs[need]][:, None, :]).any(axis=2)
        fails = [f_region, f_lat, f_time, f_class, f_gpus, f_rel, f_price, f_runtime, f_host]
        nfail = np.zeros(f_region.shape, dtype=np.int8)
        for f in fails:
            nfail += f
        one = nfail == 1
        # offers come grouped by bucket, so "any such offer in region r" is an OR
        # over each bucket's run of columns, then over the buckets of r
        seg = np.flatnonzero(np.r_[True, (mkt.o_model[offs][1:] != mkt.o_model[offs][:-1]) | (r[1:] != r[:-1])])
        seg_region = r[seg]
        big = np.iinfo(np.int64).max
        asks = mkt.o_ask[offs][None, :]
        stats: dict[int, tuple[I64, BoolA, I64, F64]] = {}
        for i in (6, 1, 0, 4, 5, 2, 3, 7, 8):
            only = fails[i] & one
            n = only.sum(axis=1)
            if not n.any():
                continue
            where = np.zeros((len(bs), len(mkt.region_ids)), dtype=np.bool_)
            any_seg = np.logical_or.reduceat(only, seg, axis=1)
            for k, reg in enumerate(seg_region.tolist()):
                where[:, reg] |= any_seg[:, k]
            if i == 1:
                lat = np.where(only, mkt.latency[bs][:, r], np.inf)
                pick = lat.argmin(axis=1)
                extra = lat[np.arange(len(bs)), pick]
            else:
                pick = np.where(only, asks, big).argmin(axis=1)
                if i == 4:
                    room = np.where(mkt.b_nvl[bs][:, None], mkt.o_nvl[offs][None, :], mkt.o_gpus[offs][None, :])
                    extra = np.where(only, room, 0).max(axis=1).astype(np.float64)
                elif i == 5:
                    extra = np.where(only, mkt.o_rel[offs][None, :], -1.0).max(axis=1)
                else:
                    extra = np.zeros(len(bs))
            stats[i] = (n, where, offs[pick], extra)
        feas = nfail == 0
        n_feas = feas.sum(axis=1)
        best_ask = np.where(feas, asks, big).min(axis=1)
        for row, b in enumerate(bs.tolist()):
            reasons = heads[row]
            nearest: str | None = None
            any_only = False
            for i in (6, 1, 0, 4, 5, 2, 3, 7, 8):
                st = stats.get(i)
                if st is None or not st[0][row]:
                    continue
                any_only = True
                regions = [mkt.region_ids[x] for x in np.flatnonzero(st[1][row]).tolist()]
                text, near = self._reason(b, i, int(st[0][row]), regions, int(st[2][row]), float(st[3][row]))
                reasons.append(text)
                if nearest is None:
                    nearest = near
            nf = int(n_feas[row])
            if nf and not mkt.b_deadline_ok[b]:
                # competition and penalties never came into it: the deadline ruled the bid out
                reasons.append(f"{_plural(nf, 'offer')} would fit your job with a later deadline")
            elif nf:
                if capped[row]:
                    reasons.append(
                        "the fair-share cap: you already hold the most one buyer may take "
                        "of this scarce bucket this round"
                    )
                elif outbid[row]:
                    reasons.append(
                        f"outbid: {_plural(nf, 'offer')} fit your job but were taken "
                        f"by higher-scoring bids (best ask {money(int(best_ask[row]))})"
                    )
                else:
                    reasons.append(
                        f"{_plural(nf, 'offer')} fit, but your latency, region and carbon "
                        f"penalties exceed your price margin on every one"
                    )
            elif not any_only:
                n = [int(f[row].sum()) for f in fails]
                worst = max(range(len(n)), key=lambda i: (n[i], -i))
                reasons.append(
                    f"{_plural(len(offs), 'offer')} of {self._want(b)}, but each fails several of your "
                    f"constraints (most often: {self._name(worst)})"
                )
            res.append((tuple(reasons), nearest))
        return res

    def _want(self, b: int) -> str:
        bid = self.mkt.bids[b]
        if bid.gpu_models:
            return ", ".join(bid.gpu_models)
        return self._spec(bid.min_memory_gib, bid.min_compute_units, bid.vendor)

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
            "container runtime",
            "host (CUDA, RAM, disk, bandwidth)",
        )[i]

    def _describe(self, o: int) -> str:
        mkt = self.mkt
        off = mkt.offers[o]
        return f"offer {off.id}: {off.gpus} x {off.gpu_model} in {off.region} at {money(off.ask)}"

    def _reason(self, b: int, i: int, n: int, regions: list[str], o: int, extra: float) -> tuple[str, str]:
        mkt = self.mkt
        bid = mkt.bids[b]
        where = ", ".join(regions[:3]) + (f" and {len(regions) - 3} more" if len(regions) > 3 else "")
        off = mkt.offers[o]
        if i == 6:
            text = (
                f"{_plural(n, 'offer')} in {where} fit except on price; cheapest ask "
                f"{money(off.ask)} ({off.gpus} x {off.gpu_model} in {off.region}) is above "
                f"your max {money(bid.max_price)}"
            )
            return text, self._describe(o) + f", {money(off.ask - bid.max_price)} above your max"
        if i == 1:
            if bid.max_latency_ms is None or not math.isfinite(extra):
                # no row measures the way there: a bid placed from a location needs one
                text = (
                    f"{_plural(n, 'offer')} in {where}, but no latency from your location "
                    f"{bid.location_region} to {where} is known"
                )
                return text, self._describe(o) + ", latency unknown"
            text = (
                f"{_plural(n, 'offer')} in {where} at {extra:g} ms or more exceed your "
                f"{bid.max_latency_ms:g} ms from {bid.location_region}"
            )
            return text, self._describe(o) + f", {extra:g} ms"
        if i == 0:
            allowed = ", ".join(bid.allowed_regions)
            text = f"{_plural(n, 'offer')} in {where}, outside your allowed regions ({allowed})"
        elif i == 4 and bid.needs_nvlink:
            text = (
                f"{_plural(n, 'offer')} in {where} have fewer than {bid.gpus} free GPUs in one NVLink "
                f"domain (largest {int(extra)}); accept interconnect same-machine or ask for fewer GPUs"
            )
        elif i == 4:
            text = (
                f"{_plural(n, 'offer')} in {where} have fewer than {bid.gpus} free GPUs on one "
                f"machine (largest {int(extra)}); allow multi-machine or ask for fewer GPUs"
            )
        elif i == 5:
            text = (
                f"{_plural(n, 'offer')} in {where} are below your minimum reliability "
                f"{bid.min_reliability:g} (best {extra:g})"
            )
        elif i == 2:
            text = (
                f"{_plural(n, 'offer')} in {where} are not available for {_hours(bid.duration_s)} "
                f"from now (their window or duration limits)"
            )
        elif i == 7:
            if bid.needs_ports:
                text = (
                    f"{_plural(n, 'offer')} in {where} cannot publish ports (a docker or podman "
                    f"runtime and a public host): your job publishes ports or SSH"
                )
            else:
                text = (
                    f"{_plural(n, 'offer')} in {where} run jobs as plain processes: your job is a "
                    f"container image with no command, which needs a docker or podman runtime"
                )
        elif i == 8:
            short = [
                f"{label} {fmt(need)} or more (the cheapest has {fmt(have) if have else 'none reported'})"
                for label, fmt, need, have in zip(
                    ("CUDA", "RAM", "free disk", "download"), _HOST_FORMATS,
                    (bid.min_cuda, bid.min_ram_gib, bid.min_disk_gb, bid.min_net_down_mbps),
                    (off.cuda, off.ram_gib, off.disk_gb, off.net_down_mbps), strict=True)
                if need > have
            ]
            text = f"{_plural(n, 'offer')} in {where} fall short of the host your job needs: " + "; ".join(short)
        else:
            what = "are reserved-only" if bid.klass != "reserved" else "do not allow spot"
            if bid.klass == "spot":
                what = "do not take spot bids or are reserved-only"
            elif off.spot_only:
                what = "are lent by owners who take them back when they need them (spot bids only)"
            text = f"{_plural(n, 'offer')} in {where} {what}"
        return text, self._describe(o)


def cuda_text(code: int) -> str:
    """A CUDA version from its code (major x 100 + minor): 1204 is '12.4'."""
    return f"{code // 100}.{code % 100}"


def _gib(v: int) -> str:
    return f"{v:,} GiB"


def _gb(v: int) -> str:
    return f"{v:,} GB"


def _mbps(v: int) -> str:
    return f"{v:,} Mbit/s"


# how each host column (market.HOST_COLUMNS) reads in an explanation
_HOST_FORMATS: tuple[Callable[[int], str], ...] = (cuda_text, _gib, _gb, _mbps)


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
