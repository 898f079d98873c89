"""The agent-facing API: heartbeats, assignments, job events, receipts, key challenges.

Trades and jobs are created directly with the ORM here; the last tests drive the
real agent daemon in-process against these endpoints through an httpx transport.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from market.models import Job, Offer
from tests.integration.helpers import drive

pytestmark = pytest.mark.django_db


def telemetry(index: int, **kw: Any) -> dict[str, Any]:
    return {"index": index, "utilisation": 50.0, "memory_used_mib": 1000, "memory_total_mib": 81559, "temperature_c": 60.0, "power_w": 300.0, **kw}


# --- heartbeats ----------------------------------------------------------------------------
def test_heartbeat_brings_an_offline_machine_back_and_reopens_its_paused_offers(provider_user, client_for, make_offer):
    from providers.tasks import machines_mark_offline

    offer = make_offer(provider_user, count=2)
    machine = offer.machine
    client = client_for(provider_user)
    assert client.post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [telemetry(0), telemetry(1)]}, format="json").status_code == 200
    machine.refresh_from_db()
    assert machine.state == "online" and machine.last_heartbeat is not None
    # silence: the periodic task takes it offline, pauses the offer, lowers reliability
    type(machine).objects.filter(pk=machine.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    assert machines_mark_offline() == 1
    offer.refresh_from_db()
    machine.refresh_from_db()
    assert offer.state == "paused" and machine.state == "offline" and machine.reliability < 0.9
    r = client.post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [telemetry(0)]}, format="json")
    assert r.status_code == 200 and r.json()["reopened_offers"] == 1
    offer.refresh_from_db()
    assert offer.state == "open"


def test_an_offer_its_provider_paused_stays_paused_when_the_machine_comes_back(provider_user, client_for, make_offer):
    from providers.tasks import machines_mark_offline

    mine = make_offer(provider_user, count=1)
    client = client_for(provider_user)
    r = client.patch(f"/api/v1/offers/{mine.pk}/", {"state": "paused"}, format="json")
    assert r.status_code == 200 and r.json()["state"] == "paused"
    machine = mine.machine
    type(machine).objects.filter(pk=machine.pk).update(last_heartbeat=timezone.now() - timedelta(minutes=5))
    machines_mark_offline()
    r = client.post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [telemetry(0)]}, format="json")
    assert r.status_code == 200 and r.json()["reopened_offers"] == 0
    mine.refresh_from_db()
    assert mine.state == "paused" and mine.paused_by == "provider", "only its provider reopens it"
    r = client.patch(f"/api/v1/offers/{mine.pk}/", {"state": "open"}, format="json")
    assert r.status_code == 200 and r.json()["state"] == "open"


def test_an_agent_that_stops_takes_its_machine_offline_at_once_and_its_offers_come_back_with_it(provider_user, other_provider_user, client_for, make_offer):
    """A stopped agent's machine stayed online until 30 s of silence: a round matched a buyer
    to it meanwhile, and the job waited on a machine nobody ran (the preemption e2e's spot bid
    took the cheaper L4 of the test before it, stopped a moment earlier)."""
    offer = make_offer(provider_user, count=2)
    machine = offer.machine
    client = client_for(provider_user)
    assert client.post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [telemetry(0)]}, format="json").status_code == 200
    reliability = type(machine).objects.get(pk=machine.pk).reliability

    r = client.post(f"/api/v1/agent/machines/{machine.id}/offline/")
    assert r.status_code == 200, r.content
    assert r.json() == {"machine": machine.id, "state": "offline", "paused_offers": 1}
    machine.refresh_from_db()
    offer.refresh_from_db()
    assert machine.state == "offline" and (offer.state, offer.paused_by) == ("paused", "offline")
    assert machine.reliability == reliability, "a stop the agent announced is not the silence of a failure"
    assert client.post(f"/api/v1/agent/machines/{machine.id}/offline/").json()["paused_offers"] == 0  # said twice: the same

    assert client.post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [telemetry(0)]}, format="json").json()["reopened_offers"] == 1
    offer.refresh_from_db()
    assert offer.state == "open"
    assert client_for(other_provider_user).post(f"/api/v1/agent/machines/{machine.id}/offline/").status_code == 404


def test_heartbeat_carries_job_progress(provider_user, client_for, make_job):
    job = make_job(provider_user)
    Job.objects.filter(pk=job.pk).update(state="running")
    machine_id = job.trade.offer.machine_id
    r = client_for(provider_user).post(f"/api/v1/agent/machines/{machine_id}/heartbeat/", {"jobs": [{"job": job.id, "progress": 0.25}]}, format="json")
    assert r.json()["jobs_updated"] == 1
    job.refresh_from_db()
    assert job.progress == 0.25


def test_heartbeats_draw_a_jobs_own_gpus_over_time_and_the_job_keeps_them_when_it_ends(
        provider_user, buyer, client_for, make_job, django_capture_on_commit_callbacks):
    # issue 32, live job monitoring: the job's GPUs (its booking's), not the machine's
    from django.core.cache import cache
    from django.test import Client

    from market.jobs import job_event
    from market.models import Booking
    from providers.selectors import job_telemetry_key

    job = make_job(provider_user, gpus=2, count=4)
    job_event(user=provider_user, job_id=job.pk, event="started")
    mine = Booking.objects.get(trade=job.trade).gpu_indexes
    assert len(mine) == 2
    machine_id = job.trade.offer.machine_id
    agent = client_for(provider_user)
    for busy in (40.0, 90.0):
        gpus = [telemetry(i, utilisation=busy if i in mine else 0.0, memory_used_mib=20_000 if i in mine else 7) for i in range(4)]
        with django_capture_on_commit_callbacks(execute=True):
            r = agent.post(f"/api/v1/agent/machines/{machine_id}/heartbeat/", {"gpus": gpus, "jobs": [{"job": job.id, "progress": 0.5}]}, format="json")
        assert r.status_code == 200, r.content
    body = client_for(buyer).get(f"/api/v1/jobs/{job.pk}/telemetry/").json()
    assert body["columns"] == ["t", "gpu_util_pct", "memory_used_mib", "memory_total_mib"]
    assert [p[1:] for p in body["points"]] == [[40.0, 40_000, 2 * 81559], [90.0, 40_000, 2 * 81559]]
    assert body["points"][0][0] <= body["points"][1][0]
    assert client_for(provider_user).get(f"/api/v1/jobs/{job.pk}/telemetry/").status_code == 200
    job_event(user=provider_user, job_id=job.pk, event="completed", exit_code=0, gpu_seconds=20, log_tail="epoch 3 loss 0.1\n")
    cache.delete(job_telemetry_key(job.pk))  # the live series expires; the ended job keeps its own
    body = client_for(buyer).get(f"/api/v1/jobs/{job.pk}/telemetry/").json()
    assert len(body["points"]) == 2 and body["state"] == "completed" and body["log_tail"] == "epoch 3 loss 0.1\n"
    page = Client()
    page.force_login(buyer)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-telemetry"' in html and "2 readings of the job" in html


def test_a_long_jobs_series_stays_bounded_and_keeps_its_start():
    from providers.selectors import JOB_TELEMETRY_POINTS, job_telemetry_append

    series: list[list[float]] = []
    for t in range(5 * JOB_TELEMETRY_POINTS):
        series = job_telemetry_append(series, [float(t), 1.0, 0, 0])
    assert len(series) <= JOB_TELEMETRY_POINTS and series[0][0] == 0.0 and series[-1][0] == 5 * JOB_TELEMETRY_POINTS - 1
    assert [p[0] for p in series] == sorted(p[0] for p in series)


@pytest.mark.parametrize("gpu,field", [
    (telemetry(7), "gpus"),
    (telemetry(0, utilisation=150), "gpus[0].utilisation"),
    (telemetry(0, memory_used_mib=10**9), "gpus[0].memory_used_mib"),
    (telemetry(0, temperature_c="hot"), "gpus[0].temperature_c"),
])
def test_heartbeat_with_bad_telemetry_is_refused_naming_the_field(provider_user, client_for, make_machine, gpu, field):
    machine = make_machine(provider_user, count=2)
    r = client_for(provider_user).post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {"gpus": [gpu]}, format="json")
    assert r.status_code == 400
    assert any(k.startswith(field) for k in r.json()["error"]["fields"]), r.json()


def test_a_provider_cannot_heartbeat_another_providers_machine(provider_user, other_provider_user, client_for, make_machine):
    machine = make_machine(other_provider_user)
    r = client_for(provider_user).post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {}, format="json")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_agent_endpoints_need_the_provide_scope(provider_user, buyer, client_for, make_machine):
    machine = make_machine(provider_user)
    r = client_for(provider_user, scopes=["read"]).post(f"/api/v1/agent/machines/{machine.id}/heartbeat/", {}, format="json")
    assert r.status_code == 403 and "provide" in r.json()["error"]["message"]
    assert client_for(buyer, scopes=["read"]).get(f"/api/v1/agent/machines/{machine.id}/assignments/").status_code == 403


def test_anonymous_agent_is_refused(anon):
    assert anon.post("/api/v1/agent/challenge/").status_code in (401, 403)


# --- assignments -----------------------------------------------------------------------------
def test_assignments_name_the_trade_spec_and_stable_distinct_gpus(provider_user, other_provider_user, client_for, make_job, make_offer):
    from market.jobs import job_event

    offer = make_offer(provider_user, count=4)
    done = make_job(provider_user, offer=offer, gpus=1)
    job_event(user=provider_user, job_id=done.pk, event="started")
    job_event(user=provider_user, job_id=done.pk, event="completed", exit_code=0)  # its GPU comes back
    a = make_job(provider_user, offer=offer, gpus=2)
    b = make_job(provider_user, offer=offer, gpus=2)
    make_job(other_provider_user)  # someone else's
    client = client_for(provider_user)
    first = client.get(f"/api/v1/agent/machines/{offer.machine_id}/assignments/").json()["assignments"]
    assert [x["job"] for x in first] == [a.id, b.id]
    assert first[0]["gpus"] == [0, 1] and first[1]["gpus"] == [2, 3]
    assert first[0]["trade"] == a.trade_id and first[0]["trade_state"] == "recorded" and first[0]["machine"] == offer.machine_id
    from contracts.receipts import spec_hash

    assert first[0]["spec_hash"] == spec_hash(first[0]["job_spec"]) and first[0]["preempt"] is False
    again = client.get(f"/api/v1/agent/machines/{offer.machine_id}/assignments/").json()["assignments"]
    assert [x["gpus"] for x in again] == [[0, 1], [2, 3]]


def test_a_preempt_order_shows_in_the_assignment(provider_user, client_for, make_job):
    from market.jobs import job_preempt_request

    job = make_job(provider_user)
    job_preempt_request(job=job, reason="spot capacity reclaimed")
    (a,) = client_for(provider_user).get(f"/api/v1/agent/machines/{job.trade.offer.machine_id}/assignments/").json()["assignments"]
    assert a["preempt"] is True


# --- job events ---------------------------------------------------------------------------------
def post_event(client, job, **body):
    return client.post(f"/api/v1/agent/jobs/{job.id}/events/", body, format="json")


def test_job_moves_through_its_states_as_the_agent_reports(provider_user, client_for, make_job):
    job = make_job(provider_user)
    client = client_for(provider_user)
    r = post_event(client, job, event="started", at=1_700_000_000)
    assert r.status_code == 200 and r.json()["state"] == "running"
    assert post_event(client, job, event="started").status_code == 200  # a duplicate changes nothing
    assert post_event(client, job, event="progress", progress=0.5).json()["progress"] == 0.5
    ck = {"size": 1234, "sha256": "ab" * 32, "url": "file:///ck.tar"}
    r = post_event(client, job, event="checkpointed", checkpoint=ck)
    assert r.json()["state"] == "checkpointed" and r.json()["checkpoint"]["latest_checkpoint"] == ck
    r = post_event(client, job, event="completed", exit_code=0, gpu_seconds=600)
    body = r.json()
    assert (body["state"], body["exit_code"], body["gpu_seconds"], body["progress"]) == ("completed", 0, 600, 1.0)
    job.refresh_from_db()
    assert job.started_at.timestamp() == 1_700_000_000 and job.ended_at is not None


def test_an_impossible_job_transition_is_a_conflict(provider_user, client_for, make_job):
    job = make_job(provider_user)
    client = client_for(provider_user)
    post_event(client, job, event="started")
    post_event(client, job, event="failed", exit_code=1, gpu_seconds=10)
    r = post_event(client, job, event="started")
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    assert post_event(client, job, event="progress", progress=0.1).status_code == 409


def test_a_job_cannot_bill_more_gpu_seconds_than_its_trade_bought(provider_user, client_for, make_job):
    job = make_job(provider_user, gpus=2, duration_s=600)
    client = client_for(provider_user)
    post_event(client, job, event="started")
    r = post_event(client, job, event="completed", exit_code=0, gpu_seconds=1201)
    assert r.status_code == 400 and "gpu_seconds" in r.json()["error"]["fields"]


def test_a_preempted_job_keeps_its_checkpoint_for_resumption(provider_user, client_for, make_job):
    job = make_job(provider_user)
    client = client_for(provider_user)
    post_event(client, job, event="started")
    ck = {"size": 10, "sha256": "cd" * 32}
    r = post_event(client, job, event="preempted", exit_code=0, gpu_seconds=60, checkpoint=ck)
    assert r.json()["state"] == "preempted" and r.json()["checkpoint"]["latest_checkpoint"] == ck


def test_events_for_another_providers_job_are_not_found(provider_user, other_provider_user, client_for, make_job):
    job = make_job(other_provider_user)
    assert post_event(client_for(provider_user), job, event="started").status_code == 404


@pytest.mark.parametrize("body,field", [({"event": "exploded"}, "event"), ({"event": "progress"}, "progress"), ({"event": "checkpointed"}, "checkpoint"), ({"event": "failed", "exit_code": 10**6}, "exit_code")])
def test_malformed_events_are_refused(provider_user, client_for, make_job, body, field):
    job = make_job(provider_user)
    r = post_event(client_for(provider_user), job, **body)
    assert r.status_code == 400 and field in r.json()["error"]["fields"]


# --- receipts -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bls_key():
    from contracts import bls
    from contracts.bls import BlsKey

    sk = bls.keygen(b"\x05" * 32)
    return BlsKey(sk, bls.public_key(sk), b"")


def signed_receipt(job, key, **changes):
    from contracts.receipts import Receipt, receipt_sign, spec_hash

    body = dict(trade_id=job.trade_id, job_spec_hash=spec_hash(job.trade.bid.job_spec), started_at=100, ended_at=400, gpu_seconds=600, exit_code=0, outputs_root="ef" * 32, outcome="completed")
    body.update(changes)
    r = Receipt(**body)
    return {"receipt": r.body(), "signature": receipt_sign(r, key), "outputs": [{"path": "out.txt", "size": 3, "sha256": "aa" * 32}]}


def test_signed_receipt_is_verified_and_kept(provider_user, client_for, make_job, bls_key):
    job = make_job(provider_user)
    job.trade.provider.__class__.objects.filter(pk=job.trade.provider_id).update(bls_public_key=bls_key.public_key.hex())
    client = client_for(provider_user)
    post_event(client, job, event="started")
    post_event(client, job, event="completed", exit_code=0, gpu_seconds=600)
    body = signed_receipt(job, bls_key)
    r = client.post(f"/api/v1/agent/jobs/{job.id}/receipt/", body, format="json")
    assert r.status_code == 200, r.json()
    held = r.json()["checkpoint"]["receipt"]
    assert held["body"] == body["receipt"] and len(held["leaf"]) == 64 and held["outputs"][0]["path"] == "out.txt"
    assert client.post(f"/api/v1/agent/jobs/{job.id}/receipt/", body, format="json").status_code == 200  # idempotent
    other = signed_receipt(job, bls_key, gpu_seconds=500)
    assert client.post(f"/api/v1/agent/jobs/{job.id}/receipt/", other, format="json").status_code == 409


def test_receipt_with_a_bad_signature_or_wrong_spec_is_refused(provider_user, client_for, make_job, bls_key):
    job = make_job(provider_user)
    job.trade.provider.__class__.objects.filter(pk=job.trade.provider_id).update(bls_public_key=bls_key.public_key.hex())
    client = client_for(provider_user)
    post_event(client, job, event="started")
    post_event(client, job, event="completed", exit_code=0, gpu_seconds=600)
    forged = signed_receipt(job, bls_key)
    forged["receipt"]["gpu_seconds"] = 700  # changed after signing
    r = client.post(f"/api/v1/agent/jobs/{job.id}/receipt/", forged, format="json")
    assert r.status_code == 400 and "signature" in r.json()["error"]["fields"]
    wrong_spec = signed_receipt(job, bls_key, job_spec_hash="00" * 32)
    r = client.post(f"/api/v1/agent/jobs/{job.id}/receipt/", wrong_spec, format="json")
    assert r.status_code == 400 and "receipt.job_spec_hash" in r.json()["error"]["fields"]


def test_receipt_before_a_bls_key_is_registered_is_a_conflict(provider_user, client_for, make_job, bls_key):
    job = make_job(provider_user)
    r = client_for(provider_user).post(f"/api/v1/agent/jobs/{job.id}/receipt/", signed_receipt(job, bls_key), format="json")
    assert r.status_code == 409 and "BLS" in r.json()["error"]["message"]


# --- challenge ------------------------------------------------------------------------------------
def test_signed_challenge_binds_the_providers_chain_address(provider_user, client_for):
    from eth_account import Account

    from providers.agent.keys import sign_text

    acct = Account.create()
    client = client_for(provider_user)
    ch = client.post("/api/v1/agent/challenge/").json()["challenge"]
    wrong = client.post("/api/v1/agent/challenge/verify/", {"challenge": ch, "signature": sign_text(acct, ch), "address": Account.create().address}, format="json")
    assert wrong.status_code == 400
    r = client.post("/api/v1/agent/challenge/verify/", {"challenge": ch, "signature": sign_text(acct, ch), "address": acct.address}, format="json")
    assert r.status_code == 200 and r.json()["chain_address"] == acct.address
    provider_user.provider.refresh_from_db()
    assert provider_user.provider.chain_address == acct.address
    again = client.post("/api/v1/agent/challenge/verify/", {"challenge": ch, "signature": sign_text(acct, ch), "address": acct.address}, format="json")
    assert again.status_code == 409


def test_a_forged_or_foreign_challenge_is_refused(provider_user, other_provider_user, client_for):
    from eth_account import Account

    from providers.agent.keys import sign_text

    acct = Account.create()
    forged = "GridBid agent sign-in. user=1 nonce=00:1abc:xyz"
    r = client_for(provider_user).post("/api/v1/agent/challenge/verify/", {"challenge": forged, "signature": sign_text(acct, forged), "address": acct.address}, format="json")
    assert r.status_code == 400 and "challenge" in r.json()["error"]["fields"]
    theirs = client_for(other_provider_user).post("/api/v1/agent/challenge/").json()["challenge"]
    r = client_for(provider_user).post("/api/v1/agent/challenge/verify/", {"challenge": theirs, "signature": sign_text(acct, theirs), "address": acct.address}, format="json")
    assert r.status_code == 400


def test_agent_runs_an_assigned_job_and_the_market_holds_its_verified_receipt(provider_user, make_job, agent_for):
    import sys

    spec = {"command": [sys.executable, "-c", "open('outputs/result.txt', 'w').write('done')"], "output_dir": "outputs"}
    job = make_job(provider_user, job_spec=spec)
    agent = agent_for(provider_user, job.trade.offer.machine)
    agent.connect()
    provider_user.provider.refresh_from_db()
    assert provider_user.provider.chain_address == agent.account.address  # the signed challenge bound it

    def receipted() -> bool:
        job.refresh_from_db()
        return "receipt" in job.checkpoint

    drive(agent, receipted)
    assert job.state == "completed" and job.exit_code == 0 and job.started_at and job.ended_at
    held = job.checkpoint["receipt"]
    assert held["body"]["trade_id"] == job.trade_id and held["outputs"][0]["path"] == "result.txt"
    machine = job.trade.offer.machine
    machine.refresh_from_db()
    assert machine.state == "online"
    from providers.selectors import machine_telemetry

    assert machine_telemetry(machine.id) is None or len(machine_telemetry(machine.id)["gpus"]) == 4


def test_agent_keeps_offers_in_step_with_its_pricing(provider_user, make_machine, agent_for):
    from providers.agent.config import PricingRule

    machine = make_machine(provider_user, count=2)
    agent = agent_for(provider_user, machine, pricing=[PricingRule("H100-SXM-80GB", "utilisation", 2_000_000, 1_000_000)])
    agent.connect()
    agent.tick()
    (offer,) = Offer.objects.filter(machine=machine)
    assert (offer.gpus, offer.price, offer.state) == (2, 2_000_000, "open")
    agent.config.pricing = [PricingRule("H100-SXM-80GB", "fixed", 2_200_000)]
    agent.next_offer_sync = 0
    agent.tick()
    offer.refresh_from_db()
    assert offer.price == 2_200_000


def test_a_preempted_job_goes_back_to_the_market_for_its_time_left_and_resumes_from_its_checkpoint(provider_user, other_provider_user, client_for, make_job, make_offer):
    from market.models import Bid, Job
    from market.rounds import round_clear

    job = make_job(provider_user, gpus=2, duration_s=3600)
    client = client_for(provider_user)
    post_event(client, job, event="started")
    ck = {"size": 10, "sha256": "cd" * 32, "url": "https://store.example/ck.tar"}
    r = post_event(client, job, event="preempted", exit_code=0, gpu_seconds=2 * 600, checkpoint=ck)
    assert r.status_code == 200
    follow = Bid.objects.get(resume_from__isnull=False)
    original = job.trade.bid
    assert (follow.buyer_id, follow.gpus, follow.max_price, follow.job_spec) == (original.buyer_id, original.gpus, original.max_price, original.job_spec)
    assert follow.duration_s == 3000 and follow.state == "open", "the 50 minutes it had left"
    assert follow.resume_from == {"url": ck["url"], "sha256": ck["sha256"], "size": 10, "trade": job.trade_id}
    assert post_event(client, job, event="preempted", exit_code=0, gpu_seconds=1200, checkpoint=ck).status_code == 200
    assert Bid.objects.filter(resume_from__isnull=False).count() == 1, "a repeated report continues nothing twice"

    make_offer(other_provider_user, count=4, price=original.max_price // 2)
    round_clear()
    follow.refresh_from_db()
    assert follow.state == "matched"
    resumed = Job.objects.get(trade__bid=follow)
    r = client_for(other_provider_user).get(f"/api/v1/agent/machines/{resumed.trade.offer.machine_id}/assignments/")
    (mine,) = [a for a in r.json()["assignments"] if a["job"] == resumed.pk]
    assert mine["resume_from"]["url"] == ck["url"] and mine["resume_from"]["sha256"] == ck["sha256"], "the agent fetches and checks it"


def test_a_preemption_without_a_fetchable_checkpoint_or_time_left_is_not_continued(provider_user, client_for, make_job):
    from market.models import Bid

    client = client_for(provider_user)
    job = make_job(provider_user, gpus=2, duration_s=3600)
    post_event(client, job, event="started")
    post_event(client, job, event="preempted", exit_code=0, gpu_seconds=600, checkpoint={"size": 10, "sha256": "cd" * 32})  # no URL
    late = make_job(provider_user, gpus=2, duration_s=3600)
    post_event(client, late, event="started")
    post_event(client, late, event="preempted", exit_code=0, gpu_seconds=2 * 3590, checkpoint={"size": 1, "sha256": "ab" * 32, "url": "https://x/c.tar"})
    assert not Bid.objects.filter(resume_from__isnull=False).exists()


def test_assignments_carry_the_buyers_signature_over_the_spec_which_agents_check(provider_user, client_for, make_job):
    from contracts import receipts
    from ledger.custody import buyer_address

    job = make_job(provider_user)
    r = client_for(provider_user).get(f"/api/v1/agent/machines/{job.trade.offer.machine_id}/assignments/")
    (a,) = r.json()["assignments"]
    assert a["buyer_address"] == buyer_address(job.trade.buyer), "the custodial address that signs the buyer's orders"
    assert receipts.spec_signer(a["job_spec"], a["spec_signature"]) == a["buyer_address"]
    again = client_for(provider_user).get(f"/api/v1/agent/machines/{job.trade.offer.machine_id}/assignments/").json()["assignments"][0]
    assert again["spec_signature"] == a["spec_signature"], "signed once, kept on the bid"


@pytest.mark.unfunded  # the wallet's own address gets the escrow, once linked
def test_a_wallet_buyer_signs_its_spec_in_its_wallet_and_a_wrong_signature_is_refused(buyer, client_for, make_offer, provider_user):
    from eth_account import Account
    from eth_account.messages import encode_defunct

    from contracts import receipts
    from ledger.models import Deployment
    from market.rounds import round_clear
    from tests.conftest import TEST_ESCROW, bid_body, escrow_credit

    Deployment.objects.create(chain_id=31337, rpc_url="http://127.0.0.1:9", market_address="0x5FbDB2315678afecb367f053371D33aA2a4B0c5A",
                              token_address="0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512", deployed_block=1)
    wallet = Account.create()
    client = client_for(buyer)
    message = client.post("/api/v1/me/wallet/challenge/", format="json").json()["message"]
    assert client.post("/api/v1/me/wallet/", {"address": wallet.address, "message": message,
                                              "signature": wallet.sign_message(encode_defunct(text=message)).signature.hex()}, format="json").status_code == 200
    escrow_credit(buyer, TEST_ESCROW, address=wallet.address)
    bid = client.post("/api/v1/bids/", bid_body(gpus=2), format="json").json()
    order = client.get(f"/api/v1/bids/{bid['id']}/order/").json()
    assert order["spec_message"] == receipts.spec_message(receipts.spec_hash(bid["job_spec"])) and order["spec_signed"] is False
    typed = wallet.sign_typed_data(full_message=order["typed_data"]).signature.hex()
    wrong = Account.create().sign_message(encode_defunct(text=order["spec_message"])).signature.hex()
    r = client.post(f"/api/v1/bids/{bid['id']}/order/sign/", {"signature": typed, "spec_signature": wrong}, format="json")
    assert r.status_code == 400 and "spec_signature" in r.json()["error"]["fields"]
    right = wallet.sign_message(encode_defunct(text=order["spec_message"])).signature.hex()
    r = client.post(f"/api/v1/bids/{bid['id']}/order/sign/", {"signature": typed, "spec_signature": right}, format="json")
    assert r.status_code == 200 and r.json()["spec_signed"] is True

    offer = make_offer(provider_user, count=4)
    round_clear()
    (a,) = client_for(provider_user).get(f"/api/v1/agent/machines/{offer.machine_id}/assignments/").json()["assignments"]
    assert a["buyer_address"] == wallet.address and receipts.spec_signer(a["job_spec"], a["spec_signature"]) == wallet.address


def test_a_jobs_output_reaches_its_buyer_live_and_after_it_ends(provider_user, buyer, stranger, client_for, make_job):
    job = make_job(provider_user)
    machine = job.trade.offer.machine_id
    agent = client_for(provider_user)
    post_event(agent, job, event="started")
    r = agent.post(f"/api/v1/agent/machines/{machine}/heartbeat/", {"gpus": [], "jobs": [{"job": job.pk, "progress": 0.3, "log_tail": "epoch 1 loss 0.91\n"}]}, format="json")
    assert r.status_code == 200
    assert client_for(buyer).get(f"/api/v1/jobs/{job.pk}/").json()["log_tail"] == "epoch 1 loss 0.91\n"
    r = agent.post(f"/api/v1/agent/machines/{machine}/heartbeat/", {"gpus": [], "jobs": [{"job": job.pk, "progress": 0.3, "log_tail": "x" * 9000}]}, format="json")
    assert r.status_code == 400 and any("log_tail" in k for k in r.json()["error"]["fields"]), r.json()
    post_event(agent, job, event="completed", exit_code=0, gpu_seconds=60, log_tail="epoch 3 loss 0.12\ndone\n")
    assert client_for(buyer).get(f"/api/v1/jobs/{job.pk}/").json()["log_tail"].endswith("done\n")

    from django.test import Client

    page = Client()
    page.force_login(buyer)
    html = page.get(f"/jobs/{job.pk}/")
    assert html.status_code == 200 and "epoch 3 loss 0.12" in html.content.decode()
    other = Client()
    other.force_login(stranger)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404


def test_a_job_that_publishes_ports_is_not_matched_to_a_machine_whose_agent_cannot(provider_user, buyer, client_for, make_offer, make_bid):
    # issue 32: the agent refused such a job after the round matched it (the trade then
    # refunded, the buyer waiting); its heartbeat now says what it can run, and the round
    # matches the job only where it will run
    from market.models import Bid, Trade
    from market.rounds import round_clear

    process = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_000_000)
    docker = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_800_000)
    agent = client_for(provider_user)
    r = agent.post(f"/api/v1/agent/machines/{process.machine_id}/heartbeat/", {"runs_containers": False, "publishes_ports": False}, format="json")
    assert r.status_code == 200, r.content
    process.machine.refresh_from_db()
    assert (process.machine.runs_containers, process.machine.publishes_ports) == (False, False)
    assert agent.post(f"/api/v1/agent/machines/{docker.machine_id}/heartbeat/", {"runs_containers": "maybe"}, format="json").status_code == 400

    web = make_bid(buyer, gpus=1, gpu_models=["A100-SXM-80GB"], max_price=2_000_000, job_spec={"image": "jupyter:1", "ports": [8888]})
    plain = make_bid(buyer, gpus=1, gpu_models=["A100-SXM-80GB"], max_price=2_000_000, job_spec={"command": ["python", "x.py"]})
    round_clear(slot=41_000_001)
    assert Trade.objects.get(bid=web).offer_id == docker.pk, "the dearer machine that can publish the port"
    assert Trade.objects.get(bid=plain).offer_id == process.pk
    docker.machine.publishes_ports = False
    docker.machine.save(update_fields=["publishes_ports"])
    late = make_bid(buyer, gpus=1, gpu_models=["A100-SXM-80GB"], max_price=2_000_000, job_spec={"image": "jupyter:1", "ports": [6006]})
    round_clear(slot=41_000_002)
    late = Bid.objects.get(pk=late.pk)
    assert late.state == "open" and "cannot publish ports" in str(late.explanation), late.explanation


HOST = {"cpu_model": "AMD EPYC 9454 48-Core Processor", "cpu_cores": 96, "ram_gib": 512, "disk_gb": 1800, "net_down_mbps": 9400, "net_up_mbps": 4700,
        "driver_version": "550.54.15", "cuda_version": "12.4", "runtime": "docker", "topology": {"0-1": "nvlink"}}


def test_a_heartbeat_reports_the_host_and_a_bad_one_is_refused_by_field(provider_user, make_offer, client_for):
    # issue 32, host details: the agent reports CPU, RAM, disk, bandwidth, CUDA and topology
    o = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_000_000)
    agent = client_for(provider_user)
    url = f"/api/v1/agent/machines/{o.machine_id}/heartbeat/"
    assert agent.post(url, {"host": HOST}, format="json").status_code == 200
    m = o.machine
    m.refresh_from_db()
    assert (m.cpu_model, m.cpu_cores, m.ram_gib, m.disk_gb, m.net_down_mbps, m.net_up_mbps) == ("AMD EPYC 9454 48-Core Processor", 96, 512, 1800, 9400, 4700)
    assert (m.driver_version, m.cuda, m.cuda_version, m.runtime, m.topology) == ("550.54.15", 1204, "12.4", "docker", {"0-1": "nvlink"})
    machine = agent.get(f"/api/v1/machines/{m.pk}/").json()
    assert machine["host"]["cuda_version"] == "12.4" and machine["host"]["disk_gb"] == 1800
    # a beat that leaves a figure out keeps it; one that sends it replaces it
    assert agent.post(url, {"host": {"disk_gb": 1750}}, format="json").status_code == 200
    m.refresh_from_db()
    assert (m.disk_gb, m.net_down_mbps) == (1750, 9400)
    for bad, field in [({"cuda_version": "twelve"}, "cuda_version"), ({"cuda_version": "12.4.1"}, "cuda_version"), ({"ram_gib": -1}, "ram_gib"),
                       ({"runtime": "lxc"}, "runtime"), ({"topology": {"1-0": "nvlink"}}, "topology"), ({"topology": {"0-1": "NV LINK"}}, "topology"),
                       ({"cpu_model": "x" * 200}, "cpu_model"), ({"disk_gb": "lots"}, "disk_gb")]:
        r = agent.post(url, {"host": bad}, format="json")
        assert r.status_code == 400, (bad, r.content)
        assert field in str(r.json()["error"]["fields"]), (bad, r.json())
    m.refresh_from_db()
    assert (m.cuda, m.ram_gib, m.runtime) == (1204, 512, "docker"), "a refused beat changes nothing"


def test_a_round_matches_a_job_only_to_a_host_that_meets_its_needs(provider_user, buyer, make_offer, make_bid, client_for):
    from market.models import Bid, Trade
    from market.rounds import round_clear

    old = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_000_000)
    new = make_offer(provider_user, model="A100-SXM-80GB", count=2, price=1_800_000)
    agent = client_for(provider_user)
    for o, cuda in ((old, "11.8"), (new, "12.4")):
        assert agent.post(f"/api/v1/agent/machines/{o.machine_id}/heartbeat/", {"host": {**HOST, "cuda_version": cuda}}, format="json").status_code == 200
    api = client_for(buyer)
    body = {"job_spec": {"command": ["python", "x.py"]}, "gpus": 1, "gpu_models": ["A100-SXM-80GB"], "max_price": 2_000_000, "duration_s": 3600,
            "min_cuda": "12.2", "min_disk_gb": 1000, "min_ram_gib": 256, "min_net_down_mbps": 5000}
    r = api.post("/api/v1/bids/", body, format="json")
    assert r.status_code == 201, r.content
    placed = r.json()
    assert (placed["min_cuda"], placed["min_disk_gb"], placed["min_ram_gib"], placed["min_net_down_mbps"]) == ("12.2", 1000, 256, 5000)
    plain = make_bid(buyer, gpus=1, gpu_models=["A100-SXM-80GB"], max_price=2_000_000)
    round_clear(slot=41_000_011)
    assert Trade.objects.get(bid_id=placed["id"]).offer_id == new.pk, "the dearer machine with CUDA 12.4"
    assert Trade.objects.get(bid=plain).offer_id == old.pk
    late = api.post("/api/v1/bids/", {**body, "min_cuda": "12.6"}, format="json").json()
    round_clear(slot=41_000_012)
    assert "CUDA 12.6 or more" in str(Bid.objects.get(pk=late["id"]).explanation)
    for bad in ({"min_cuda": "twelve"}, {"min_cuda": "12.4.1"}, {"min_cuda": True}, {"min_disk_gb": -5}, {"min_net_down_mbps": "fast"}):
        r = api.post("/api/v1/quote/", {**body, **bad}, format="json")
        assert r.status_code == 400 and next(iter(bad)) in r.json()["error"]["fields"], (bad, r.content)


def test_the_speedtest_moves_what_it_says_and_refuses_what_it_cannot(provider_user, buyer, client_for):
    # what `gridbid-agent benchmark` times to measure bandwidth to the market
    agent = client_for(provider_user)
    r = agent.get("/api/v1/agent/speedtest/", {"bytes": 300_000})
    assert r.status_code == 200 and r["Content-Length"] == "300000"
    assert len(b"".join(r.streaming_content)) == 300_000
    assert agent.generic("PUT", "/api/v1/agent/speedtest/", b"x" * 200_000, content_type="application/octet-stream").json() == {"received": 200_000}
    assert agent.get("/api/v1/agent/speedtest/", {"bytes": 64 * 2**20 + 1}).status_code == 400
    assert agent.get("/api/v1/agent/speedtest/", {"bytes": "lots"}).status_code == 400
    assert agent.generic("PUT", "/api/v1/agent/speedtest/", b"", content_type="application/octet-stream").status_code == 400
    assert client_for(buyer).get("/api/v1/agent/speedtest/", {"bytes": 10}).status_code == 403, "a provider's endpoint"


def test_a_round_preempts_the_spot_job_a_waiting_on_demand_bid_needs_and_then_matches_it(provider_user, buyer, make_offer, make_bid, client_for):
    # issue 31: the round acted on nothing ("spot job ... blocks on_demand bid" in its stats),
    # and an offer spot jobs filled was not in the round at all ("no offers of A10-24GB")
    from market.models import AuctionRound, Bid, Job, Trade
    from market.rounds import round_clear

    offer = make_offer(provider_user, model="A10-24GB", count=2, price=1_000_000)
    spot = make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot", preempt_grace_s=12)
    round_clear(slot=41_000_021)
    job = Job.objects.get(trade__bid=spot)
    agent = client_for(provider_user)
    assert post_event(agent, job, event="started").status_code == 200
    offer.refresh_from_db()
    assert offer.gpus_free == 0
    urgent = make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=3_000_000, klass="on_demand")
    rnd = round_clear(slot=41_000_022)
    assert not Trade.objects.filter(bid=urgent).exists(), "its GPUs are not free until the spot job stops"
    job.refresh_from_db()
    meta = job.checkpoint
    assert meta["preempt_requested"] and meta["preempted_by_round"] == rnd.number and meta["preempted_for_bid"] == urgent.pk
    assert "preempted by round" in meta["preempt_reason"] and rnd.stats["preempted_jobs"] == [job.pk]
    assert "1 spot job is told to stop for you" in " ".join(Bid.objects.get(pk=urgent.pk).explanation["reasons"])
    (a,) = agent.get(f"/api/v1/agent/machines/{offer.machine_id}/assignments/").json()["assignments"]
    assert a["preempt"] is True and a["grace_s"] == 12, "the bid's shorter grace"
    # the next round does not preempt it again, nor anything else, while it stops
    assert round_clear(slot=41_000_023).stats["preempted_jobs"] == []
    ck = {"size": 1234, "sha256": "ab" * 32, "url": "https://store.example/ck.tar"}
    r = post_event(agent, job, event="preempted", gpu_seconds=2 * 30, checkpoint=ck)
    assert r.status_code == 200 and r.json()["state"] == "preempted", r.content
    round_clear(slot=41_000_024)
    (won,) = Trade.objects.filter(bid=urgent)
    assert won.offer_id == offer.pk
    job.refresh_from_db()
    follow = Bid.objects.filter(pk=job.checkpoint.get("continued_by_bid", 0)).first()
    assert follow is not None and follow.state == "open" and follow.preempt_grace_s == 12, "the rest waits, with its grace"
    assert AuctionRound.objects.count() == 4


def test_a_bid_may_shorten_the_preemption_grace_but_not_lengthen_it(buyer, client_for):
    from tests.conftest import bid_body

    api = client_for(buyer)
    r = api.post("/api/v1/quote/", bid_body(klass="spot", preempt_grace_s=31), format="json")
    assert r.status_code == 400 and "At most 30 s" in str(r.json()["error"]["fields"]["preempt_grace_s"]), r.content
    assert api.post("/api/v1/quote/", bid_body(klass="spot", preempt_grace_s=0), format="json").status_code == 400
    assert api.post("/api/v1/quote/", bid_body(klass="spot", preempt_grace_s=10), format="json").status_code == 200


def test_a_lent_offer_sells_to_spot_only_and_its_owner_takes_it_back(provider_user, other_provider_user, buyer, make_offer, make_bid, client_for):
    # issue 31, tides: GPUs lent while their owner does not need them (reclaimable) sell as
    # spot only, and reclaiming them preempts the spot jobs on them
    from market.models import Bid, Job, Offer, Trade
    from market.rounds import round_clear

    provider = client_for(provider_user)
    plain = make_offer(provider_user, model="A10-24GB", count=2, price=1_000_000)
    r = provider.patch(f"/api/v1/offers/{plain.pk}/", {"reclaimable": True, "spot_allowed": False}, format="json")
    assert r.status_code == 400 and "spot_allowed" in r.json()["error"]["fields"], r.content
    assert provider.post(f"/api/v1/offers/{plain.pk}/reclaim/").status_code == 409, "only a lent offer is reclaimed"
    r = provider.patch(f"/api/v1/offers/{plain.pk}/", {"reclaimable": True}, format="json")
    assert r.status_code == 200 and r.json()["reclaimable"] is True
    urgent = make_bid(buyer, gpus=1, gpu_models=["A10-24GB"], max_price=3_000_000, klass="on_demand")
    spot = make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot")
    round_clear(slot=41_000_031)
    assert not Trade.objects.filter(bid=urgent).exists() and "lent by owners" in str(Bid.objects.get(pk=urgent.pk).explanation)
    job = Job.objects.get(trade__bid=spot)
    assert post_event(provider, job, event="started").status_code == 200
    assert client_for(other_provider_user).post(f"/api/v1/offers/{plain.pk}/reclaim/").status_code == 404

    r = provider.post(f"/api/v1/offers/{plain.pk}/reclaim/")
    assert r.status_code == 200, r.content
    assert r.json()["preempted_jobs"] == [job.pk] and (r.json()["offer"]["state"], r.json()["offer"]["paused_by"]) == ("paused", "reclaimed")
    job.refresh_from_db()
    assert job.checkpoint["preempt_requested"] and "reclaimed by its owner" in job.checkpoint["preempt_reason"]
    (a,) = provider.get(f"/api/v1/agent/machines/{plain.machine_id}/assignments/").json()["assignments"]
    assert a["preempt"] is True
    assert provider.post(f"/api/v1/offers/{plain.pk}/reclaim/").json()["preempted_jobs"] == [], "once"
    assert post_event(provider, job, event="preempted", gpu_seconds=20).status_code == 200
    late = make_bid(buyer, gpus=1, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot")
    round_clear(slot=41_000_032)
    assert not Trade.objects.filter(bid=late).exists(), "not sold while its owner has it"
    assert provider.patch(f"/api/v1/offers/{plain.pk}/", {"state": "open"}, format="json").status_code == 200
    round_clear(slot=41_000_033)
    assert Trade.objects.get(bid=late).offer_id == plain.pk and Offer.objects.get(pk=plain.pk).state == "open"
    # the provider sees what its lent GPUs did
    from django.test import Client

    web = Client()
    web.force_login(provider_user)
    page = web.get("/provider/").content.decode()
    assert "0.006</b> GPU-hours sold in 2 spot trades" in page and "taken back from 1 running job" in page, page[page.find('id="lent"'):][:600]


def test_an_extension_is_never_preempted_apart_from_the_job_it_extends(provider_user, buyer, make_job, make_bid):
    # review: the extension's trade (a spot bid of its own, its Job mirroring the running one)
    # was a second "running job" on the same GPUs, cheaper, so the round preempted it alone
    from django.test import Client
    from django.utils import timezone

    from market import repository
    from market.models import Bid, Trade
    from market.rounds import round_clear
    from tests.conftest import escrow_credit

    job = make_job(provider_user, gpus=2, count=2, duration_s=3600)
    Bid.objects.filter(pk=job.trade.bid_id).update(klass="spot")
    from market.jobs import job_event

    job_event(user=provider_user, job_id=job.pk, event="started")
    escrow_credit(buyer, 10 * 10**6)
    c = Client()
    c.force_login(buyer)
    assert c.post(f"/jobs/{job.pk}/extend/", {"hours": "1", "ask": job.trade.offer.price}).status_code == 302
    assert Trade.objects.filter(extends=job.trade).exists()
    assert [j.trade_id for j in repository.snapshot(now=timezone.now()).running] == [job.trade_id]
    make_bid(buyer, gpus=2, gpu_models=[job.trade.gpu_model_id], max_price=job.trade.price * 3, klass="on_demand")
    assert round_clear(slot=41_000_041).stats["preempted_jobs"] == [job.pk]


def test_a_checkpoint_kept_by_the_market_is_read_by_whoever_resumes_it_and_its_url_is_its_own(provider_user, other_provider_user, buyer, make_job, client_for):
    # review: the resuming provider's check compared a JSON key with a subquery (no jsonb =
    # bigint on PostgreSQL); and a market: URL other than the job's own would have the
    # resuming agent send its token wherever the rest of the text pointed
    from django.core.files.base import ContentFile
    from django.utils import timezone

    from contracts.receipts import CHECKPOINT_OUTPUT, checkpoint_url
    from market.models import Bid, JobOutput
    from market.outputs import outputs_storage

    job = make_job(provider_user, gpus=1)
    agent = client_for(provider_user)
    assert post_event(agent, job, event="started").status_code == 200
    for bad in ("market:@evil.example/x", "market:.evil.example/x", checkpoint_url(job.pk + 1)):
        r = post_event(agent, job, event="preempted", gpu_seconds=10, checkpoint={"size": 3, "sha256": "ab" * 32, "url": bad})
        assert r.status_code == 400 and "checkpoint" in r.json()["error"]["fields"], (bad, r.content)
    body = b"ckp"
    name = outputs_storage().save(f"jobs/{job.pk}/{CHECKPOINT_OUTPUT}", ContentFile(body))
    JobOutput.objects.create(job=job, path=CHECKPOINT_OUTPUT, size=3, sha256="ab" * 32, storage_name=name, expires_at=timezone.now() + timezone.timedelta(days=1))
    url = f"/api/v1/jobs/{job.pk}/outputs/{CHECKPOINT_OUTPUT}"
    assert client_for(other_provider_user).get(url).status_code == 404, "resumes nothing of it"
    rest = make_job(other_provider_user, gpus=1)
    Bid.objects.filter(pk=rest.trade.bid_id).update(resume_from={"url": checkpoint_url(job.pk), "sha256": "ab" * 32, "size": 3, "trade": job.trade_id})
    r = client_for(other_provider_user).get(url)
    assert r.status_code == 200 and b"".join(r.streaming_content) == body
    assert client_for(buyer).get(url).status_code == 200, "the buyer reads it like any output"


def test_a_lent_offers_reclaim_hours_take_it_back_as_they_begin_and_lend_it_again_as_they_end(provider_user, buyer, make_offer, make_bid, client_for):
    # issue 31, tides: a reclaim schedule ("08-20" UTC) run by the market before each round
    from datetime import timedelta
    from unittest import mock

    from django.utils import timezone

    from market.models import Bid, Job, Offer, Trade
    from market.rounds import round_clear
    from providers.models import Machine

    provider = client_for(provider_user)
    offer = make_offer(provider_user, model="A10-24GB", count=2, price=1_000_000)
    Machine.objects.filter(pk=offer.machine_id).update(state="online")
    url = f"/api/v1/offers/{offer.pk}/"
    # the hour after next is reclaimed: now is outside it, in an hour inside, in two past it
    night = timezone.now()
    morning = night.replace(minute=0, second=5, microsecond=0) + timedelta(hours=1)
    evening = morning + timedelta(hours=1)
    hours = f"{morning.hour:02d}-{evening.hour or 24:02d}"
    r = provider.patch(url, {"reclaim_hours": "08-20"}, format="json")
    assert r.status_code == 400 and "Only a lent (reclaimable) offer has reclaim hours" in r.content.decode(), r.content
    for bad, says in (("8-8", "empty range"), ("25", "an hour starts at 0-23"), ("mornings", "not a range of UTC hours"),
                      ("0-24", "never lent")):
        r = provider.patch(url, {"reclaimable": True, "reclaim_hours": bad}, format="json")
        assert r.status_code == 400 and says in str(r.json()["error"]["fields"]["reclaim_hours"]), (bad, r.content)
    r = provider.patch(url, {"reclaimable": True, "reclaim_hours": " 8-12, 12-20 "}, format="json")
    assert r.status_code == 200 and r.json()["reclaim_hours"] == "08-20", r.content
    r = provider.patch(url, {"reclaim_hours": hours}, format="json")
    assert r.status_code == 200 and r.json()["reclaim_hours"] == hours, r.content

    spot = make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot")
    round_clear(now=night, slot=41_000_041)
    job = Job.objects.get(trade__bid=spot)
    assert post_event(provider, job, event="started").status_code == 200

    late = make_bid(buyer, gpus=1, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot")
    round_clear(now=morning, slot=41_000_042)
    offer.refresh_from_db()
    assert (offer.state, offer.paused_by) == ("paused", "schedule")
    job.refresh_from_db()
    assert job.checkpoint["preempt_requested"] and f"reclaim hours ({hours} UTC)" in job.checkpoint["preempt_reason"]
    assert not Trade.objects.filter(bid=late).exists()
    from django.test import Client

    web = Client()
    web.force_login(provider_user)
    page = web.get("/provider/").content.decode()
    assert f"lent, taken back {hours} UTC" in page and "in its reclaim hours: lent again as they end" in page, page[page.find("<tbody"):][:1500]
    # reopening it by hand within its hours is refused, saying how
    with mock.patch("django.utils.timezone.now", return_value=morning):
        r = provider.patch(url, {"state": "open"}, format="json")
    assert r.status_code == 409 and "reopens by itself" in r.content.decode(), r.content
    assert post_event(provider, job, event="preempted", gpu_seconds=20).status_code == 200

    round_clear(now=evening, slot=41_000_043)
    offer.refresh_from_db()
    assert (offer.state, offer.paused_by) == ("open", "")
    # lent again as its hours end
    assert Trade.objects.get(bid=late).offer_id == offer.pk, Bid.objects.get(pk=late.pk).explanation
    # taken back by hand within no schedule: the schedule never reopens it
    assert provider.post(f"/api/v1/offers/{offer.pk}/reclaim/").status_code == 200
    round_clear(now=evening + timedelta(minutes=1), slot=41_000_044)
    assert Offer.objects.get(pk=offer.pk).paused_by == "reclaimed"


def test_a_preempted_jobs_buyer_is_told_why_the_rest_has_not_resumed(provider_user, buyer, make_job, client_for):
    # issue 31: a job preempted without a checkpoint, or whose market-kept checkpoint is not
    # in yet, said only "not resumed: too little time was left, or no checkpoint"
    from contracts.receipts import checkpoint_url
    from market.jobs import job_preempt_request

    agent, api = client_for(provider_user), client_for(buyer)
    bare = make_job(provider_user, gpus=1)
    assert post_event(agent, bare, event="started").status_code == 200
    job_preempt_request(job=bare, reason="spot capacity reclaimed")
    assert api.get(f"/api/v1/jobs/{bare.pk}/").json()["preemption"]["not_resumed"] is None, "still stopping"
    assert post_event(agent, bare, event="preempted", gpu_seconds=10).status_code == 200
    pre = api.get(f"/api/v1/jobs/{bare.pk}/").json()["preemption"]
    assert pre["resumed"] is None and "left no checkpoint" in pre["not_resumed"], pre

    kept = make_job(provider_user, gpus=1)
    assert post_event(agent, kept, event="started").status_code == 200
    job_preempt_request(job=kept, reason="spot capacity reclaimed")
    r = post_event(agent, kept, event="preempted", gpu_seconds=10, checkpoint={"size": 3, "sha256": "ab" * 32, "url": checkpoint_url(kept.pk)})
    assert r.status_code == 200, r.content
    pre = api.get(f"/api/v1/jobs/{kept.pk}/").json()["preemption"]
    assert pre["resumed"] is None and "waiting for its agent to upload the checkpoint" in pre["not_resumed"], pre
    from django.test import Client

    web = Client()
    web.force_login(buyer)
    page = web.get(f"/jobs/{kept.pk}/").content.decode()
    assert "not resumed: waiting for its agent to upload the checkpoint" in page
