"""Services for provider agents: heartbeats, assignments, job events, receipts, key challenges.

Plain functions with keyword-only arguments, each atomic, raising
`market.errors.DomainError` subclasses that the API maps to 4xx. A provider
reaches only its own machines and jobs: anything else is "not found".
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime
from typing import Any

from django.core import signing
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from ledger.custody import buyer_address
from market import states
from market.errors import Conflict, DomainError, NotFound
from market.models import Job, Offer, User
from market.services import spec_signature_custodial
from market.states import JobState, OfferState
from market.streams import events
from providers.agent import receipts as receipt_format
from providers.models import Machine, MachineState, Provider

HEARTBEAT_INTERVAL_S = 5
TELEMETRY_TTL_S = 300
CHALLENGE_SALT = "gridbid.agent.challenge"
CHALLENGE_MAX_AGE_S = 300
ACTIVE_JOB_STATES = (JobState.ASSIGNED, JobState.RUNNING, JobState.CHECKPOINTED)
EVENT_TARGET = {
    "started": JobState.RUNNING,
    "checkpointed": JobState.CHECKPOINTED,
    "completed": JobState.COMPLETED,
    "failed": JobState.FAILED,
    "preempted": JobState.PREEMPTED,
}
OUTCOME_STATE = {"completed": JobState.COMPLETED, "failed": JobState.FAILED, "preempted": JobState.PREEMPTED}


def _provider(user: User) -> Provider:
    try:
        return user.provider
    except Provider.DoesNotExist:
        raise NotFound("This account is not a provider.") from None


def _own_machine(user: User, machine_id: int, *, lock: bool = False) -> Machine:
    qs = Machine.objects.filter(pk=machine_id, provider=_provider(user))
    machine = (qs.select_for_update() if lock else qs).first()
    if machine is None:
        raise NotFound(f"No machine {machine_id} of yours.")
    return machine


def _own_job(user: User, job_id: int, *, lock: bool = False) -> Job:
    qs = Job.objects.filter(pk=job_id, trade__provider=_provider(user))
    if lock:
        qs = qs.select_for_update(of=("self",))
    job = qs.select_related("trade", "trade__bid", "trade__offer", "trade__provider").first()
    if job is None:
        raise NotFound(f"No job {job_id} of yours.")
    return job


def _at(ts: int | None) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else timezone.now()


def telemetry_key(machine_id: int) -> str:
    return f"gridbid:machine:{machine_id}:telemetry"


def log_key(job_id: int) -> str:
    return f"gridbid:job:{job_id}:log-tail"


def job_log_tail(job: Job) -> str:
    """The end of a job's output: the last one its agent reported once it ended, else live
    from its agent's heartbeats."""
    final = (job.checkpoint or {}).get("log_tail")
    if final:
        return str(final)
    return str(cache.get(log_key(job.pk)) or "")


def telemetry_history_key(machine_id: int) -> str:
    return f"gridbid:machine:{machine_id}:telemetry-history"


TELEMETRY_HISTORY_POINTS = 120  # ten minutes at the default heartbeat


def _telemetry_store(machine_id: int, snapshot: dict[str, Any], at: datetime) -> None:
    """The latest figures, and a short history of mean GPU utilisation for the dashboard's chart."""
    cache.set(telemetry_key(machine_id), snapshot, TELEMETRY_TTL_S)
    gpus = snapshot["gpus"]
    if gpus:
        point = [round(at.timestamp(), 3), round(sum(float(g.get("utilisation", 0)) for g in gpus) / len(gpus), 1)]
        history = [*(cache.get(telemetry_history_key(machine_id)) or []), point][-TELEMETRY_HISTORY_POINTS:]
        cache.set(telemetry_history_key(machine_id), history, TELEMETRY_TTL_S * 4)


