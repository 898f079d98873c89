"""The provider faucet (POST /api/v1/ledger/faucet/): test tokens and gas for a provider's
proven agent address on the dev chain only, once an hour per address; refused, with what to
do instead, everywhere else."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from tests.integration.helpers import sync_chain

pytestmark = pytest.mark.django_db

ADDRESS = "0x90F79bf6EB2c4f870365E785982E1f101E93b906"  # anvil account 3: no other test uses it
URL = "/api/v1/ledger/faucet/"


@pytest.fixture
def faucet_cache() -> Any:
    from django.core.cache import cache

    cache.delete(f"gridbid:faucet:provider:{ADDRESS.lower()}")
    yield cache
    cache.delete(f"gridbid:faucet:provider:{ADDRESS.lower()}")


def _proven(provider_user: Any) -> Any:
    provider = provider_user.provider
    provider.chain_address = ADDRESS
    provider.save()
    return provider


def _configure(settings: Any, **changes: Any) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, **changes)


def test_the_faucet_is_refused_off_the_dev_chain_with_what_to_do_instead(provider_user: Any, client_for: Any, settings: Any, faucet_cache: Any) -> None:
    from ledger.context import chain_context_reset
    from ledger.models import Deployment

    _proven(provider_user)
    c = client_for(provider_user)
    r = c.post(URL)  # no chain at all
    assert r.status_code == 403 and r.json()["error"]["code"] == "faucet_unavailable", r.content
    d = Deployment.objects.create(chain_id=8453, rpc_url="", market_address="0x5FbDB2315678afecb367f053371D33aA2a4B0c5A",
                                  token_address="0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512", deployed_block=1)
    chain_context_reset()
    for chain_id, changes in ((8453, {}), (31337, {"chain_rpc_url": "https://node.example"}), (31337, {"chain_faucet": False}),
                              (31337, {"chain_faucet": True, "token_address": "0xA0b86991c6218b36c1d19D4a2e9Eb0cE3606eB48"})):
        Deployment.objects.filter(pk=d.pk).update(chain_id=chain_id)
        before = settings.CONFIG
        _configure(settings, **changes)
        r = c.post(URL)
        advertised = c.get("/api/v1/ledger/chain/").json()["chain"]["faucet"]
        settings.CONFIG = before
        error = r.json()["error"]
        assert r.status_code == 403 and error["code"] == "faucet_unavailable", (chain_id, changes, r.content)
        assert "only on a dev chain" in error["message"] and ADDRESS in error["message"] and "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512" in error["message"]
        assert advertised is False, "agents are told there is no faucet"
    chain_context_reset()


def test_the_faucet_is_for_providers_with_a_proven_address(buyer: Any, provider_user: Any, client_for: Any, faucet_cache: Any) -> None:
    from ledger.context import chain_context_reset
    from ledger.models import Deployment

    Deployment.objects.create(chain_id=31337, rpc_url="http://127.0.0.1:1", market_address="0x5FbDB2315678afecb367f053371D33aA2a4B0c5A",
                              token_address="0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512", deployed_block=1)
    chain_context_reset()
    assert client_for(buyer).post(URL).status_code == 403, "a buyer's token has no provide scope"
    r = client_for(provider_user).post(URL)
    assert r.status_code == 409 and "gridbid-agent faucet" in r.json()["error"]["message"], r.content
    chain_context_reset()


@pytest.mark.anvil
def test_on_the_dev_chain_the_faucet_gives_tokens_and_gas_once_an_hour(
    ctx: Any, provider_user: Any, client_for: Any, faucet_cache: Any, django_capture_on_commit_callbacks: Any,
) -> None:
    from ledger.context import market_min_stake
    from ledger.models import ChainTx

    _proven(provider_user)
    ctx.client.rpc("anvil_setBalance", [ADDRESS, "0x0"])
    c = client_for(provider_user)
    assert c.get("/api/v1/ledger/chain/").json()["chain"]["faucet"] is True
    with django_capture_on_commit_callbacks(execute=True):
        r = c.post(URL)
    assert r.status_code == 202, r.content
    body = r.json()
    assert body["address"] == ADDRESS and body["amount"] == max(1000 * 10**6, market_min_stake(ctx))
    (tx,) = body["transactions"]
    assert tx["key"].startswith(f"faucet:provider:{ADDRESS.lower()}:")
    sent = ChainTx.objects.get(key=tx["key"])  # sent once the request committed
    assert sent.purpose == "mint" and ctx.client.wait(sent.tx_hash).succeeded
    sync_chain(ctx)
    assert int(ctx.client.view(ctx.token, "balanceOf", ADDRESS)) == body["amount"]
    assert int(ctx.client.rpc("eth_getBalance", [ADDRESS, "latest"]), 16) == body["gas_wei"] > 0

    again = c.post(URL)
    assert again.status_code == 429 and 3500 <= int(again["Retry-After"]) <= 3600, again.content
    assert "less than an hour ago" in again.json()["error"]["message"]
    assert int(ctx.client.view(ctx.token, "balanceOf", ADDRESS)) == body["amount"], "nothing more sent"
