"""Server side of the agent's assignment push: `/ws/agent/machines/<id>/`.

A message only says "look now" (a job was assigned or must be preempted); the
agent then polls its assignments endpoint, which stays the one source of
truth, so a lost or duplicated push costs nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from asgiref.sync import async_to_sync
from celery import shared_task
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.layers import get_channel_layer
from django.db import transaction

from providers.models import Machine

CLOSE_NOT_AUTHENTICATED = 4001
CLOSE_FORBIDDEN = 4003


def group_for(machine_id: int) -> str:
    return f"machine.{machine_id}"


def machine_wake(machine_id: int, *, reason: str, job_id: int | None = None) -> None:
    """Tell the machine's agent to poll now, once the current transaction commits."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group_for(machine_id), {"type": "agent.wake", "reason": reason, "job": job_id})

    transaction.on_commit(send)


WAKE_INLINE = 50  # machines a commit wakes itself; more are handed to a task (providers.tasks.machines_wake_send)


def machines_wake(wakes: list[tuple[int, int | None]], *, reason: str) -> None:
    """``machine_wake`` for many (machine, job) at once, once the transaction commits: a
    round's write assigns thousands of jobs. A machine with several jobs is told once, of its
    first: the message only says "look now". Up to WAKE_INLINE machines are told by the
    commit itself, in one hand-over to the channel layer; more are handed to a task on the
    default queue, so that a round does not wait for them (issue 39: a group send per
    machine, 7,000 of them after a 10k round, held its commit 5 s). An agent that misses a
    wake finds its job on its next poll."""
    first: dict[int, int | None] = {}
    for machine_id, job_id in wakes:
        first.setdefault(machine_id, job_id)
    if not first:
        return
    told = sorted(first.items())
    if len(told) <= WAKE_INLINE:
        transaction.on_commit(lambda: wakes_send(told, reason=reason))
        return

    def hand_over() -> None:
        machines_wake_send.delay([[m, j] for m, j in told], reason)

    transaction.on_commit(hand_over)


def wakes_send(wakes: list[tuple[int, int | None]], *, reason: str) -> None:
    """Each machine's agent told to look now, in one hand-over to the channel layer."""
    layer = get_channel_layer()
    if layer is None or not wakes:
        return

    async def send_all() -> None:
        await asyncio.gather(*(layer.group_send(group_for(m), {"type": "agent.wake", "reason": reason, "job": j}) for m, j in wakes))

    async_to_sync(send_all)()


@shared_task(name="providers.tasks.machines_wake_send")
def machines_wake_send(wakes: list[list[int | None]], reason: str) -> int:
    """The agents of many machines told to look now (``machines_wake``, for more machines
    than a commit tells itself). Each item is [machine id, job id or null]."""
    told = [(int(m), None if j is None else int(j)) for m, j in wakes if m is not None]
    wakes_send(told, reason=str(reason))
    return len(told)


class AgentPushConsumer(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        user = self.scope.get("user")
        self.machine_id = int(self.scope["url_route"]["kwargs"]["machine_id"])
        await self.accept()
        if not user or not user.is_authenticated:
            reason = self.scope.get("token_error") or "Send 'Authorization: Bearer <provider token>'."
            await self.send(text_data=json.dumps({"type": "error", "code": "not_authenticated", "message": reason}))
            await self.close(code=CLOSE_NOT_AUTHENTICATED)
            return
        if not await self._owns(user):
            await self.send(text_data=json.dumps({"type": "error", "code": "forbidden", "message": f"Machine {self.machine_id} is not yours, or your token lacks the 'provide' scope."}))
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(group_for(self.machine_id), self.channel_name)
        await self.send(text_data=json.dumps({"type": "welcome", "machine": self.machine_id}))

    @database_sync_to_async
    def _owns(self, user: Any) -> bool:
        scopes = self.scope.get("token_scopes")
        if scopes is not None and "provide" not in scopes:
            return False
        return Machine.objects.filter(pk=self.machine_id, provider__user=user).exists()

    async def disconnect(self, code: int) -> None:
        await self.channel_layer.group_discard(group_for(self.machine_id), self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data=json.dumps({"type": "pong"}))  # agents only listen; anything sent is a keep-alive

    async def agent_wake(self, event: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps({"type": "wake", "reason": event["reason"], "job": event.get("job")}))
