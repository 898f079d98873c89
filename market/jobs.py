"""The job lifecycle, as the provider's agent reports it: assignments, events, receipts,
preemption and the buyer's stop.

A job's end (completed, failed, preempted, stopped) releases its booking in the same
transaction (`market.bookings`), so its GPUs are back on the market the moment the
report is taken. Plain functions with keyword-only arguments, each atomic, raising
`market.errors.DomainError` subclasses that the API maps to 4xx. A provider reaches only
its own machines and jobs: anything else is "not found".
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from contracts import hours
from contracts import receipts as receipt_format
from contracts.receipts import CHECKPOINT_OUTPUT, MARKET_SCHEME, job_ports
from ledger.custody import buyer_address
from ledger.wallet import is_wallet_buyer
from market import bookings, bulk, states
from market.audit import AuditAction, audit_record
from market.bookings import ACTIVE_JOB_STATES
from market.errors import Conflict, DomainError, NotFound
from market.events import (
    BookChanged,
    CheckpointKept,
    JobReached,
    JobsChanged,
    OperatorChanged,
    announce,
)
from market.funding import EscrowShort, funds_of, usdc
from market.models import Bid, Booking, Job, Offer, Trade, User
from market.services import MIN_CONTINUATION_S, bid_continue, spec_signature_custodial
from market.ssh_keys import authorized_keys
from market.states import BidState, BookingState, JobState, OfferState
from providers.models import MachineState
from providers.push import machine_wake, machines_wake
from providers.selectors import job_telemetry_live, log_key, own_machine, provider_of

log = logging.getLogger(__name__)

EVENT_TARGET = {
    "started": JobState.RUNNING,
    "checkpointed": JobState.CHECKPOINTED,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "preempted": JobState.PREEMPTED,
}
OUTCOME_STATE = {"completed": JobState.COMPLETED, "failed": JobState.FAILED, "preempted": JobState.PREEMPTED}


def _own_job(user: User, job_id: int, *, lock: bool = False) -> Job:
    qs = Job.objects.filter(pk=job_id, trade__provider=provider_of(user))
    if lock:
        qs = qs.select_for_update(of=("self",))
    job = qs.select_related("trade", "trade__bid", "trade__offer", "trade__provider").first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    return job


def _at(ts: int | None) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else timezone.now()


def job_access(job: Job) -> dict[str, Any] | None:
    """Where the buyer reaches the job's published ports while it runs, as its agent
    reported them when it started: {host, ports: [{container, host}], ssh}."""
    access = (job.checkpoint or {}).get("access")
    if not access or job.state not in (JobState.RUNNING, JobState.CHECKPOINTED):
        return None
    ssh_port = next((p["host"] for p in access["ports"] if p["container"] == 22), None) if access.get("ssh") else None
    return {"host": access["host"], "ports": access["ports"], "ssh": f"ssh -p {ssh_port} root@{access['host']}" if ssh_port else None}


def _access_check(job: Job, access: dict[str, Any]) -> dict[str, Any]:
    """The agent's port mappings, checked against what the job spec asked for."""
    spec = job.trade.bid.job_spec or {}
    asked = set(job_ports(spec))  # the agent's own reading of the spec
    got = [(int(p["container"]), int(p["host"])) for p in access.get("ports") or []]
    if not asked:
        raise DomainError("This job's spec publishes no ports; report no access.", fields={"access": ["The spec asks for no ports."]})
    if {c for c, _ in got} != asked or len(got) != len(asked):
        raise DomainError(f"The access must map exactly the ports the job asked for: {sorted(asked)}.", fields={"access.ports": [f"Map each of {sorted(asked)} once."]})
    if len({h for _, h in got}) != len(got):
        raise DomainError("Two container ports are mapped to the same host port.", fields={"access.ports": ["Each host port once."]})
    return {"host": access["host"], "ports": [{"container": c, "host": h} for c, h in sorted(got)], "ssh": bool(spec.get("ssh"))}


def job_telemetry(job: Job) -> list[list[float]]:
    """Its GPUs over time from its agent's heartbeats, oldest first: [unix time, mean
    utilisation %, memory used MiB, memory total MiB] (``JOB_TELEMETRY_COLUMNS``); kept with
    the job once it ended, live from the heartbeats until then."""
    kept = (job.checkpoint or {}).get("telemetry")
    return list(kept) if kept else job_telemetry_live(job.pk)


