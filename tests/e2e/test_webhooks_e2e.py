"""A real `gridbid up` server (embedded: its Celery worker for the notify queue runs in the
process) tells a buyer's webhook, on a real HTTP receiver, that its bid was matched and that
the job a real `gridbid-agent` ran started and completed; each request signed."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import httpx
import pytest

from tests.e2e.conftest import running_server
from tests.e2e.funds import TOKENS, escrow_deposit, make_tokens
from tests.e2e.test_agent_e2e import join_market, start_daemon, stop_daemons
from tests.receiver import verify, wait_for_events

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def hooked_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    # the receiver listens on 127.0.0.1: a private address, allowed here only
    with running_server(tmp_path_factory.mktemp("hooked"), demo=False, extra_env={"WEBHOOK_ALLOW_PRIVATE_URLS": "true"}) as (base, env):
        yield base, env



def test_a_buyers_webhook_hears_its_bid_matched_and_its_job_run_and_complete(hooked_server, receiver, tmp_path):
    server, env = hooked_server
    tokens = make_tokens(env, gpuhost=("provider", ("read", "provide")), trainer=("buyer", ("read", "trade", "tokens")))
    buyer = {"Authorization": f"Bearer {tokens['trainer']}"}
    r = httpx.post(f"{server}/api/v1/webhooks/", headers=buyer, json={"url": receiver.url, "events": ["bid.matched", "job.running", "job.completed"]})
    assert r.status_code == 201, r.text
    hook = r.json()

    home, machine = join_market(server, tmp_path, "gpuhost", tokens["gpuhost"], region="eu-west", price="1.50")
    daemons = [start_daemon(home, seconds=90)]
    try:
        escrow_deposit(server, env, "trainer", buyer, 1 * TOKENS)
        spec = {"command": [sys.executable, "-c", "print('trained', flush=True)"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 1, "gpu_models": ["H100-SXM-80GB"], "max_price": 3_000_000, "duration_s": 60})
        assert r.status_code == 201, r.text
        bid = r.json()["id"]

        got = wait_for_events(receiver, ["bid.matched", "job.running", "job.completed"], seconds=60)
        assert got == ["bid.matched", "job.running", "job.completed"], (got, (home / "daemon.log").read_text()[-2000:])
    finally:
        stop_daemons(daemons)

    matched, running, completed = (verify(hook["secret"], request) for request in receiver.requests)
    assert matched["data"]["bid"] == bid and matched["data"]["role"] == "buyer"
    [trade] = matched["data"]["trades"]
    job = trade["job"]
    assert running["data"]["job"]["id"] == job and running["data"]["job"]["started_at"]
    assert completed["data"]["job"]["id"] == job and completed["data"]["job"]["exit_code"] == 0
    assert httpx.get(f"{server}/api/v1/jobs/{job}/", headers=buyer).json()["machine"] == machine

    log = httpx.get(f"{server}/api/v1/webhooks/{hook['id']}/deliveries/", headers=buyer).json()["results"]
    assert [(d["event_type"], d["state"], d["status_code"]) for d in log] == [
        ("job.completed", "delivered", 200), ("job.running", "delivered", 200), ("bid.matched", "delivered", 200),
    ]
