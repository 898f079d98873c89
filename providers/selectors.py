"""Reads of the providers' side: whose provider profile and machines an account holds, and
the machines' latest telemetry (kept in the cache by the heartbeats of providers.jobs)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core.cache import cache

from market.errors import DomainError, NotFound
from providers.models import Machine, Provider

if TYPE_CHECKING:
    from market.models import User

TELEMETRY_TTL_S = 300


def provider_of(user: User, *, refusal: DomainError | None = None) -> Provider:
    """The account's provider profile; an account without one gets `refusal` (default: not found)."""
    try:
        return user.provider
    except Provider.DoesNotExist:
        raise (refusal or NotFound("This account is not a provider.")) from None


def own_machine(user: User, machine_id: int, *, lock: bool = False) -> Machine:
    qs = Machine.objects.filter(pk=machine_id, provider=provider_of(user))
    machine = (qs.select_for_update() if lock else qs).first()
    if machine is None:
        raise NotFound(f"No machine {machine_id} of yours.")
    return machine


def telemetry_key(machine_id: int) -> str:
    return f"gridbid:machine:{machine_id}:telemetry"


def log_key(job_id: int) -> str:
    return f"gridbid:job:{job_id}:log-tail"


def telemetry_history_key(machine_id: int) -> str:
    return f"gridbid:machine:{machine_id}:telemetry-history"


TELEMETRY_HISTORY_POINTS = 120  # ten minutes at the default heartbeat
JOB_TELEMETRY_POINTS = 720  # a job's series: an hour at the heartbeat, then every other older point goes
JOB_TELEMETRY_COLUMNS = ("t", "gpu_util_pct", "memory_used_mib", "memory_total_mib")
JOB_TELEMETRY_TTL_S = 7 * 24 * 3600  # a running job's series (its end copies it to the job)


def job_telemetry_key(job_id: int) -> str:
    return f"gridbid:job:{job_id}:telemetry"


def job_telemetry_point(gpus: list[dict[str, Any]], indexes: list[int], at: float) -> list[float] | None:
    """One point of a job's series from a heartbeat's GPUs: [unix time, mean utilisation %
    of the job's GPUs, their memory used and total in MiB]; None if none of them reported."""
    mine = [g for g in gpus if g.get("index") in set(indexes)]
    if not mine:
        return None
    return [round(at, 3), round(sum(float(g.get("utilisation", 0)) for g in mine) / len(mine), 1),
            sum(int(g.get("memory_used_mib", 0)) for g in mine), sum(int(g.get("memory_total_mib", 0)) for g in mine)]


def job_telemetry_append(series: list[list[float]], point: list[float]) -> list[list[float]]:
    """The series with ``point`` added, kept within ``JOB_TELEMETRY_POINTS``: when full, the
    older half keeps every other point, so a long job's whole run stays, coarser further back."""
    out = [*series, point]
    if len(out) > JOB_TELEMETRY_POINTS:
        half = len(out) // 2
        out = out[:half:2] + out[half:]
    return out


def job_telemetry_live(job_id: int) -> list[list[float]]:
    return list(cache.get(job_telemetry_key(job_id)) or [])


def machine_telemetry(machine_id: int) -> dict[str, Any] | None:
    return cache.get(telemetry_key(machine_id))


def machines_telemetry(machine_ids: list[int]) -> dict[int, dict[str, Any]]:
    """``machine_telemetry`` of many machines in one cache read: those with telemetry."""
    keys = {telemetry_key(m): m for m in machine_ids}
    return {keys[k]: v for k, v in cache.get_many(list(keys)).items() if v is not None}


def machine_telemetry_history(machine_id: int) -> list[list[float]]:
    """[[unix time, mean GPU utilisation %], …], oldest first; empty when the agent has been quiet."""
    return list(cache.get(telemetry_history_key(machine_id)) or [])
