"""GPU capacity: the one owner of who holds which GPUs, and until when.

A trade's booking holds GPU indexes of its offer's machine from the round that matched it
until its job ends, its trade is refunded or settled, or its window runs out: whichever
comes first releases it, once, in the transaction that made the change. An offer's free
GPUs are never counted up or down: `capacity_refresh` sets them from the held bookings,
so they cannot drift from what is really taken.

Callers hold the offer's row lock (`select_for_update`) when they book, so two rounds or
two releases never allocate the same GPUs.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from market import bulk, states
from market.events import BookChanged, JobsChanged, TradesMoved, announce
from market.models import Booking, Job, Offer, ReleaseReason, Trade
from market.states import BookingState, JobState, TradeState
from providers.models import Gpu

log = logging.getLogger(__name__)

# the states in which a job may still hold its GPUs
ACTIVE_JOB_STATES = (JobState.ASSIGNED, JobState.RUNNING, JobState.CHECKPOINTED)
JOB_END_REASON = {JobState.COMPLETED: ReleaseReason.COMPLETED, JobState.FAILED: ReleaseReason.FAILED, JobState.PREEMPTED: ReleaseReason.PREEMPTED,
                  JobState.STOPPED: ReleaseReason.STOPPED}


class CapacityGone(Exception):
    """The machine has fewer free GPUs of the model than the trade needs (the book changed
    after the engine read it)."""


def grace() -> timedelta:
    """How long past its booked duration a job may take to start and to report its end
    before its GPUs go back to the market without it."""
    return timedelta(seconds=settings.GRIDBID["BOOKING_GRACE_S"])


def _held_by_machine_model(machine_ids: Iterable[int]) -> dict[tuple[int, str], list[int]]:
    held: dict[tuple[int, str], list[int]] = defaultdict(list)
    rows = Booking.objects.filter(state=BookingState.HELD, offer__machine_id__in=list(machine_ids)).values_list("offer__machine_id", "offer__gpu_model_id", "gpu_indexes")
    for machine_id, model_id, indexes in rows:
        held[(machine_id, model_id)].extend(indexes)
    return held


def capacity_refresh(*, offer_ids: Iterable[int]) -> None:
    """Set each offer's free GPUs from the bookings that hold them: its own GPUs less those
    its held bookings take, and never more than the machine has left of the model (a
    withdrawn offer's jobs may still run on the same cards)."""
    offers = list(Offer.objects.filter(pk__in=list(offer_ids)).only("id", "gpus", "gpus_free", "machine_id", "gpu_model_id"))
    if not offers:
        return
    own = dict(Booking.objects.filter(offer__in=offers, state=BookingState.HELD).values_list("offer_id").annotate(n=Sum("gpus")))
    machines = {o.machine_id for o in offers}
    held = _held_by_machine_model(machines)
    installed: dict[tuple[int, str], int] = defaultdict(int)
    for machine_id, model_id in Gpu.objects.filter(machine_id__in=machines).values_list("machine_id", "model_id"):
        installed[(machine_id, model_id)] += 1
    changed = []
    for o in offers:
        key = (o.machine_id, o.gpu_model_id)
        free = max(0, min(o.gpus - own.get(o.pk, 0), installed[key] - len(held[key])))
        if free != o.gpus_free:
            o.gpus_free = free
            changed.append(o)
    bulk.rows_update(changed, ["gpus_free"])


def gpus_pick(free: list[tuple[int, int | None]], n: int, one_domain: bool = False) -> list[int]:
    """Which ``n`` of a machine's free GPUs (index, NVLink domain or None) a job gets (issue
    38). A multi-GPU job gets GPUs of one NVLink domain where one has ``n`` free: the domain
    with the fewest free that fits (best fit, so whole domains stay whole for bigger jobs),
    its lowest indexes; where none fits, the lowest indexes, across domains. A 1-GPU job
    takes a GPU outside every domain where there is one, else one of the domain with the
    fewest free. Ties to the lowest index. ``one_domain`` (a bid that needs NVLink): inside
    one domain or not at all (ValueError)."""
    if n > len(free):
        raise ValueError(f"{n} GPUs asked of {len(free)} free")
    domains: dict[int, list[int]] = {}
    loose: list[int] = []
    for i, grp in sorted(free):
        (loose if grp is None else domains.setdefault(grp, [])).append(i)
    if n == 1 and loose:
        return [loose[0]]
    fits = sorted((len(ix), ix[0], ix) for ix in domains.values() if len(ix) >= n)
    if fits:
        return fits[0][2][:n]
    if one_domain:
        raise ValueError(f"no NVLink domain has {n} GPUs free")
    return [i for i, _ in sorted(free)][:n]


def free_gpus(offers: Iterable[Offer], *, linked_only: bool = False) -> dict[int, list[tuple[int, int | None]]]:
    """Per offer, its model's GPUs on its machine that no held booking takes: (index, NVLink
    domain or None), what ``booking_hold`` chooses from. ``linked_only``: the GPUs in an NVLink
    domain alone (a round's snapshot asks every offer, and most machines have none)."""
    offers = list(offers)
    gpus = Gpu.objects.filter(machine_id__in={o.machine_id for o in offers})
    if linked_only:
        gpus = gpus.filter(nvlink_group__isnull=False)
    rows: dict[tuple[int, str], list[tuple[int, int | None]]] = defaultdict(list)
    for m, model, index, grp in gpus.order_by("index").values_list("machine_id", "model_id", "index", "nvlink_group"):
        rows[(m, model)].append((index, grp))
    if not rows:
        return {}
    held = _held_by_machine_model({m for m, _ in rows})
    out = {}
    for o in offers:
        taken = set(held[(o.machine_id, o.gpu_model_id)])
        out[o.pk] = [(i, g) for i, g in rows[(o.machine_id, o.gpu_model_id)] if i not in taken]
    return out


def booking_hold(*, trade: Trade, offer: Offer, now: datetime) -> Booking:
    """Book `trade.gpus` GPUs of `offer`'s machine for the trade, of the offer's model and
    that no held booking on the machine takes, chosen by `gpus_pick` (inside one NVLink
    domain where they fit). The caller holds the offer's row lock and refreshes its
    capacity after booking (`capacity_refresh`)."""
    own = Booking.objects.filter(offer=offer, state=BookingState.HELD).aggregate(n=Sum("gpus"))["n"] or 0
    free = free_gpus([offer]).get(offer.pk, [])
    if len(free) < trade.gpus or offer.gpus - own < trade.gpus:
        raise CapacityGone(f"offer {offer.pk} has {min(len(free), offer.gpus - own)} GPUs free, trade needs {trade.gpus}")
    try:
        picked = gpus_pick(free, trade.gpus, one_domain=trade.bid.needs_nvlink)
    except ValueError as exc:
        raise CapacityGone(f"offer {offer.pk}: {exc}") from None
    return Booking.objects.create(
        offer=offer, trade=trade, gpus=trade.gpus, gpu_indexes=picked,
        starts_at=now, ends_at=now + timedelta(seconds=trade.duration_s) + grace(),
    )


def bookings_hold_picked(picked: Iterable[tuple[Trade, list[int]]], *, now: datetime) -> list[Booking]:
    """Book each trade on the GPU indexes chosen for it (``gpus_pick``, from ``free_gpus``), in
    one insert: a round's write, which read the free GPUs of every offer it books under their
    row locks and chose each trade's apart from the others'. ``booking_hold`` books one trade
    alone."""
    rows = []
    for trade, indexes in picked:
        if len(indexes) != trade.gpus or len(set(indexes)) != len(indexes):
            raise CapacityGone(f"trade {trade.pk} needs {trade.gpus} GPUs, was given {indexes}")
        rows.append(Booking(offer_id=trade.offer_id, trade=trade, gpus=trade.gpus, gpu_indexes=list(indexes),
                            starts_at=now, ends_at=now + timedelta(seconds=trade.duration_s) + grace()))
    return Booking.objects.bulk_create(rows)


def booking_started(*, trade_id: int, started_at: datetime) -> None:
    """The job started: its booking runs for its duration from now (it may have waited for
    its agent), never shorter than booked."""
    booking = Booking.objects.select_for_update().filter(trade_id=trade_id, state=BookingState.HELD).select_related("trade").first()
    if booking is None:
        return
    booked = booking.trade.duration_s + (Trade.objects.filter(extends_id=trade_id).aggregate(n=Sum("duration_s"))["n"] or 0)  # extensions bought before it started count too
    until = started_at + timedelta(seconds=booked) + grace()
    if until > booking.ends_at:
        Booking.objects.filter(pk=booking.pk).update(ends_at=until)


def bookings_release(*, trade_ids: Iterable[int], reason: str, now: datetime | None = None, due_only: bool = False) -> list[int]:
    """Give back the GPUs of these trades' held bookings, once: a booking already released
    is left as it is. Returns the trades whose bookings this call released. Runs in the
    caller's transaction, so the GPUs come back with the change that freed them. With
    `due_only`, only bookings still over by `now` once locked (an extension or a start
    committed since they were listed moved their end)."""
    now = now or timezone.now()
    with transaction.atomic():
        held = Booking.objects.select_for_update().filter(trade_id__in=list(trade_ids), state=BookingState.HELD)
        if due_only:
            held = held.filter(ends_at__lte=now)
        bookings = list(held.select_related("offer__machine").order_by("id"))
        if not bookings:
            return []
        offer_ids = sorted({b.offer_id for b in bookings})
        list(Offer.objects.select_for_update().filter(pk__in=offer_ids).order_by("id").values_list("id", flat=True))  # in id order: no deadlock with a round
        for b in bookings:
            states.advance("booking", b, BookingState.RELEASED)
            b.released_at, b.release_reason = now, reason
        Booking.objects.bulk_update(bookings, ["state", "released_at", "release_reason"])
        capacity_refresh(offer_ids=offer_ids)
        for bucket in sorted({(b.offer.gpu_model_id, b.offer.machine.region_id) for b in bookings}):
            announce(BookChanged(*bucket))
    return [b.trade_id for b in bookings]


def bookings_expire(*, now: datetime | None = None) -> int:
    """Release the bookings whose window has run out. A job that never started by then
    fails (its agent never took it; the trade is refunded by its timeout); a job still
    reported running keeps its state, and its agent's later report is still taken."""
    now = now or timezone.now()
    due = list(Booking.objects.filter(state=BookingState.HELD, ends_at__lte=now).values_list("trade_id", flat=True)[:1000])
    if not due:
        return 0
    with transaction.atomic():
        # jobs first, then bookings, then offers: the order a job's stop or end takes
        jobs = {j.trade_id: j for j in Job.objects.select_for_update().filter(trade_id__in=due).order_by("id")}
        released = bookings_release(trade_ids=due, reason=ReleaseReason.EXPIRED, now=now, due_only=True)
        never_started = [jobs[t] for t in released if t in jobs and jobs[t].state == JobState.ASSIGNED]
        for job in never_started:
            states.advance("job", job, JobState.FAILED)
            job.ended_at = now
            job.checkpoint = {**(job.checkpoint or {}), "reason": "The provider's agent never started the job before its booking ran out."}
            job.save(update_fields=["state", "ended_at", "checkpoint", "updated_at"])
            extensions_follow(job)
        if never_started:
            announce(JobsChanged(job_ids=tuple([j.pk for j in never_started])))
    if released:
        log.info("bookings expired: trades %s", released)
    return len(released)


def extensions_follow(job: Job) -> None:
    """An extension's job is its trade's job running on: it starts and ends with it. (Its
    GPU-seconds come with its own receipt, signed by the agent.)"""
    for ext in Job.objects.select_for_update().filter(trade__extends=job.trade_id).exclude(state=job.state):
        if not states.can_advance("job", ext.state, job.state):
            continue
        states.advance("job", ext, job.state)
        ext.started_at, ext.ended_at, ext.exit_code = job.started_at, job.ended_at, job.exit_code
        ext.checkpoint = {**(ext.checkpoint or {}), "reason": f"the job of trade {job.trade_id}, which this extends, is {job.state}"}
        ext.save()


def on_job_ended(*, trade_id: int, state: str, stopped: bool = False) -> None:
    """A job reached an end state: its GPUs come back now."""
    reason = ReleaseReason.STOPPED if stopped else JOB_END_REASON[JobState(state)]
    bookings_release(trade_ids=[trade_id], reason=reason)


def trades_moved(event: TradesMoved) -> None:
    """The chain refunded or settled trades (inside the listener's transaction)."""
    trade_ids = list(event.trade_ids)
    reason = {TradeState.REFUNDED: ReleaseReason.REFUNDED, TradeState.SETTLED: ReleaseReason.SETTLED}.get(TradeState(event.state))
    if reason is None or not trade_ids:
        return
    if reason == ReleaseReason.REFUNDED:
        _refunded_jobs_end(trade_ids)
    bookings_release(trade_ids=trade_ids, reason=reason)


def _refunded_jobs_end(trade_ids: list[int]) -> None:
    """A refunded trade's money went back to its buyer: its job must not run on GPUs given
    back to the market. One its agent never started fails now; a running one is told to
    stop (its agent's report ends it)."""
    now = timezone.now()
    why = "Its trade was refunded on chain (the buyer has its money back): the job does not run on."
    for job in Job.objects.select_for_update().filter(trade_id__in=trade_ids, state__in=ACTIVE_JOB_STATES).order_by("id"):
        meta = dict(job.checkpoint or {})
        if job.state == JobState.ASSIGNED:
            states.advance("job", job, JobState.FAILED)
            job.ended_at, job.checkpoint = now, {**meta, "reason": why}
            job.save(update_fields=["state", "ended_at", "checkpoint", "updated_at"])
            extensions_follow(job)
        elif not meta.get("stop_requested"):
            job.checkpoint = {**meta, "stop_requested": True, "preempt_requested": True, "preempt_reason": why}
            job.save(update_fields=["checkpoint", "updated_at"])
        announce(JobsChanged(job_ids=(job.pk,)))