def preempt_grace(bid: Bid) -> int:
    """Seconds a preempted job of this bid has to checkpoint: PREEMPT_GRACE_S, or less where the bid asks."""
    most = int(settings.GRIDBID["PREEMPT_GRACE_S"])
    return min(most, bid.preempt_grace_s or most)


def job_preemption(job: Job) -> dict[str, Any] | None:
    """What preempted the job, for its buyer: when it was told and why (the round and the bid
    it made room for), its grace, the checkpoint it left, the GPU-seconds run since that
    checkpoint (done again by the part that resumes), and where the rest resumed. None for a
    job never preempted (a buyer's stop is not a preemption)."""
    meta = job.checkpoint or {}
    if not meta.get("preempt_requested") or meta.get("stop_requested"):
        return None
    resumed = None
    follow = meta.get("continued_by_bid")
    if follow:
        part = (Job.objects.filter(trade__bid_id=follow).select_related("trade__offer__machine").order_by("-id").first())
        resumed = {"bid": follow, "job": part.pk if part else None, "state": part.state if part else None,
                   "machine": part.trade.offer.machine.name if part else None, "region": part.trade.region_id if part else None}
    return {
        "requested_at": meta.get("preempt_requested_at"), "reason": meta.get("preempt_reason", ""), "round": meta.get("preempted_by_round"),
        "for_bid": meta.get("preempted_for_bid"), "grace_s": preempt_grace(job.trade.bid),
        "stopped_at": job.ended_at.isoformat() if job.ended_at and job.state == JobState.PREEMPTED else None,
        "checkpoint": meta.get("latest_checkpoint") if job.state == JobState.PREEMPTED else None,
        "lost_gpu_seconds": meta.get("lost_gpu_seconds"), "resumed": resumed,
        "not_resumed": None if resumed is not None or job.state != JobState.PREEMPTED else _not_resumed(job, meta),
    }


def _not_resumed(job: Job, meta: dict[str, Any]) -> str:
    """Why the rest of a preempted job has not gone back to the market (or not yet)."""
    checkpoint = meta.get("latest_checkpoint")
    if not checkpoint:
        return ("it left no checkpoint, so there is nothing to resume from: it did not go back to the market, "
                "and the time it did not run is not charged")
    if str(checkpoint.get("url") or "").startswith(MARKET_SCHEME) and not job.outputs.filter(path=CHECKPOINT_OUTPUT).exists():
        return "waiting for its agent to upload the checkpoint: the rest goes back to the market once it is in"
    return (f"too little of its time was left (under {MIN_CONTINUATION_S} s) or its deadline would pass first: it did not go "
            "back to the market, and the time it did not run is not charged")


def job_log_tail(job: Job) -> str:
    """The end of a job's output: the last one its agent reported once it ended, else live
    from its agent's heartbeats."""
    final = (job.checkpoint or {}).get("log_tail")
    if final:
        return str(final)
    return str(cache.get(log_key(job.pk)) or "")


# --- assignments ----------------------------------------------------------------------------
@transaction.atomic
def machine_assignments(*, user: User, machine_id: int) -> list[dict[str, Any]]:
    """Jobs this machine should be running, each with its trade, spec and the GPU indexes
    its booking holds (the round chose them, so no two jobs share a GPU)."""
    machine = own_machine(user, machine_id, lock=True)
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(trade__offer__machine=machine, state__in=ACTIVE_JOB_STATES, trade__extends__isnull=True)  # an extension runs as its trade's job
        .select_related("trade", "trade__bid", "trade__buyer", "trade__booking")
        .order_by("id")
    )
    extensions: dict[int, list[dict[str, Any]]] = {}
    rows = Job.objects.filter(trade__extends__in=[j.trade_id for j in jobs]).order_by("trade_id").values_list("trade_id", "trade__extends_id", "id", "trade__duration_s", "trade__state")
    for ext_trade, root, ext_job, seconds, ext_state in rows:
        # with its trade's state: an agent runs only time whose money is on chain (its accepted states)
        extensions.setdefault(root, []).append({"trade": ext_trade, "job": ext_job, "duration_s": seconds, "trade_state": ext_state})
    out = []
    for job in jobs:
        trade = job.trade
        meta = dict(job.checkpoint or {})
        booking = getattr(trade, "booking", None)
        if booking is None or (job.state == JobState.ASSIGNED and booking.state != BookingState.HELD):
            continue  # its GPUs went back to the market before the agent took it: never start it
        spec = trade.bid.job_spec
        out.append({
            "job": job.pk,
            "trade": trade.pk,
            "machine": machine.pk,
            "state": job.state,
            "trade_state": trade.state,
            "gpu_model": trade.gpu_model_id,
            "gpus": list(booking.gpu_indexes),
            "duration_s": trade.duration_s + sum(e["duration_s"] for e in extensions.get(trade.pk, [])),
            "extensions": extensions.get(trade.pk, []),
            "price": trade.price,
            "job_spec": spec,
            "spec_hash": receipt_format.spec_hash(spec),
            "spec_signature": spec_signature_custodial(trade.bid) or None,
            "buyer_address": buyer_address(trade.buyer),
            "preempt": bool(meta.get("preempt_requested")),
            # seconds the job has to checkpoint once signalled: the market's, or less if its bid asks
            "grace_s": preempt_grace(trade.bid),
            "resume_from": meta.get("resume_from"),
            # read when the agent takes the job: keys added or removed since the bid count
            "ssh_keys": authorized_keys(trade.buyer) if spec.get("ssh") else [],
        })
    return out


