"""Services for provider agents' machines: heartbeats, telemetry, key challenges. (The
jobs they run are market's: `market.jobs`.)

Plain functions with keyword-only arguments, each atomic, raising
`market.errors.DomainError` subclasses that the API maps to 4xx. A provider
reaches only its own machines and jobs: anything else is "not found".
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import datetime
from typing import Any

from django.core import signing
from django.core.cache import cache
from django.db import transaction
from django.utils import timezone

from market.errors import Conflict, DomainError
from market.events import JobsChanged, MachinesChanged, announce
from market.models import Booking, Job, Offer, User
from market.states import JobState, OfferState
from providers.models import MachineState, Provider
from providers.selectors import (
    JOB_TELEMETRY_TTL_S,
    TELEMETRY_HISTORY_POINTS,
    TELEMETRY_TTL_S,
    job_telemetry_append,
    job_telemetry_key,
    job_telemetry_live,
    job_telemetry_point,
    log_key,
    own_machine,
    provider_of,
    telemetry_history_key,
    telemetry_key,
)

HEARTBEAT_INTERVAL_S = 5
CHALLENGE_SALT = "gridbid.agent.challenge"
CHALLENGE_MAX_AGE_S = 300


def _telemetry_store(machine_id: int, snapshot: dict[str, Any], at: datetime, jobs: dict[int, list[int]] | None = None) -> None:
    """The latest figures, a short history of mean GPU utilisation for the dashboard's chart,
    and per running job (``jobs``: job id -> its GPU indexes) a point of its own GPUs' series,
    which its job page draws and its end keeps (``market.jobs.job_event``)."""
    cache.set(telemetry_key(machine_id), snapshot, TELEMETRY_TTL_S)
    gpus = snapshot["gpus"]
    for job_id, indexes in (jobs or {}).items():
        point = job_telemetry_point(gpus, list(indexes), at.timestamp())
        if point is not None:
            cache.set(job_telemetry_key(job_id), job_telemetry_append(job_telemetry_live(job_id), point), JOB_TELEMETRY_TTL_S)
    if gpus:
        point = [round(at.timestamp(), 3), round(sum(float(g.get("utilisation", 0)) for g in gpus) / len(gpus), 1)]
        history = [*(cache.get(telemetry_history_key(machine_id)) or []), point][-TELEMETRY_HISTORY_POINTS:]
        cache.set(telemetry_history_key(machine_id), history, TELEMETRY_TTL_S * 4)


# --- heartbeats -------------------------------------------------------------------------
# a heartbeat's ``host``: Machine fields its agent reports (HostSerializer validates them)
HOST_FIELDS = ("cpu_model", "cpu_cores", "ram_gib", "disk_gb", "net_down_mbps", "net_up_mbps", "driver_version", "cuda", "runtime", "topology")
@transaction.atomic
def machine_heartbeat(*, user: User, machine_id: int, gpus: list[dict[str, Any]], jobs: list[dict[str, Any]], agent_version: str = "",
                      runs_containers: bool | None = None, publishes_ports: bool | None = None, host: dict[str, Any] | None = None) -> dict[str, Any]:
    """The machine is alive: mark it online, reopen the offers its silence paused, record
    progress, and what its agent can run (container images, published ports) and its host
    (CPU, RAM, disk, network, CUDA, topology) as it says."""
    machine = own_machine(user, machine_id, lock=True)
    unknown = set(host or {}) - set(HOST_FIELDS)
    if unknown:
        raise ValueError(f"host: unknown fields {sorted(unknown)}")
    said = {"runs_containers": runs_containers, "publishes_ports": publishes_ports, **(host or {})}
    can = {k: v for k, v in said.items() if v is not None and getattr(machine, k) != v}
    if can:
        for k, v in can.items():
            setattr(machine, k, v)
        machine.save(update_fields=list(can))
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
    announce(JobsChanged(job_ids=tuple(moved)))  # progress bars on the buyer's page follow the heartbeats
    snapshot = {"at": machine.last_heartbeat.isoformat(), "agent_version": agent_version, "gpus": gpus}
    at = machine.last_heartbeat
    held = dict(Booking.objects.filter(trade__job__id__in=moved).values_list("trade__job__id", "gpu_indexes")) if moved and gpus else {}
    transaction.on_commit(lambda: _telemetry_store(machine.pk, snapshot, at, held))
    announce(MachinesChanged(machine_ids=(machine.pk,), states_changed=came_back))  # after the telemetry is stored
    return {"machine": machine.pk, "state": machine.state, "reopened_offers": reopened, "jobs_updated": updated, "next_heartbeat_s": HEARTBEAT_INTERVAL_S}


@transaction.atomic
def machine_going_offline(*, user: User, machine_id: int) -> dict[str, Any]:
    """The machine's agent is stopping: the machine goes offline now and its open offers
    pause, so no round matches a buyer to GPUs nobody runs (silence took 30 s, and rounds
    went on matching it). Its reliability stays: an announced stop is not a failure. The next
    heartbeat brings it back with the offers this paused; saying it twice changes nothing."""
    machine = own_machine(user, machine_id, lock=True)
    paused = 0
    if machine.state == MachineState.ONLINE:
        machine.state = MachineState.OFFLINE
        machine.save(update_fields=["state"])
        paused = Offer.objects.filter(machine=machine, state=OfferState.OPEN).update(state=OfferState.PAUSED, paused_by="offline", updated_at=timezone.now())
        announce(MachinesChanged(machine_ids=(machine.pk,), states_changed=True))
    return {"machine": machine.pk, "state": machine.state, "paused_offers": paused}


# --- key challenge -------------------------------------------------------------------------------
def agent_challenge_issue(*, user: User) -> dict[str, Any]:
    """A short-lived, server-signed text for the agent to sign with its Ethereum key."""
    provider_of(user)
    text = f"GridBid agent sign-in. user={user.pk} nonce={secrets.token_hex(16)}"
    return {"challenge": signing.TimestampSigner(salt=CHALLENGE_SALT).sign(text), "expires_in_s": CHALLENGE_MAX_AGE_S}


@transaction.atomic
def agent_challenge_verify(*, user: User, challenge: str, signature: str, address: str) -> Provider:
    """Check the challenge is ours, fresh and for this user, and that `address` signed it."""
    from eth_account import Account
    from eth_account.messages import encode_defunct
    from eth_utils import to_checksum_address

    provider = provider_of(user)
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
