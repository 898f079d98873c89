"""Periodic upkeep of machines: the market notices when an agent goes quiet."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.db import transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from market.events import MachinesChanged, announce
from market.models import Offer
from market.states import OfferState
from providers.models import Machine, MachineState
from providers.push import machines_wake_send  # noqa: F401 - defined beside what sends it; registered here with the worker

HEARTBEAT_TIMEOUT = timedelta(seconds=30)
RELIABILITY_PENALTY = 0.02


@shared_task(name="providers.tasks.machines_mark_offline")
def machines_mark_offline() -> int:
    """Machines silent past the timeout go offline, their offers pause, their reliability drops."""
    cutoff = timezone.now() - HEARTBEAT_TIMEOUT
    with transaction.atomic():
        ids = list(Machine.objects.select_for_update().filter(state=MachineState.ONLINE, last_heartbeat__lt=cutoff).values_list("id", flat=True))
        if not ids:
            return 0
        Machine.objects.filter(id__in=ids).update(state=MachineState.OFFLINE, reliability=Greatest(F("reliability") - RELIABILITY_PENALTY, 0.0))
        Offer.objects.filter(machine_id__in=ids, state=OfferState.OPEN).update(state=OfferState.PAUSED, paused_by="offline")
        announce(MachinesChanged(machine_ids=tuple(ids), states_changed=True))  # owners and operators see them go quiet
    return len(ids)