@transaction.atomic
def job_continue(job: Job) -> Bid | None:
    """The rest of a preempted job back in the book, resuming from its latest checkpoint once
    another machine can fetch it: at once from a store of the buyer's, or, for a checkpoint
    the market keeps (market: URL), when its agent's upload is in (CheckpointKept). Once
    only; never for a job its buyer stopped. Runs inside the caller's transaction."""
    meta = dict(job.checkpoint or {})
    checkpoint = meta.get("latest_checkpoint")
    if job.state != JobState.PREEMPTED or not checkpoint or meta.get("stop_requested") or meta.get("continued_by_bid"):
        return None
    if str(checkpoint.get("url") or "").startswith(MARKET_SCHEME) and not job.outputs.filter(path=CHECKPOINT_OUTPUT).exists():
        return None
    follow = bid_continue(job=job, checkpoint=checkpoint)
    if follow is not None:
        job.checkpoint = {**meta, "continued_by_bid": follow.pk}
        job.save(update_fields=["checkpoint", "updated_at"])
        announce(JobsChanged(job_ids=(job.pk,)))
    return follow


def checkpoint_kept(event: CheckpointKept) -> None:
    job = Job.objects.select_for_update().filter(pk=event.job_id).first()
    if job is not None:
        job_continue(job)


def preempt_marked(checkpoint: dict[str, Any] | None, *, reason: str, at: datetime, **by: Any) -> dict[str, Any]:
    """A job's checkpoint with its preemption asked for: why, when, and by what (`by`: the
    round and the bid it preempts for, or the operator): what `job_preemption` reads back."""
    return {**(checkpoint or {}), "preempt_requested": True, "preempt_reason": reason, "preempt_requested_at": at.isoformat(), **by}


