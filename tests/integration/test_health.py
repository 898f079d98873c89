"""`/healthz` says the process answers; `/readyz` checks each part GridBid depends on and
names the ones that fail. Real PostgreSQL, a real anvil for the chain, a closed port for a
node that is down."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from tests.integration.helpers import OPERATOR_KEY

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_readiness() -> None:
    from gridbid.health import readiness_cache_clear

    readiness_cache_clear()


def readyz() -> tuple[int, dict[str, Any]]:
    response = Client().get("/readyz")
    assert response["Content-Type"] == "application/json"
    return response.status_code, response.json()


def test_healthz_answers_ok_while_the_process_runs() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.content == b"ok"


def test_readyz_is_200_with_each_part_ok_when_all_is_well(ctx: Any) -> None:
    status, body = readyz()
    assert status == 200, body
    assert body["status"] == "ready"
    checks = body["checks"]
    assert checks["database"]["status"] == "ok"
    assert checks["redis"]["status"] == "skipped"  # the test settings run embedded
    assert checks["chain"]["status"] == "ok"
    assert checks["chain"]["detail"] == f"head block {ctx.client.block_number()}"
    assert checks["rounds"]["status"] == "ok"
    assert checks["listener"]["status"] == "ok"
    assert checks["outbox"] == {"status": "ok", "detail": "empty", "ms": 0.0}


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but never listened on: connections to it are refused, and nothing
    else can listen there during the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def test_readyz_names_the_chain_when_its_node_is_down(dead_port: int) -> None:
    from ledger.context import chain_context_reset
    from ledger.models import Deployment

    dead = f"http://127.0.0.1:{dead_port}"
    Deployment.objects.create(chain_id=31337, rpc_url=dead, market_address="0x" + "11" * 20, token_address="0x" + "22" * 20, deployed_block=1)
    chain_context_reset()
    status, body = readyz()
    assert status == 503
    assert body["status"] == "not_ready"
    assert list(body["error"]["fields"]) == ["chain"]
    assert body["error"]["code"] == "not_ready"
    assert "does not answer eth_blockNumber" in body["checks"]["chain"]["detail"]
    assert body["checks"]["listener"]["status"] == "skipped"
    # a refused connection is answered at once: no retries with backoff inside a probe
    assert body["checks"]["chain"]["ms"] < 2500


def test_readyz_names_the_rounds_when_the_last_round_is_stale_with_open_bids(buyer: Any, make_bid: Any) -> None:
    from market.models import AuctionRound

    make_bid(buyer)
    rnd = AuctionRound.objects.create(number=1, scheduled_for=timezone.now(), state="cleared")
    AuctionRound.objects.filter(pk=rnd.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    status, body = readyz()
    assert status == 503
    assert list(body["error"]["fields"]) == ["rounds"]
    detail = body["checks"]["rounds"]["detail"]
    assert "round (#1) started 600 s ago" in detail and "1 open bids" in detail


def test_readyz_does_not_fail_an_old_round_when_no_bid_waits() -> None:
    from market.models import AuctionRound

    rnd = AuctionRound.objects.create(number=1, scheduled_for=timezone.now(), state="cleared")
    AuctionRound.objects.filter(pk=rnd.pk).update(started_at=timezone.now() - timedelta(hours=5))
    status, body = readyz()
    assert status == 200, body
    assert body["checks"]["rounds"] == {"status": "ok", "detail": "no open bids to clear", "ms": 0.0}


def test_readyz_names_the_outbox_when_a_transaction_is_stuck() -> None:
    from ledger.models import ChainTx

    ChainTx.objects.create(purpose="record", key="record:1", chain_id=31337, sender="0x" + "ab" * 20, nonce=0,
                           tx_hash="0x" + "01" * 32, raw="0x00", state="sent", signed_at=timezone.now() - timedelta(hours=1))
    status, body = readyz()
    assert status == 503
    assert list(body["error"]["fields"]) == ["outbox"]
    assert "1 transaction(s) unconfirmed for over 900 s (oldest 3600 s)" in body["checks"]["outbox"]["detail"]


def test_readyz_names_a_nonce_gap_the_outbox_can_never_fill(ctx: Any) -> None:
    from ledger.chain import signer_from_hex
    from ledger.models import ChainTx

    operator = signer_from_hex(OPERATOR_KEY).address
    mined = ctx.client.pending_nonce(operator)
    # a fresh transaction waiting at nonce mined+3: nonces mined..mined+2 were never stored, never sent
    ChainTx.objects.create(purpose="record", key="record:gap", chain_id=31337, sender=operator, nonce=mined + 3,
                           tx_hash="0x" + "02" * 32, raw="0x00", state="sent", signed_at=timezone.now())
    status, body = readyz()
    assert status == 503
    assert list(body["error"]["fields"]) == ["outbox"]
    assert f"the chain expects nonce {mined}, the outbox waits at {mined + 3}" in body["checks"]["outbox"]["detail"]


def test_readyz_names_the_listener_when_it_falls_behind_the_head(ctx: Any) -> None:
    from ledger.models import ListenerCursor

    ListenerCursor.objects.create(deployment=ctx.deployment, scanned_to=1, applied_to=1)
    ctx.client.rpc("anvil_mine", [hex(300)])
    status, body = readyz()
    assert status == 503
    assert list(body["error"]["fields"]) == ["listener"]
    lag = ctx.client.block_number() - 1
    assert body["checks"]["listener"]["detail"].startswith(f"{lag} blocks behind the head (over 200)")


def test_readyz_names_redis_when_it_does_not_answer(settings: Any, dead_port: int) -> None:
    import dataclasses

    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=f"redis://127.0.0.1:{dead_port}/0")
    status, body = readyz()
    assert status == 503
    assert list(body["error"]["fields"]) == ["redis"]
    assert "REDIS_URL does not answer PING" in body["checks"]["redis"]["detail"]


def test_readyz_refuses_to_be_written_to() -> None:
    assert Client().post("/readyz").status_code == 405


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers: a hung Redis or node."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def test_a_hung_redis_and_a_hung_node_cannot_hang_readyz(settings: Any, silent_port: int) -> None:
    import dataclasses
    import time

    import ledger.chain  # noqa: F401 - a server has imported web3 long before; a cold import is no probe's time
    from ledger.models import Deployment

    settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=f"redis://127.0.0.1:{silent_port}/0")
    Deployment.objects.create(chain_id=31337, rpc_url=f"http://127.0.0.1:{silent_port}", market_address="0x" + "11" * 20,
                              token_address="0x" + "22" * 20, deployed_block=1)
    started = time.monotonic()
    status, body = readyz()
    elapsed = time.monotonic() - started
    assert status == 503
    assert sorted(body["error"]["fields"]) == ["chain", "redis"]
    # both probes run side by side, each under its 2 s socket timeout
    assert elapsed < 4.5, (elapsed, body)
    assert "Timeout" in body["checks"]["redis"]["detail"] or "timed out" in body["checks"]["redis"]["detail"]


def test_a_redis_that_is_not_there_is_reported_within_the_probes_timeout_not_after_retries() -> None:
    # what `gridbid up/worker/beat` run before they start (gridbid.cli.services_or_exit);
    # timed here, in-process, where a box's load cannot stretch it: the e2e test of the
    # refusal checks its message and exit code
    import time

    from gridbid.health import PROBE_TIMEOUT_S, probe_redis

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # bound, never listening: connections are refused
        started = time.monotonic()
        with pytest.raises(Exception, match="(?i)connect"):
            probe_redis(f"redis://127.0.0.1:{dead}/0")
        assert time.monotonic() - started < PROBE_TIMEOUT_S
