"""A round that preempts many spot jobs tells them all at once (issue 39): one read of the
jobs, one write, one hand-over of the agents' wakes and one JobsChanged once it commits. It
told them one by one, and each JobsChanged read and sent its provider's sales again after the
commit: in tests/bench/bench_round.py those handlers were a third of a round's publishing."""

from __future__ import annotations

from functools import partial

from market.models import Job
from market.rounds import round_clear
from market.streams import handlers

JOBS = 3


def test_a_round_tells_every_spot_job_it_preempts_in_one_go(provider_user, buyer, make_offer, make_bid, client_for,
                                                            django_capture_on_commit_callbacks) -> None:
    offers = [make_offer(provider_user, model="A10-24GB", count=2, price=1_000_000) for _ in range(JOBS)]
    spots = [make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=2_000_000, klass="spot") for _ in range(JOBS)]
    round_clear(slot=42_000_001)
    agent = client_for(provider_user)
    jobs = [Job.objects.get(trade__bid=s) for s in spots]
    for job in jobs:
        r = agent.post(f"/api/v1/agent/jobs/{job.pk}/events/", {"event": "started"}, format="json")
        assert r.status_code == 200, r.content
    urgent = [make_bid(buyer, gpus=2, gpu_models=["A10-24GB"], max_price=3_000_000, klass="on_demand") for _ in range(JOBS)]
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        rnd = round_clear(slot=42_000_002)
    assert rnd is not None and sorted(rnd.stats["preempted_jobs"]) == sorted(j.pk for j in jobs)
    changed = [c for c in callbacks if isinstance(c, partial) and c.func is handlers.jobs_changed]
    assert len(changed) == 1 and sorted(changed[0].args[0].job_ids) == sorted(j.pk for j in jobs)
    for job in jobs:
        job.refresh_from_db()
        meta = job.checkpoint
        assert meta["preempt_requested"] and meta["preempted_by_round"] == rnd.number
        assert meta["preempted_for_bid"] in {b.pk for b in urgent} and "preempted by round" in meta["preempt_reason"]
    assert {o.machine_id for o in offers} == {j.trade.offer.machine_id for j in jobs}
    for o in offers:
        (a,) = agent.get(f"/api/v1/agent/machines/{o.machine_id}/assignments/").json()["assignments"]
        assert a["preempt"] is True
