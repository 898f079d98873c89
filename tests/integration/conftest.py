"""Fixtures shared by the integration suites: a real anvil (one per module, reverted to a
snapshot per test), the chain context on it, jobs made directly with the ORM, and the real
agent daemon driven in-process."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from market.api.serializers import BidCreateSerializer
from market.bookings import booking_hold, capacity_refresh
from market.models import AuctionRound, Bid, Job, Offer, Trade
from tests.conftest import bid_body, service_missing
from tests.integration.helpers import OPERATOR_KEY, DjangoTransport
from tests.workers import free_port

_rounds = itertools.count(1)


@pytest.fixture
def make_job(make_offer, make_bid, buyer):
    def make(user, *, offer=None, gpus=2, duration_s=3600, trade_state="recorded", job_spec=None, count=4) -> Job:
        offer = offer or make_offer(user, count=count)
        data = BidCreateSerializer(data=bid_body(gpus=gpus, duration_s=duration_s, **({"job_spec": job_spec} if job_spec else {})))
        data.is_valid(raise_exception=True)
        bid = Bid.objects.create(buyer=buyer, state="matched", **data.validated_data)  # matched: made with the ORM, past the book
        rnd = AuctionRound.objects.create(number=next(_rounds), scheduled_for=timezone.now())
        trade = Trade.objects.create(
            round=rnd, bid=bid, offer=offer, buyer=buyer, provider=offer.machine.provider, gpu_model=offer.gpu_model,
            region=offer.machine.region, price=offer.price, gpus=gpus, duration_s=duration_s,
            amount=offer.price * gpus * duration_s // 3600, state=trade_state,
        )
        # as a round does: the trade books its GPUs under the offer's lock
        with transaction.atomic():
            locked = Offer.objects.select_for_update().get(pk=offer.pk)
            booking_hold(trade=trade, offer=locked, now=timezone.now())
            capacity_refresh(offer_ids=[offer.pk])
        return Job.objects.create(trade=trade)

    return make


@pytest.fixture(scope="module")
def anvil() -> Iterator[dict[str, Any]]:
    from ledger.chain import ChainClient
    from ledger.chain.anvil import AnvilNotFound, find_anvil, start_anvil, stop_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(str(exc))
    port = free_port()
    proc = start_anvil(port=port)
    try:
        url = f"http://127.0.0.1:{port}"
        client = ChainClient(url)
        from contracts.deploy import deploy_all
        from ledger.chain import signer_from_hex

        operator = signer_from_hex(OPERATOR_KEY)
        addrs = deploy_all(client.w3, deployer=operator.address, operator=operator.address, arbiter=operator.address)
        block = client.block_number()
        snapshot = client.rpc("evm_snapshot")
        yield {"url": url, "client": client, "snapshot": snapshot, "block": block, **addrs}
    finally:
        stop_anvil(proc)


@pytest.fixture
def ctx(anvil: dict[str, Any], db: Any) -> Iterator[Any]:
    from ledger.context import chain_context, chain_context_reset
    from ledger.models import Deployment

    client = anvil["client"]
    client.rpc("evm_revert", [anvil["snapshot"]])
    anvil["snapshot"] = client.rpc("evm_snapshot")
    client.rpc("evm_setAutomine", [True])
    Deployment.objects.create(chain_id=31337, rpc_url=anvil["url"], market_address=anvil["market"], token_address=anvil["token"], deployed_block=1)
    chain_context_reset()
    context = chain_context()
    assert context is not None
    context.confirmations = 1
    yield context
    chain_context_reset()


@pytest.fixture
def agent_for(tmp_path, client_for):
    from providers.agent import keys
    from providers.agent.client import MarketClient
    from providers.agent.config import AgentConfig
    from providers.agent.daemon import Agent
    from providers.agent.inventory import declared_inventory
    from providers.agent.state import State

    def make(user, machine, **cfg):
        home = tmp_path / f"agent-{machine.id}"
        keys.create_keys(home, kdf_iterations=2)
        bls_key = keys.load_bls(home)
        user.provider.bls_public_key = bls_key.public_key.hex()
        user.provider.save()
        raw = client_for(user, ["read", "provide"]).raw_token
        client = MarketClient("http://testserver", raw, transport=DjangoTransport())  # type: ignore[arg-type]
        inv = declared_inventory({"host": f"h{machine.id}", "gpus": [{"name": g.model.name, "model": g.model_id, "index": g.index, "uuid": g.uuid} for g in machine.gpus.all()]})
        config = AgentConfig(market_url="http://testserver", token=raw, machine_name=machine.name, machine_id=machine.id, heartbeat_s=0.2, poll_s=0.2, grace_s=3, **cfg)
        return Agent(home=home, config=config, client=client, state=State(home / "state.sqlite3"), inventory=inv, bls_key=bls_key, account=keys.load_eth(home))

    return make


@pytest.fixture(scope="module")
def redis_url() -> str:
    """This worker's own Redis database (tests/settings.py), emptied of what a killed run
    left there; FLUSHDB touches no other worker's database."""
    import redis
    from django.conf import settings

    from tests.conftest import service_missing

    url: str = settings.TEST_REDIS_URL
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2) as client:
            client.flushdb()
    except Exception as exc:
        service_missing(f"Redis at {url} is unreachable ({exc}); set TEST_REDIS_URL")
    return url