def job_preempt_request(*, job: Job, reason: str = "", by: dict[str, Any] | None = None) -> Job:
    """Ask the machine's agent to checkpoint and stop this job (it is woken, and sees it on its
    next poll at the latest). ``by`` says what preempted it (a round, for a bid), kept with it."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state not in ACTIVE_JOB_STATES:
        raise Conflict(f"A job that is {job.state} cannot be preempted.")
    job.checkpoint = preempt_marked(job.checkpoint, reason=reason, at=timezone.now(), **(by or {}))
    job.save(update_fields=["checkpoint", "updated_at"])
    machine_wake(job.trade.offer.machine_id, reason="preempt", job_id=job.pk)
    announce(JobsChanged(job_ids=(job.pk,)))
    return job


@transaction.atomic
def offer_reclaim(*, user: User, offer: Offer) -> tuple[Offer, list[int]]:
    """The owner takes a lent (reclaimable) offer's GPUs back: the offer pauses (paused_by
    "reclaimed": no round sells it until its provider reopens it, PATCH state open), and each
    spot job on it is told to checkpoint and stop within its grace; the rest of each goes
    back to the book from its checkpoint and resumes elsewhere. Reclaiming it again changes
    nothing. Returns the offer and the jobs told."""
    offer = Offer.objects.select_for_update().select_related("machine__provider").get(pk=offer.pk)
    if offer.machine.provider.user_id != user.pk:
        raise NotFound(f"No offer {offer.pk} of yours.")
    if not offer.reclaimable:
        raise Conflict("Only a reclaimable (lent) offer is taken back this way: pause or withdraw this one instead.",
                       fields={"reclaimable": ["Publish the offer with reclaimable: true to lend it."]})
    if offer.state == OfferState.WITHDRAWN:
        raise Conflict("This offer was withdrawn; nothing of it is sold.")
    told = _take_back(offer, paused_by="reclaimed", reason="reclaimed by its owner, who lent these GPUs and needs them back")
    audit_record(actor=user, action=AuditAction.OFFER_UPDATE, obj=offer, details={"reclaimed": True, "preempted_jobs": told})
    return offer, told


def _take_back(offer: Offer, *, paused_by: str, reason: str) -> list[int]:
    """Pause a lent offer (locked by the caller) as ``paused_by`` says, unless it is so paused
    already, and tell each spot job on it, not told yet, to checkpoint and stop. An offer
    paused for another reason (its machine went quiet) is marked too, so that its next
    heartbeat does not reopen it. Returns the jobs told."""
    if offer.state == OfferState.OPEN or offer.paused_by != paused_by:
        if offer.state == OfferState.OPEN:
            states.advance("offer", offer, OfferState.PAUSED)
        offer.paused_by = paused_by
        offer.save(update_fields=["state", "paused_by", "updated_at"])
        announce(BookChanged(gpu_model=offer.gpu_model_id, region=offer.machine.region_id))
    told = []
    for job in Job.objects.filter(trade__offer=offer, trade__bid__klass="spot", trade__extends__isnull=True, state__in=ACTIVE_JOB_STATES).order_by("id"):
        if (job.checkpoint or {}).get("preempt_requested"):
            continue
        job_preempt_request(job=job, reason=reason, by={"reclaimed": True})
        told.append(job.pk)
    return told


def offers_reclaim_due(*, now: datetime | None = None) -> dict[str, list[int]]:
    """Lent offers' reclaim hours, run before each round: an open lent offer whose hours
    have begun is taken back (paused_by "schedule", its spot jobs told to checkpoint and
    move), and one paused by its schedule whose hours have ended is open again (or, if its
    machine has gone quiet, left for its next heartbeat to reopen). An offer taken back by
    hand, or paused by its provider, is left as it is. Returns the offers taken back and
    reopened, and the jobs told."""
    now = now or timezone.now()
    bit = 1 << now.astimezone(UTC).hour
    out: dict[str, list[int]] = {"taken_back": [], "reopened": [], "preempted_jobs": []}
    lent = Offer.objects.filter(reclaimable=True, reclaim_hours__gt=0).annotate(now_bit=F("reclaim_hours").bitand(bit))
    due = list(lent.filter(state=OfferState.OPEN, now_bit__gt=0).values_list("id", flat=True))
    ended = list(lent.filter(state=OfferState.PAUSED, paused_by="schedule", now_bit=0).values_list("id", flat=True))
    for pk in due:
        with transaction.atomic():
            offer = Offer.objects.select_for_update().select_related("machine").get(pk=pk)
            if offer.state != OfferState.OPEN or not hours.covers(offer.reclaim_hours, now):
                continue
            out["preempted_jobs"] += _take_back(offer, paused_by="schedule", reason=(
                f"taken back by its owner's reclaim hours ({hours.text(offer.reclaim_hours)} UTC): these GPUs were lent outside them"))
            out["taken_back"].append(pk)
    for pk in ended:
        with transaction.atomic():
            offer = Offer.objects.select_for_update().select_related("machine").get(pk=pk)
            if offer.state != OfferState.PAUSED or offer.paused_by != "schedule" or hours.covers(offer.reclaim_hours, now):
                continue
            if offer.machine.state == MachineState.ONLINE:
                states.advance("offer", offer, OfferState.OPEN)
                offer.paused_by = ""
                out["reopened"].append(pk)
            else:
                offer.paused_by = "offline"  # its next heartbeat reopens it
            offer.save(update_fields=["state", "paused_by", "updated_at"])
            announce(BookChanged(gpu_model=offer.gpu_model_id, region=offer.machine.region_id))
    if out["taken_back"] or out["reopened"]:
        log.info("reclaim hours: %s", out)
    return out


def backfills_due(*, now: datetime | None = None) -> list[int]:
    """Backfilled jobs (issue 36) still running when their offer's window closed, run before
    each round: each is told to checkpoint and stop, as a preempted spot job is, and the rest
    of it goes back to the book from its checkpoint. Returns the jobs told."""
    now = now or timezone.now()
    told = []
    due = Job.objects.filter(trade__backfill_until__lte=now, state__in=ACTIVE_JOB_STATES).select_related("trade").order_by("id")
    for job in due:
        if (job.checkpoint or {}).get("preempt_requested"):
            continue
        with transaction.atomic():
            until = job.trade.backfill_until
            assert until is not None
            job_preempt_request(job=job, by={"backfill": True}, reason=(
                f"backfilled on its predicted run time before the offer's window closed at {until.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC, "
                "and still running then: these GPUs are taken from then on"))
        told.append(job.pk)
    if told:
        log.info("backfilled jobs past their offer's window, told to stop: %s", told)
    return told


def round_preempt(*, round_number: int, preemptions: tuple[Any, ...]) -> list[int]:
    """The spot jobs a round preempts for the higher-class bids that waited (the engine's
    ``RoundResult.preemptions``): each is told to checkpoint and stop within its grace
    (PREEMPT_GRACE_S, or less where its bid asks), its GPUs come back when its agent reports
    it stopped, and the rest of it goes back to the book from its checkpoint. A job no longer
    running, or told already, is left alone. Returns the jobs told, in the round's order.

    All at once, as ``job_preempt_request`` tells one: one read of the jobs under their row
    locks, one write, one hand-over of the agents' wakes and one JobsChanged (issue 39: one
    by one, each JobsChanged read and sent its provider's sales again after the commit)."""
    by_trade = {p.trade_id: p for p in preemptions}
    if not by_trade:
        return []
    jobs = {j.trade_id: j for j in Job.objects.select_for_update(of=("self",)).select_related("trade__offer").filter(
        trade_id__in=list(by_trade), trade__bid__klass="spot", trade__extends__isnull=True, state__in=ACTIVE_JOB_STATES).order_by("id")}
    now = timezone.now()
    told: list[Job] = []
    for p in preemptions:
        job = jobs.pop(p.trade_id, None)  # popped: a trade listed twice is told once
        if job is None or (job.checkpoint or {}).get("preempt_requested"):
            continue
        job.checkpoint = preempt_marked(job.checkpoint, reason=f"preempted by round {round_number} for a higher-class bid: {p.reason}",
                                        at=now, preempted_by_round=round_number, preempted_for_bid=p.for_bid_id)
        job.updated_at = now
        told.append(job)
    bulk.rows_update(told, ["checkpoint", "updated_at"])
    machines_wake([(job.trade.offer.machine_id, job.pk) for job in told], reason="preempt")
    if told:
        announce(JobsChanged(job_ids=tuple(job.pk for job in told)))
    return [job.pk for job in told]


