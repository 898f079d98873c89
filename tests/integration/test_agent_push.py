"""The agent's push socket: only the machine's provider may listen, and a round that
assigns a job on the machine (or an operator's preemption) wakes it."""

from __future__ import annotations

import json

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from gridbid.asgi import application

pytestmark = pytest.mark.django_db(transaction=True)


async def open_push(machine_id: int, token: str | None) -> tuple[WebsocketCommunicator, dict]:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    comm = WebsocketCommunicator(application, f"/ws/agent/machines/{machine_id}/", headers=headers)
    assert (await comm.connect(timeout=5))[0]
    return comm, json.loads(await comm.receive_from(timeout=5))


async def test_a_round_assignment_wakes_the_machines_agent(buyer, provider_user, client_for, make_offer, make_bid, operator):
    offer = await sync_to_async(make_offer)(provider_user, count=8)
    token = await sync_to_async(lambda: client_for(provider_user).raw_token)()
    comm, hello = await open_push(offer.machine_id, token)
    assert hello == {"type": "welcome", "machine": offer.machine_id}
    await sync_to_async(make_bid)(buyer, gpus=2)
    from market.rounds import round_clear

    await sync_to_async(round_clear)()
    wake = json.loads(await comm.receive_from(timeout=5))
    assert wake["type"] == "wake" and wake["reason"] == "assigned"
    operator_client = await sync_to_async(client_for)(operator)
    r = await sync_to_async(operator_client.post)(f"/api/v1/jobs/{wake['job']}/preempt/")
    assert r.status_code == 200
    again = json.loads(await comm.receive_from(timeout=5))
    assert again == {"type": "wake", "reason": "preempt", "job": wake["job"]}
    await comm.disconnect()


async def test_a_round_waking_more_machines_than_its_commit_tells_hands_them_to_a_task_and_each_agent_hears(
        buyer, provider_user, client_for, make_offer, make_bid, monkeypatch):
    """Past WAKE_INLINE machines, a round's commit hands the wakes to a task on the default
    queue (issue 39: one group send per machine held a 10k round's commit 5 s); each agent
    still hears its own, once."""
    from providers import push

    monkeypatch.setattr(push, "WAKE_INLINE", 1)
    sent: list[int] = []
    real = push.machines_wake_send.delay
    monkeypatch.setattr(push.machines_wake_send, "delay", lambda wakes, reason: sent.append(len(wakes)) or real(wakes, reason))
    offers = [await sync_to_async(make_offer)(provider_user, count=2) for _ in range(3)]
    token = await sync_to_async(lambda: client_for(provider_user).raw_token)()
    socks = [(await open_push(o.machine_id, token))[0] for o in offers]
    for _ in offers:
        await sync_to_async(make_bid)(buyer, gpus=2)
    from market.rounds import round_clear

    await sync_to_async(round_clear)()
    assert sent == [3], "one hand-over for the round's three machines"
    jobs = set()
    for comm in socks:
        wake = json.loads(await comm.receive_from(timeout=5))
        assert wake["type"] == "wake" and wake["reason"] == "assigned"
        jobs.add(wake["job"])
        assert await comm.receive_nothing(timeout=0.2)
        await comm.disconnect()
    assert len(jobs) == 3


async def test_another_provider_or_no_token_cannot_listen(provider_user, other_provider_user, client_for, make_offer):
    offer = await sync_to_async(make_offer)(provider_user)
    rival = await sync_to_async(lambda: client_for(other_provider_user).raw_token)()
    comm, msg = await open_push(offer.machine_id, rival)
    assert msg["code"] == "forbidden"
    assert (await comm.receive_output(timeout=5))["code"] == 4003
    comm, msg = await open_push(offer.machine_id, None)
    assert msg["code"] == "not_authenticated"


def test_buyers_cannot_preempt_jobs(buyer, client_for):
    r = client_for(buyer).post("/api/v1/jobs/1/preempt/")
    assert r.status_code == 403