# --- heartbeats -------------------------------------------------------------------------
@transaction.atomic
def machine_heartbeat(*, user: User, machine_id: int, gpus: list[dict[str, Any]], jobs: list[dict[str, Any]], agent_version: str = "") -> dict[str, Any]:
    """The machine is alive: mark it online, reopen the offers its silence paused, record progress."""
    machine = _own_machine(user, machine_id, lock=True)
    installed = set(machine.gpus.values_list("index", flat=True))
    unknown = sorted({g["index"] for g in gpus} - installed)
    if unknown:
        raise DomainError("Telemetry names GPUs this machine does not have.", fields={"gpus": [f"No GPU with index {i} is registered on this machine." for i in unknown]})
    came_back = machine.state != MachineState.ONLINE
    machine.state = MachineState.ONLINE
    machine.last_heartbeat = timezone.now()
    machine.save(update_fields=["state", "last_heartbeat"])
    reopened = 0
    if came_back:
        # offers paused while the machine was silent come back with it
        # (those its provider paused by hand stay paused)
        reopened = Offer.objects.filter(machine=machine, state=OfferState.PAUSED, paused_by="offline").update(state=OfferState.OPEN, paused_by="", updated_at=timezone.now())
    updated = 0
    moved: list[int] = []
    for row in jobs:
        n = Job.objects.filter(pk=row["job"], trade__offer__machine=machine, state__in=[JobState.RUNNING, JobState.CHECKPOINTED]).update(progress=row["progress"], updated_at=timezone.now())
        updated += n
        if n:
            moved.append(row["job"])
            if "log_tail" in row:  # a display cache: no harm if this transaction rolls back
                cache.set(log_key(row["job"]), row["log_tail"], TELEMETRY_TTL_S * 4)
    events.jobs_changed(job_ids=moved)  # progress bars on the buyer's page follow the heartbeats
    snapshot = {"at": machine.last_heartbeat.isoformat(), "agent_version": agent_version, "gpus": gpus}
    at = machine.last_heartbeat
    transaction.on_commit(lambda: _telemetry_store(machine.pk, snapshot, at))
    events.machines_changed(machine_ids=[machine.pk], states_changed=came_back)  # after the telemetry is stored
    return {"machine": machine.pk, "state": machine.state, "reopened_offers": reopened, "jobs_updated": updated, "next_heartbeat_s": HEARTBEAT_INTERVAL_S}


def machine_telemetry(machine_id: int) -> dict[str, Any] | None:
    return cache.get(telemetry_key(machine_id))


def machine_telemetry_history(machine_id: int) -> list[list[float]]:
    """[[unix time, mean GPU utilisation %], …], oldest first; empty when the agent has been quiet."""
    return list(cache.get(telemetry_history_key(machine_id)) or [])


# --- assignments ----------------------------------------------------------------------------
@transaction.atomic
def machine_assignments(*, user: User, machine_id: int) -> list[dict[str, Any]]:
    """Jobs this machine should be running, each with its trade, spec and GPU indexes.

    GPU indexes are allocated once per job (lowest free of the trade's model) and
    kept in Job.checkpoint["gpu_indexes"], so every poll names the same GPUs.
    """
    machine = _own_machine(user, machine_id, lock=True)
    jobs = list(
        Job.objects.select_for_update(of=("self",))
        .filter(trade__offer__machine=machine, state__in=ACTIVE_JOB_STATES)
        .select_related("trade", "trade__bid", "trade__buyer")
        .order_by("id")
    )
    by_model: dict[str, list[int]] = {}
    for gpu in machine.gpus.order_by("index"):
        by_model.setdefault(gpu.model_id, []).append(gpu.index)
    used = {i for j in jobs for i in (j.checkpoint or {}).get("gpu_indexes", [])}
    out = []
    for job in jobs:
        trade = job.trade
        meta = dict(job.checkpoint or {})
        if "gpu_indexes" not in meta:
            free = [i for i in by_model.get(trade.gpu_model_id, []) if i not in used]
            if len(free) < trade.gpus:
                continue  # cannot be placed until GPUs free up; the engine should not have matched it
            meta["gpu_indexes"] = free[: trade.gpus]
            used.update(meta["gpu_indexes"])
            job.checkpoint = meta
            job.save(update_fields=["checkpoint", "updated_at"])
        spec = trade.bid.job_spec
        out.append({
            "job": job.pk,
            "trade": trade.pk,
            "machine": machine.pk,
            "state": job.state,
            "trade_state": trade.state,
            "gpu_model": trade.gpu_model_id,
            "gpus": meta["gpu_indexes"],
            "duration_s": trade.duration_s,
            "price": trade.price,
            "job_spec": spec,
            "spec_hash": receipt_format.spec_hash(spec),
            "spec_signature": spec_signature_custodial(trade.bid) or None,
            "buyer_address": buyer_address(trade.buyer),
            "preempt": bool(meta.get("preempt_requested")),
            "resume_from": meta.get("resume_from"),
        })
    return out


@transaction.atomic
def job_preempt_request(*, job: Job, reason: str = "") -> Job:
    """Ask the machine's agent to checkpoint and stop this job (it sees it on its next poll)."""
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.state not in ACTIVE_JOB_STATES:
        raise Conflict(f"A job that is {job.state} cannot be preempted.")
    job.checkpoint = {**(job.checkpoint or {}), "preempt_requested": True, "preempt_reason": reason}
    job.save(update_fields=["checkpoint", "updated_at"])
    from providers.push import machine_wake

    machine_wake(job.trade.offer.machine_id, reason="preempt", job_id=job.pk)
    return job