@transaction.atomic
def job_stop(*, user: User, job_id: int) -> Job:
    """The buyer stops its job before its time is up. A job its agent has not started ends
    here and its GPUs come back at once; a running one is told to checkpoint and stop, and
    its GPUs come back when its agent reports it stopped (seconds: the agent is woken). It
    is billed for the GPU-seconds its signed receipt counts; the rest of the lock is
    refunded at settlement. Stopping a job twice is answered with the job."""
    job = Job.objects.select_for_update(of=("self",)).select_related("trade", "trade__offer").filter(pk=job_id, trade__buyer=user).first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    if job.trade.extends_id:  # an extension runs as its trade's job: stopping it stops that one
        job = Job.objects.select_for_update(of=("self",)).select_related("trade", "trade__offer").get(trade_id=job.trade.extends_id)
    meta = dict(job.checkpoint or {})
    if meta.get("stop_requested") and job.state in ACTIVE_JOB_STATES:
        return job
    if job.state not in ACTIVE_JOB_STATES:
        raise Conflict(f"This job is {job.state} already; there is nothing to stop.")
    meta.update(stop_requested=True, preempt_requested=True, preempt_reason="stopped by the buyer", stop_requested_at=timezone.now().isoformat())
    job.checkpoint = meta
    if job.state == JobState.ASSIGNED:
        states.advance("job", job, JobState.STOPPED)
        job.ended_at = timezone.now()
        meta["reason"] = "Stopped by the buyer before it started; nothing ran, nothing is billed."
        job.save()
        bookings.extensions_follow(job)
        bookings.on_job_ended(trade_id=job.trade_id, state=job.state, stopped=True)
        announce(JobReached(job_id=job.pk))
    else:
        job.save(update_fields=["checkpoint", "updated_at"])
    machine_wake(job.trade.offer.machine_id, reason="preempt", job_id=job.pk)
    announce(JobsChanged(job_ids=(job.pk,)))
    return job


