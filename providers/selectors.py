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


def machine_telemetry(machine_id: int) -> dict[str, Any] | None:
    return cache.get(telemetry_key(machine_id))


def machine_telemetry_history(machine_id: int) -> list[list[float]]:
    """[[unix time, mean GPU utilisation %], …], oldest first; empty when the agent has been quiet."""
    return list(cache.get(telemetry_history_key(machine_id)) or [])
