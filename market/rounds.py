"""Auction rounds around the pure engine: claim, snapshot, clear, write; replay; quote.

One round clears at a time per market: a round holds the market's round lock
(`_round_lock`) from before it reads the book until its result is written, and a
beat tick that finds it held returns at once, its slot skipped. Missed slots are
never caught up; the round that ran through them counts them in its stats
(`skipped_slots`), and the operator page shows it. A round is claimed by
inserting its schedule slot under a unique constraint, so a beat tick delivered
twice clears it once. The book is read in one transaction, the engine runs
outside any transaction, and the result is written in one more, re-checking
under row locks that every matched bid is still open and every offer still has
the GPUs: a bid cancelled while the engine ran is dropped from the result, never
half-written.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg
from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Max, Q
from django.utils import timezone

from market import (
    bookings,
    bulk,
    engine,
    estimates,
    funding,
    grid_carbon,
    predictions,
    repository,
    selectors,
    states,
)
from market import jobs as jobs_
from market.engine import serialize
from market.errors import Conflict, NotFound
from market.events import BidChanged, OperatorChanged, RoundCleared, TradesMatched, announce
from market.models import AuctionRound, Bid, Job, Offer, Trade, User
from market.states import BidState, OfferState, RoundState
from market.stopwatch import StageTimes
from market.streams.publish import batched
from providers.models import Provider
from providers.push import machines_wake

log = logging.getLogger("gridbid.rounds")
QUOTE_BID_ID = 2**62  # a hypothetical bid's id: far above any real row
# PostgreSQL's advisory locks are per database, and a database holds one market: one fixed key
ROUND_LOCK_KEY = int.from_bytes(b"gbrounds", "big")
_process_round_lock = threading.Lock()


def slot_for(when: datetime) -> int:
    return int(when.timestamp() // settings.GRIDBID["ROUND_SECONDS"])


@contextmanager
def _round_lock() -> Iterator[bool]:
    """Hold the market's round lock for the block; yields False at once when another round holds it.

    PostgreSQL: a session advisory lock, taken on a connection of its own rather than the
    pooled one the round uses (the pool keeps session state: a lock left on a connection
    it hands out again would stop every other worker's rounds). Every worker process on
    every machine sees it, and it goes with the connection when its worker dies, so no
    lease has to run out first. The embedded SQLite mode runs every worker in one process:
    a lock of that process is enough there."""
    if connection.vendor != "postgresql":
        held = _process_round_lock.acquire(blocking=False)
        try:
            yield held
        finally:
            if held:
                _process_round_lock.release()
        return
    with psycopg.connect(**connection.get_connection_params(), autocommit=True) as lock_conn:
        row = lock_conn.execute("SELECT pg_try_advisory_lock(%s)", [ROUND_LOCK_KEY]).fetchone()
        yield bool(row and row[0])  # closing the connection releases it, whatever the round did


def slots_behind(*, clock: datetime, now: datetime) -> int:
    """Whole schedule slots between a round's clock and `now`: a round that finishes this far
    behind ran through them, and the beat's ticks in them found it clearing and were skipped."""
    return max(0, int((now - clock).total_seconds() // settings.GRIDBID["ROUND_SECONDS"]))


def _behind_logged(rnd: AuctionRound, *, now: datetime) -> int:
    skipped = slots_behind(clock=rnd.scheduled_for, now=now)
    if skipped:
        log.warning("round %s finished %d slot(s) behind its clock (%.1f s against ROUND_SECONDS=%s): no round ran in them",
                    rnd.number, skipped, (now - rnd.scheduled_for).total_seconds(), settings.GRIDBID["ROUND_SECONDS"])
    return skipped


def _claim(*, slot: int | None, when: datetime) -> AuctionRound | None:
    lease = timezone.now() + timedelta(seconds=settings.GRIDBID["ROUND_LEASE_SECONDS"])
    try:
        with transaction.atomic():
            number = (AuctionRound.objects.aggregate(n=Max("number"))["n"] or 0) + 1
            return AuctionRound.objects.create(number=number, slot=slot, scheduled_for=when, lease_expires_at=lease,
                                               engine_version=engine.ENGINE_VERSION)
    except IntegrityError:
        return None  # another worker (or an earlier delivery of this tick) has it


def rounds_recover(*, now: datetime | None = None) -> int:
    """Fail every round still `clearing` past its lease: the worker that claimed it died
    (killed mid-clearing, its machine lost), and nothing else would ever finish it. Its
    bids are untouched, so the next round takes them. Returns how many were failed."""
    now = now or timezone.now()
    stale = AuctionRound.objects.filter(state=RoundState.CLEARING, lease_expires_at__lt=now)
    dead = list(stale.values_list("number", flat=True))
    if not dead:
        return 0
    failed = stale.update(
        state=RoundState.FAILED,
        error="The worker clearing this round stopped before it finished (its lease expired); the next round took its bids.",
    )
    log.warning("rounds %s were left clearing past their lease; marked failed", dead)
    announce(OperatorChanged())
    return failed


def _span(seconds: int) -> str:
    """A length of time as a buyer reads it: '30 days', '24 h', '90 min', '45 s'."""
    if seconds % 86400 == 0 and seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


def _expiry_reason(bid: Bid, *, now: datetime) -> str | None:
    """Why an open bid leaves the book now, or None while it may still trade."""
    if bid.expires_at <= now:
        return (f"This bid expired unmatched at {bid.expires_at:%Y-%m-%d %H:%M:%S} UTC and left the book; its escrow is no longer held for it. "
                f"Place a new bid if you still want the GPUs; a bid waits in the book for at most {_span(settings.CONFIG.bid_ttl_max_s)}.")
    if bid.deadline is not None and bid.deadline <= now + timedelta(seconds=bid.duration_s):
        return (f"This bid's deadline ({bid.deadline:%Y-%m-%d %H:%M:%S} UTC) can no longer be met for its {bid.duration_s} s duration, so it left "
                f"the book; its escrow is no longer held for it. Place a new bid with a later deadline if you still want the GPUs.")
    return None


def bids_expire(*, now: datetime | None = None) -> list[int]:
    """Take out of the book, as `expired`, the open bids past their `expires_at` and those whose
    deadline can no longer be met; each keeps the reason (and what its last round said) as its
    explanation. Claimed under row locks, so a round and the periodic task expire a bid once
    and never one a round matched meanwhile. Returns the ids expired."""
    now = now or timezone.now()
    # a deadline is due when it is closer than the bid's duration: read unlocked, lock only those
    late = [pk for pk, deadline, duration_s in Bid.objects.filter(state=BidState.OPEN, deadline__isnull=False, expires_at__gt=now)
            .values_list("id", "deadline", "duration_s") if deadline <= now + timedelta(seconds=duration_s)]
    expired: list[int] = []
    with transaction.atomic():
        for bid in Bid.objects.select_for_update(skip_locked=True).filter(Q(expires_at__lte=now) | Q(pk__in=late), state=BidState.OPEN).order_by("id"):
            reason = _expiry_reason(bid, now=now)
            if reason is None:
                continue
            before = bid.explanation or {}
            states.advance("bid", bid, BidState.EXPIRED)
            bid.explanation = {"round": before.get("round"), "matched": False, "expired": True, "reasons": [reason],
                               "last_reasons": list(before.get("reasons") or []), "nearest": before.get("nearest")}
            bid.save(update_fields=["state", "explanation", "updated_at"])
            announce(BidChanged(bid_id=bid.pk, user_id=bid.buyer_id))
            expired.append(bid.pk)
    if expired:
        log.info("bids expired: %s", expired)
    return expired


def _set_aside(*, rnd: AuctionRound, aside: tuple[engine.SetAside, ...]) -> dict[str, list[int]]:
    """Tell each owner why the engine could not take their order this round: a bid keeps its
    place in the book with the reason as its explanation; an offer is paused (`limits`), so
    its provider sees it stopped selling and can reprice it."""
    offers = sorted({a.id for a in aside if a.kind == "offer" and a.id is not None})
    reasons: dict[int, list[str]] = {}
    for a in aside:
        if a.kind == "bid" and a.id is not None:
            reasons.setdefault(a.id, []).append(
                f"The market cannot take this bid: {a.field} {a.message}. Cancel it and place one within the limits."
            )
    bids = sorted(reasons)
    with transaction.atomic():
        for bid in Bid.objects.select_for_update().filter(pk__in=bids, state=BidState.OPEN):
            bid.explanation = {"round": rnd.number, "matched": False, "set_aside": True, "reasons": reasons[bid.pk], "nearest": None}
            bid.save(update_fields=["explanation"])
        Offer.objects.filter(pk__in=offers, state=OfferState.OPEN).update(state=OfferState.PAUSED, paused_by="limits", updated_at=timezone.now())
    if aside:
        log.warning("round %s set aside %d order(s) the engine cannot take: %s", rnd.number, len(aside),
                    "; ".join(f"{a.kind} {a.id} {a.field}: {a.message}" for a in aside[:10]))
    return {"bids": bids, "offers": offers}


def _unfunded_left_out(*, rnd: AuctionRound, inp: engine.RoundInput) -> tuple[engine.RoundInput, list[int]]:
    """Leave out of the round the bids their buyers' escrow no longer covers (a withdrawal
    since they were placed): each keeps its place in the book, with the shortfall as its
    explanation, and takes part again once the buyer deposits."""
    uncovered = funding.bids_uncovered((b.id, b.buyer_id, b.max_price, b.gpus, b.duration_s) for b in inp.bids)
    if not uncovered:
        return inp, []
    with transaction.atomic():
        for bid in Bid.objects.select_for_update().filter(pk__in=list(uncovered), state=BidState.OPEN):
            bid.explanation = {"round": rnd.number, "matched": False, "unfunded": True, "reasons": [uncovered[bid.pk]], "nearest": None}
            bid.save(update_fields=["explanation"])
    return dataclasses.replace(inp, bids=tuple(b for b in inp.bids if b.id not in uncovered)), sorted(uncovered)


def _deferred_left_out(*, rnd: AuctionRound, inp: engine.RoundInput, now: datetime) -> tuple[engine.RoundInput, list[int]]:
    """Hold back the deferrable bids that wait for a cleaner hour (``grid_carbon.deferrals``):
    each keeps its place in the book, with the hour it waits for as its explanation, and is
    asked again next round; from its ``deferrable_until`` on it bids as any other."""
    latest = dict(Bid.objects.filter(state=BidState.OPEN, deferrable_until__gt=now).values_list("pk", "deferrable_until"))
    if not latest:
        return inp, []
    waits = grid_carbon.deferrals(inp, latest, now)
    if not waits:
        return inp, []
    with transaction.atomic():
        for bid in Bid.objects.select_for_update().filter(pk__in=list(waits), state=BidState.OPEN):
            bid.explanation = {"round": rnd.number, "matched": False, "nearest": None, **grid_carbon.wait_explanation(waits[bid.pk])}
            bid.save(update_fields=["explanation"])
    return dataclasses.replace(inp, bids=tuple(b for b in inp.bids if b.id not in waits)), sorted(waits)


def round_clear(*, now: datetime | None = None, slot: int | None = None) -> AuctionRound | None:
    """Run one round at `now`. Returns the round, or None if another round is clearing
    (this slot is skipped: rounds never overlap, nor catch up), the slot was already taken,
    or the book has no open bid (nothing could trade; no empty row is written).

    Orders the engine cannot take are set aside with their reasons (`_set_aside`) and the
    round clears the rest: one bad order never fails the round for everyone."""
    now = now or timezone.now()
    with _round_lock() as held:
        if not held:
            log.info("a round is clearing: slot %s skipped", slot_for(now) if slot is None else slot)
            return None
        return _round_clear_locked(now=now, slot=slot)


ROUND_PHASES = ("prepare", "snapshot", "left out", "engine", "trades", "bookings", "explanations", "record")
"""The phases of a round around the engine, in order, timed into its stats (``round_ms``):
``prepare`` (recovery, reclaims, backfills, expiry, the claim), ``snapshot`` (the book read
from the database), ``left out`` (orders set aside, unfunded or waiting for cleaner power),
``engine`` (``clear_ms``, its own stages in ``stage_ms``), and the write: ``trades``
(locks, the bookings' GPUs chosen, trades inserted), ``bookings`` (held GPUs, jobs, the
agents woken, preemptions, capacity), ``explanations`` (every bid's) and ``record`` (the
round row's inputs and result). What follows the record, the commit and the publishing
its events do once it commits (``announce``'s after-commit handlers: streams, webhooks),
is the rest of the round's wall time, which ``make bench``'s ``bench_round.py`` reports."""


def _round_clear_locked(*, now: datetime, slot: int | None) -> AuctionRound | None:
    phases = StageTimes()
    rounds_recover()
    jobs_.offers_reclaim_due(now=now)  # lent offers in their reclaim hours are out of the book it reads
    jobs_.backfills_due(now=now)  # backfilled jobs still running when their offer's window closed
    expired = bids_expire(now=now)  # out of the book before the round reads it
    if not Bid.objects.filter(state=BidState.OPEN).exists():
        return None
    rnd = _claim(slot=slot_for(now) if slot is None else slot, when=now)
    if rnd is None:
        return None
    phases.lap("prepare")
    try:
        book = repository.snapshot(now=now)
        phases.lap("snapshot")
        inp, aside = engine.screen(book)
        inp, unfunded = _unfunded_left_out(rnd=rnd, inp=inp)
        inp, deferred = _deferred_left_out(rnd=rnd, inp=inp, now=now)
        set_aside = {**_set_aside(rnd=rnd, aside=aside), "unfunded_bids": unfunded, "expired_bids": expired, "deferred_bids": deferred}
        phases.lap("left out")
        started = time.perf_counter()
        stages = StageTimes()
        result = engine.clear_round(inp, stopwatch=stages, workers=settings.GRIDBID.get("ENGINE_WORKERS", 1))
        elapsed_ms = round(1000 * (time.perf_counter() - started), 2)
        phases.lap("engine")
    except Exception as exc:  # the round itself is broken (catalogue, config) or the engine crashed: record it
        log.exception("round %s failed", rnd.number)
        AuctionRound.objects.filter(pk=rnd.pk).update(state=RoundState.FAILED, error=f"{type(exc).__name__}: {exc}"[:2000],
                                                      stats={"skipped_slots": _behind_logged(rnd, now=timezone.now())})
        announce(OperatorChanged())
        return AuctionRound.objects.get(pk=rnd.pk)
    # what the write publishes once it commits (the round, its trades, the jobs it preempts)
    # goes out in one batch (issue 39)
    with batched():
        _write(rnd=rnd, inp=inp, result=result, elapsed_ms=elapsed_ms, stage_ms=stages.ms(), set_aside=set_aside, phases=phases)
    # its stored input and result (megabytes at 10k orders) load only if a caller reads them
    return AuctionRound.objects.defer("inputs", "result").get(pk=rnd.pk)


@transaction.atomic
def _write(*, rnd: AuctionRound, inp: engine.RoundInput, result: engine.RoundResult, elapsed_ms: float,
           stage_ms: dict[str, float], set_aside: dict[str, list[int]] | None = None, phases: StageTimes | None = None) -> None:
    phases = phases or StageTimes()
    bid_ids = sorted({t.bid_id for t in result.trades})
    offer_ids = sorted({t.offer_id for t in result.trades})
    bids = {b.pk: b for b in Bid.objects.select_for_update().filter(pk__in=bid_ids)}
    offers = {o.pk: o for o in Offer.objects.select_for_update().filter(pk__in=offer_ids).order_by("id")}
    bookings.capacity_refresh(offer_ids=offer_ids)  # exact under the lock: what ended since the snapshot came back
    free = dict(Offer.objects.filter(pk__in=offer_ids).values_list("id", "gpus_free"))
    providers = {p.pk: p for p in Provider.objects.filter(pk__in={t.provider_id for t in result.trades})}
    by_bid: dict[int, list[engine.Trade]] = {}
    for t in result.trades:
        by_bid.setdefault(t.bid_id, []).append(t)
    dropped: list[int] = []
    trades: list[Trade] = []
    # the GPUs each trade will be booked on, chosen in the order the bookings are made: a bid
    # that needs NVLink and finds no domain left whole (another trade of the round took part) waits
    gpus = bookings.free_gpus(offers.values())
    picks: dict[tuple[int, int], list[int]] = {}  # (bid, offer) -> the GPU indexes its booking holds
    for bid_id, parts in sorted(by_bid.items()):
        bid = bids.get(bid_id)
        still_ok = bid is not None and bid.state == BidState.OPEN and all(
            offers[p.offer_id].state == OfferState.OPEN and free[p.offer_id] >= p.gpus for p in parts
        )
        if still_ok:
            assert bid is not None
            trial = {p.offer_id: list(gpus[p.offer_id]) for p in parts}
            chosen: dict[tuple[int, int], list[int]] = {}
            try:
                for p in parts:
                    picked = bookings.gpus_pick(trial[p.offer_id], p.gpus, one_domain=bid.needs_nvlink)
                    chosen[(bid_id, p.offer_id)] = picked
                    taken = set(picked)
                    trial[p.offer_id] = [x for x in trial[p.offer_id] if x[0] not in taken]
            except ValueError:
                still_ok = False
            else:
                gpus.update(trial)
                picks.update(chosen)
        if not still_ok:
            dropped.append(bid_id)  # cancelled or withdrawn while the engine ran: the whole bid or nothing
            continue
        assert bid is not None
        for p in parts:
            offer = offers[p.offer_id]
            free[p.offer_id] -= p.gpus
            trades.append(
                Trade(
                    round=rnd, bid=bid, offer=offer, buyer_id=bid.buyer_id, provider=providers[p.provider_id],
                    gpu_model_id=p.gpu_model, region_id=p.region, price=p.price, gpus=p.gpus,
                    duration_s=p.duration_s, amount=p.amount, reason=p.reason,
                    # the offer's own end (the engine counts whole seconds)
                    backfill_until=None if p.backfill_until is None else offer.available_until,
                )
            )
        bid.state = BidState.MATCHED
        bid.explanation = {"round": rnd.number, "matched": True, "reasons": [p.reason for p in parts]}
    Trade.objects.bulk_create(trades)
    phases.lap("trades")
    made = list(Trade.objects.filter(round=rnd).select_related("offer", "bid").order_by("id"))
    now = timezone.now()
    # the GPUs chosen above, from what no held booking took under the offers' row locks: one insert
    bookings.bookings_hold_picked([(t, picks[(t.bid_id, t.offer_id)]) for t in made], now=now)
    jobs = Job.objects.bulk_create(
        # a continuation's job starts from the checkpoint its preempted predecessor left
        Job(trade=t, checkpoint={"resume_from": t.bid.resume_from} if t.bid.resume_from else {})
        for t in made
    )
    machines_wake([(job.trade.offer.machine_id, job.pk) for job in jobs], reason="assigned")
    announce(TradesMatched(trade_ids=tuple(t.pk for t in made)))  # webhook deliveries commit with the trades
    preempted = jobs_.round_preempt(round_number=rnd.number, preemptions=result.preemptions)
    bookings.capacity_refresh(offer_ids=offer_ids)
    phases.lap("bookings")
    matched = [b for b in bids.values() if b.state == BidState.MATCHED]
    bulk.rows_update(matched, ["state", "explanation"])
    unmatched = {u.bid_id: u for u in result.unmatched}
    stale = list(Bid.objects.filter(pk__in=list(unmatched), state=BidState.OPEN))
    starts = estimates.starts_estimate(stale, now=now)
    for b in stale:
        u = unmatched[b.pk]
        b.explanation = {"round": rnd.number, "matched": False, "reasons": list(u.reasons), "nearest": u.nearest}
        if b.pk in starts:  # when the GPUs it waits for are likely to free up (issue 36)
            b.explanation["reasons"].append(starts[b.pk].text(now))
            b.explanation["estimated_start"] = starts[b.pk].at.isoformat()
    bulk.rows_update(stale, ["explanation"])
    phases.lap("explanations")
    result_dict = serialize.result_to_dict(result)
    inputs = serialize.input_to_dict(inp)
    set_aside = dict(set_aside or {"bids": [], "offers": []})
    stats = {**result_dict["stats"], "clear_ms": elapsed_ms, "stage_ms": stage_ms, "dropped_bids": dropped,
             "preemptions": result_dict["preemptions"], "preempted_jobs": preempted, "expired_bids": set_aside.pop("expired_bids", []), "set_aside": set_aside}
    cleared_at = timezone.now()
    stats["skipped_slots"] = _behind_logged(rnd, now=cleared_at)
    phases.lap("record")  # the row's own write is the last of it, and not in it
    stats["round_ms"] = phases.ms()
    AuctionRound.objects.filter(pk=rnd.pk).update(
        state=RoundState.CLEARED,
        cleared_at=cleared_at,
        inputs=inputs,
        input_digest=serialize.digest(inputs),
        result=result_dict,
        result_digest=serialize.digest(result_dict),
        prices=result_dict["prices"],
        stats=stats,
    )
    if settings.GRIDBID.get("MARKETS_CACHE_SECONDS", 0):
        # the round moved the book: the markets list follows once it commits, before the
        # publish below reads it for the books (on_commit runs in the order registered);
        # robust: a cache that fails here is logged, and never stops the round's publish
        transaction.on_commit(selectors.markets_refresh, robust=True)
    announce(RoundCleared(round_id=rnd.pk, unmatched_bid_ids=tuple(b.pk for b in stale)))


@dataclass(frozen=True)
class Replay:
    number: int
    matches: bool
    recorded_digest: str
    replayed_digest: str
    differences: list[str]


def round_replay(*, number: int) -> Replay:
    """Re-run a stored round from its stored inputs and compare with what was recorded."""
    rnd = AuctionRound.objects.filter(number=number).first()
    if rnd is None:
        raise NotFound(f"No round {number}.")
    if rnd.state != RoundState.CLEARED:
        raise Conflict(f"Round {number} is {rnd.state}; only cleared rounds can be replayed.")
    result = serialize.result_to_dict(engine.clear_round(serialize.input_from_dict(rnd.inputs)))
    replayed = serialize.digest(result)
    diffs: list[str] = []
    if rnd.engine_version != engine.ENGINE_VERSION:
        diffs.append(f"engine version: recorded {rnd.engine_version}, running {engine.ENGINE_VERSION}")
    recorded = rnd.result
    for key in ("trades", "prices", "unmatched", "preemptions", "stats"):
        a, b = recorded.get(key), result.get(key)
        if a != b:
            if isinstance(a, list) and isinstance(b, list):
                missing = [x for x in a if x not in b]
                extra = [x for x in b if x not in a]
                diffs.append(f"{key}: {len(missing)} recorded entries not reproduced, {len(extra)} new entries")
                diffs.extend(f"  - {x}" for x in missing[:5])
                diffs.extend(f"  + {x}" for x in extra[:5])
            else:
                diffs.append(f"{key}: recorded {a!r} != replayed {b!r}")
    return Replay(number, replayed == rnd.result_digest and not diffs, rnd.result_digest, replayed, diffs)


@dataclass(frozen=True)
class Quote:
    would_match: bool
    trades: list[dict[str, Any]]
    total_amount: int
    reasons: list[str]
    nearest: str | None
    funded: bool = True
    max_cost: int = 0
    escrow_available: int = 0
    runtime: dict[str, Any] | None = None  # how long jobs like it ran (predictions.runtime_predict)
    waits: str | None = None  # a deferrable bid that would wait for a cleaner hour: why (grid_carbon.deferrals)


def bid_quote(*, user_id: int, data: dict[str, Any], now: datetime | None = None) -> Quote:
    """Run the engine on the current book plus a hypothetical bid, without placing it.

    The other open bids take part, so the quote accounts for competition; it is
    an estimate of the next round, since the book may change before then."""
    now = now or timezone.now()
    hypothetical = Bid(buyer_id=user_id, created_at=now, **data)
    domain = dataclasses.replace(repository.bid_to_domain(hypothetical), id=QUOTE_BID_ID)
    inp, aside = engine.screen(repository.snapshot(now=now, extra_bids=(domain,)))
    mine = next((a for a in aside if a.kind == "bid" and a.id == QUOTE_BID_ID), None)
    if mine is not None:  # the asker's own bid: say what to change (others' bad orders are left out quietly)
        raise engine.EngineInputError(mine.field, mine.message)
    result = engine.clear_round(inp)

    funds = funding.funds_of(User.objects.get(pk=user_id))
    cost = funding.bid_worst_case(max_price=data["max_price"], gpus=data["gpus"], duration_s=data["duration_s"])
    money: dict[str, Any] = {"funded": cost <= funds.available, "max_cost": cost, "escrow_available": funds.available}
    short = [] if money["funded"] else [
        f"Your escrow does not cover it: it may cost up to {funding.usdc(cost)} and {funding.usdc(max(funds.available, 0))} is free to commit; "
        f"deposit at least {funding.usdc(cost - max(funds.available, 0))} more before placing it."]
    until = data.get("deferrable_until")
    wait = grid_carbon.deferrals(inp, {QUOTE_BID_ID: until}, now).get(QUOTE_BID_ID) if until is not None and until > now else None
    money["waits"] = None if wait is None else str(grid_carbon.wait_explanation(wait)["reasons"][0])  # type: ignore[index]
    mine = [t for t in result.trades if t.bid_id == QUOTE_BID_ID]
    # the model it would run on, where the round found it one
    models = [mine[0].gpu_model] if mine else data.get("gpu_models")
    runtime = predictions.runtime_predict(buyer_id=user_id, job_spec=data.get("job_spec"), gpus=data["gpus"], gpu_models=models,
                                          duration_s=data["duration_s"])
    if mine:
        trades = [{"offer": t.offer_id, "gpu_model": t.gpu_model, "region": t.region, "gpus": t.gpus, "price": t.price, "amount": t.amount, "reason": t.reason} for t in mine]
        # an offer would take it; it matches only with the money behind it
        return Quote(not short, trades, sum(t.amount for t in mine), short, None, **money, runtime=runtime)
    why = next((u for u in result.unmatched if u.bid_id == QUOTE_BID_ID), None)
    reasons = short + (list(why.reasons) if why else ["No offer could take this bid."])
    start = estimates.starts_estimate([hypothetical], now=now).get(0)
    if start is not None:
        reasons.append(start.text(now))
    return Quote(False, [], 0, reasons, why.nearest if why else None, **money, runtime=runtime)