MIN_EXTENSION_S = 60


@transaction.atomic
def job_extend(*, user: User, job_id: int, duration_s: int, max_price: int | None = None) -> Trade:
    """The buyer buys `duration_s` more on the GPUs its job holds, at the offer's ask now
    (`max_price` caps it: a dearer ask is refused, not paid). The extension is a trade of
    its own (its own order, recorded on chain and settled against its own receipt), its
    job follows the first one's, and the booking holds the GPUs for the added time."""
    job = Job.objects.select_for_update(of=("self",)).select_related("trade__bid", "trade__offer").filter(pk=job_id, trade__buyer=user).first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    if job.trade.extends_id:
        raise Conflict(f"This job is an extension; extend the job of trade {job.trade.extends_id} instead.")
    original = job.trade
    if job.state not in ACTIVE_JOB_STATES or (job.checkpoint or {}).get("stop_requested"):
        raise Conflict(f"This job is {'stopping' if job.state in ACTIVE_JOB_STATES else job.state}; only a running or waiting job can be extended.")
    if is_wallet_buyer(user):
        raise Conflict("Your orders are signed by your own wallet; extensions are for custodial accounts for now. Place a new bid for more time.")
    if duration_s < MIN_EXTENSION_S:
        raise DomainError(f"An extension is at least {MIN_EXTENSION_S} seconds.", fields={"duration_s": [f"At least {MIN_EXTENSION_S}."]})
    booking = Booking.objects.select_for_update().filter(trade=original).first()
    if booking is None or booking.state != BookingState.HELD:
        raise Conflict("This job's GPUs are no longer booked; it cannot be extended.")
    offer = Offer.objects.select_for_update().get(pk=original.offer_id)
    if offer.state != OfferState.OPEN:
        raise Conflict(f"The provider's offer is {offer.state}: it sells no more time now.")
    so_far = original.duration_s + sum(Trade.objects.filter(extends=original).values_list("duration_s", flat=True))
    if so_far + duration_s > offer.max_duration_s:
        more = max(0, offer.max_duration_s - so_far)
        raise DomainError(f"The offer sells at most {offer.max_duration_s} s in one booking; this one has {so_far} s.",
                          fields={"duration_s": [f"At most {more} more." if more else "The offer allows no more time on this booking."]})
    until = booking.ends_at + timedelta(seconds=duration_s)
    if offer.available_until is not None and until - bookings.grace() > offer.available_until:
        raise DomainError(f"The offer is available until {offer.available_until.isoformat()}.", fields={"duration_s": ["Ends after the offer's availability."]})
    if max_price is not None and offer.price > max_price:
        raise Conflict(f"The offer's ask is now {usdc(offer.price)}/GPU-h, above your max_price of {usdc(max_price)}/GPU-h.")
    amount = offer.price * original.gpus * duration_s // 3600
    User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).first()
    funds = funds_of(user)
    if amount > funds.available:
        raise EscrowShort(f"This extension costs {usdc(amount)} but your escrow has {usdc(max(funds.available, 0))} free to commit. "
                          f"Deposit at least {usdc(amount - funds.available)} more.", cost=amount, available=funds.available, free=funds.free, committed=funds.committed)
    first_bid = original.bid
    bid = Bid.objects.create(
        buyer=user, job_spec=first_bid.job_spec, spec_signature=first_bid.spec_signature, gpus=original.gpus, gpu_models=[original.gpu_model_id],
        max_price=offer.price, duration_s=duration_s, klass=first_bid.klass, state=BidState.MATCHED,
        explanation={"matched": True, "extension_of": original.pk, "reasons": [f"{duration_s} s more on the GPUs of trade {original.pk}, at the offer's ask"]},
    )
    trade = Trade.objects.create(
        round=None, extends=original, bid=bid, offer=offer, buyer=user, provider=original.provider, gpu_model=original.gpu_model, region=original.region,
        price=offer.price, gpus=original.gpus, duration_s=duration_s, amount=amount, reason=f"extends trade {original.pk}",
    )
    Job.objects.create(trade=trade, state=job.state, started_at=job.started_at, checkpoint={"extension_of_job": job.pk})
    Booking.objects.filter(pk=booking.pk).update(ends_at=until)
    machine_wake(offer.machine_id, reason="extended", job_id=job.pk)
    announce(JobsChanged(job_ids=(job.pk,)))
    return trade