# --- job events -----------------------------------------------------------------------------
@transaction.atomic
def job_event(*, user: User, job_id: int, event: str, at: int | None = None, progress: float | None = None, exit_code: int | None = None, gpu_seconds: int | None = None, checkpoint: dict[str, Any] | None = None, reason: str = "", log_tail: str = "") -> Job:
    """Move the job through its states as its agent reports; a repeated report changes nothing."""
    job = _own_job(user, job_id, lock=True)
    trade = job.trade
    meta = dict(job.checkpoint or {})
    if event == "progress":
        if job.state not in (JobState.RUNNING, JobState.CHECKPOINTED):
            raise Conflict(f"A job that is {job.state} has no progress to report.")
        job.progress = progress if progress is not None else job.progress
        job.save(update_fields=["progress", "updated_at"])
        events.jobs_changed(job_ids=[job.pk])
        return job
    target = EVENT_TARGET[event]
    if checkpoint:
        meta["latest_checkpoint"] = checkpoint
        meta["checkpoints"] = [*meta.get("checkpoints", []), checkpoint][-20:]
    if job.state == target:
        if event == "checkpointed" and checkpoint:  # a newer checkpoint while still checkpointed
            job.checkpoint = meta
            job.save(update_fields=["checkpoint", "updated_at"])
        return job  # duplicate delivery of a report already applied
    states.advance("job", job, target)
    job.checkpoint = meta
    if event == "started":
        job.started_at = job.started_at or _at(at)
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
        if event == "completed":
            job.progress = 1.0
    job.checkpoint = meta
    job.save()
    if event == "preempted" and meta.get("latest_checkpoint"):
        from market.services import bid_continue

        follow = bid_continue(job=job, checkpoint=meta["latest_checkpoint"])
        if follow is not None:
            job.checkpoint = {**meta, "continued_by_bid": follow.pk}
            job.save(update_fields=["checkpoint", "updated_at"])
    events.jobs_changed(job_ids=[job.pk])
    events.operator_changed()  # jobs by state
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
        if job.state != OUTCOME_STATE[r.outcome]:
            raise Conflict(f"The receipt says {r.outcome} but the job is {job.state}; report the outcome event first.")
        meta["receipt"] = {"body": r.body(), "signature": signature, "digest": digest, "leaf": r.leaf().hex(), "outputs": outputs or [], "received_at": timezone.now().isoformat()}
        if outputs_archive:
            meta["outputs_archive"] = dict(outputs_archive)  # where the buyer fetches them, and their digest
        job.checkpoint = meta
        job.gpu_seconds = r.gpu_seconds
        job.exit_code = r.exit_code
        job.save(update_fields=["checkpoint", "gpu_seconds", "exit_code", "updated_at"])
        return job


# --- key challenge -------------------------------------------------------------------------------
def agent_challenge_issue(*, user: User) -> dict[str, Any]:
    """A short-lived, server-signed text for the agent to sign with its Ethereum key."""
    _provider(user)
    text = f"GridBid agent sign-in. user={user.pk} nonce={secrets.token_hex(16)}"
    return {"challenge": signing.TimestampSigner(salt=CHALLENGE_SALT).sign(text), "expires_in_s": CHALLENGE_MAX_AGE_S}


@transaction.atomic
def agent_challenge_verify(*, user: User, challenge: str, signature: str, address: str) -> Provider:
    """Check the challenge is ours, fresh and for this user, and that `address` signed it."""
    from eth_account import Account
    from eth_account.messages import encode_defunct
    from eth_utils import to_checksum_address

    provider = _provider(user)
    try:
        text = signing.TimestampSigner(salt=CHALLENGE_SALT).unsign(challenge, max_age=CHALLENGE_MAX_AGE_S)
    except signing.SignatureExpired:
        raise DomainError("The challenge has expired; ask for a new one.", fields={"challenge": ["Expired."]}) from None
    except signing.BadSignature:
        raise DomainError("That is not a challenge this market issued.", fields={"challenge": ["Not issued by this market."]}) from None
    if f" user={user.pk} " not in text:
        raise DomainError("The challenge was issued to another account.", fields={"challenge": ["Issued to another account."]})
    try:
        signer = Account.recover_message(encode_defunct(text=challenge), signature=signature)
    except Exception:
        raise DomainError("The signature is malformed.", fields={"signature": ["Expected a 65-byte EIP-191 signature, hex."]}) from None
    if signer.lower() != address.lower():
        raise DomainError("The challenge was not signed by that address.", fields={"signature": [f"Signed by {signer}, not {address}."]})
    if not cache.add(f"gridbid:challenge-used:{hashlib.sha256(challenge.encode()).hexdigest()}", 1, CHALLENGE_MAX_AGE_S):
        raise Conflict("This challenge was used already; ask for a new one.")
    provider.chain_address = to_checksum_address(address)
    provider.save(update_fields=["chain_address"])
    return provider