@transaction.atomic
def job_stop_recorded(*, user: User, job_id: int, request: Any = None) -> Job:
    """`job_stop` and its audit record, one transaction (the API and the job page)."""
    job = job_stop(user=user, job_id=job_id)
    audit_record(actor=user, action=AuditAction.JOB_STOP, request=request, obj=job, details={"trade": job.trade_id})
    return job


@transaction.atomic
def job_extend_recorded(*, user: User, job_id: int, duration_s: int, max_price: int | None = None, request: Any = None) -> Trade:
    """`job_extend` and its audit record, one transaction (the API and the job page)."""
    trade = job_extend(user=user, job_id=job_id, duration_s=duration_s, max_price=max_price)
    audit_record(actor=user, action=AuditAction.JOB_EXTEND, request=request, obj=trade,
                 details={"job": job_id, "extends": trade.extends_id, "duration_s": trade.duration_s, "price": trade.price, "amount": trade.amount})
    return trade


# --- job events -----------------------------------------------------------------------------
@transaction.atomic
def job_event(*, user: User, job_id: int, event: str, at: int | None = None, progress: float | None = None, exit_code: int | None = None, gpu_seconds: int | None = None, checkpoint: dict[str, Any] | None = None, reason: str = "", log_tail: str = "", access: dict[str, Any] | None = None,
              lost_gpu_seconds: int | None = None) -> Job:
    """Move the job through its states as its agent reports; a repeated report changes nothing."""
    job = _own_job(user, job_id, lock=True)
    trade = job.trade
    meta = dict(job.checkpoint or {})
    if event == "progress":
        if job.state not in (JobState.RUNNING, JobState.CHECKPOINTED):
            raise Conflict(f"A job that is {job.state} has no progress to report.")
        job.progress = progress if progress is not None else job.progress
        job.save(update_fields=["progress", "updated_at"])
        announce(JobsChanged(job_ids=(job.pk,)))
        return job
    target = EVENT_TARGET[event]
    if target == JobState.PREEMPTED and meta.get("stop_requested"):
        target = JobState.STOPPED  # the agent stops a job the same way either way; its buyer asked for this one
    if checkpoint and str(checkpoint.get("url") or "").startswith(MARKET_SCHEME) and checkpoint["url"] != receipt_format.checkpoint_url(job.pk):
        # the resuming agent fetches a market: URL with its own token: only this job's is one
        raise DomainError(f"A checkpoint kept by the market is at {receipt_format.checkpoint_url(job.pk)}, not {str(checkpoint['url'])[:100]!r}.",
                          fields={"checkpoint": ["Report this job's own market: URL, or a URL of the buyer's store."]})
    if checkpoint:
        meta["latest_checkpoint"] = checkpoint
        meta["checkpoints"] = [*meta.get("checkpoints", []), checkpoint][-20:]
    if job.state == target:
        if event == "checkpointed" and checkpoint:  # a newer checkpoint while still checkpointed
            job.checkpoint = meta
            job.save(update_fields=["checkpoint", "updated_at"])
        return job  # duplicate delivery of a report already applied
    resumed = job.state == JobState.CHECKPOINTED and target == JobState.RUNNING
    states.advance("job", job, target)
    job.checkpoint = meta
    if access is not None and event != "started":
        raise DomainError("Only a started event carries the job's access.", fields={"access": ["Report it with the started event."]})
    if event == "started":
        if access is not None:
            meta["access"] = _access_check(job, access)
        job.started_at = job.started_at or _at(at)
        bookings.booking_started(trade_id=trade.pk, started_at=job.started_at)
    if event in ("completed", "failed", "preempted"):
        limit = trade.gpus * trade.duration_s
        if gpu_seconds is not None and gpu_seconds > limit:
            raise DomainError(f"{gpu_seconds} GPU-seconds is more than the trade bought ({limit}).", fields={"gpu_seconds": [f"At most {limit}."]})
        job.ended_at = _at(at)
        job.exit_code = exit_code
        job.gpu_seconds = gpu_seconds or 0
        if reason:
            meta["reason"] = reason[:500]
        if log_tail:
            meta["log_tail"] = log_tail
        series = job_telemetry_live(job.pk)
        if series:
            meta["telemetry"] = series  # its GPUs over its run, kept with the job once it ends
        if event == "completed":
            job.progress = 1.0
        if event == "preempted" and job.state == JobState.PREEMPTED:
            # the work since the checkpoint it resumes from is done again: the agent measures it
            ran = int(job.gpu_seconds or 0)
            meta["lost_gpu_seconds"] = ran if lost_gpu_seconds is None and not meta.get("latest_checkpoint") else min(ran, int(lost_gpu_seconds or 0))
    job.checkpoint = meta
    job.save()
    bookings.extensions_follow(job)
    if job.state in bookings.JOB_END_REASON:
        bookings.on_job_ended(trade_id=trade.pk, state=job.state, stopped=bool(meta.get("stop_requested")))
    if event == "preempted":
        job_continue(job)
    if not resumed:  # running after a checkpoint is not news: its parties heard it start
        announce(JobReached(job_id=job.pk))  # running, completed, failed, preempted, stopped: webhooks and emails
    announce(JobsChanged(job_ids=(job.pk,)))
    announce(OperatorChanged())  # jobs by state
    return job


# --- receipts ---------------------------------------------------------------------------------
def job_receipt_submit(*, user: User, job_id: int, receipt: dict[str, Any], signature: str, outputs: list[dict[str, Any]] | None = None,
                       outputs_archive: dict[str, Any] | None = None) -> Job:
    """Check a signed completion receipt against the job and the provider's BLS key, and keep it.

    The signature is verified before the row is locked: py-ecc takes ~0.5 s.
    """
    job = _own_job(user, job_id)
    try:
        r = receipt_format.receipt_from_body(receipt)
    except receipt_format.ReceiptError as exc:
        raise DomainError(f"Malformed receipt: {exc}", fields={"receipt": [str(exc)]}) from None
    trade = job.trade
    problems = {}
    if r.trade_id != trade.pk:
        problems["receipt.trade_id"] = [f"This job runs trade {trade.pk}."]
    if r.job_spec_hash != receipt_format.spec_hash(trade.bid.job_spec):
        problems["receipt.job_spec_hash"] = ["Does not match the job spec the buyer placed."]
    if r.gpu_seconds > trade.gpus * trade.duration_s:
        problems["receipt.gpu_seconds"] = [f"At most {trade.gpus * trade.duration_s} (GPUs x duration)."]
    if problems:
        raise DomainError("The receipt does not match this job.", fields=problems)
    key = trade.provider.bls_public_key
    if not key:
        raise Conflict("Register your BLS public key (PATCH /api/v1/providers/me/) before sending receipts.")
    if not receipt_format.receipt_verify(r, signature, key):
        raise DomainError("The receipt's BLS signature does not verify against your registered key.", fields={"signature": ["Not a signature of this receipt by your BLS key."]})
    digest = r.digest().hex()
    with transaction.atomic():
        job = _own_job(user, job_id, lock=True)
        meta = dict(job.checkpoint or {})
        held = meta.get("receipt")
        if held:
            if held["digest"] == digest:
                return job
            raise Conflict("This job already has a different receipt.")
        # the agent signs a stopped job's receipt as preempted: it ends both the same way
        states_ok = {OUTCOME_STATE[r.outcome]} | ({JobState.STOPPED} if r.outcome == "preempted" else set())
        if job.state not in states_ok:
            raise Conflict(f"The receipt says {r.outcome} but the job is {job.state}; report the outcome event first.")
        meta["receipt"] = {"body": r.body(), "signature": signature, "digest": digest, "leaf": r.leaf().hex(), "outputs": outputs or [], "received_at": timezone.now().isoformat()}
        if outputs_archive:
            meta["outputs_archive"] = dict(outputs_archive)  # where the buyer fetches them, and their digest
        job.checkpoint = meta
        job.gpu_seconds = r.gpu_seconds
        job.exit_code = r.exit_code
        job.save(update_fields=["checkpoint", "gpu_seconds", "exit_code", "updated_at"])
        return job


