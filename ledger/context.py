"""Which chain, contracts and operator key the ledger uses, from settings and the
Deployment table: CHAIN_RPC_URL / MARKET_ADDRESS / TOKEN_ADDRESS when set, else the
newest active deployment (the embedded dev chain records its own)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from ledger.chain import ChainClient, Signer, signer_from_hex, signer_from_keystore
from ledger.models import Deployment

# anvil's first well-known development account; used only on chain 31337 with no key configured
ANVIL_DEV_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
DEV_CHAIN_ID = 31337


@dataclass
class ChainContext:
    client: ChainClient
    deployment: Deployment
    operator: Signer
    confirmations: int

    @property
    def chain_id(self) -> int:
        return self.deployment.chain_id

    @cached_property
    def market(self) -> Any:
        return self.client.contract("GridBidMarket", self.deployment.market_address)

    @cached_property
    def token(self) -> Any:
        return self.client.contract("TestToken", self.deployment.token_address)


def operator_signer(chain_id: int) -> Signer:
    cfg = settings.CONFIG
    if cfg.operator_keystore is not None:
        if cfg.operator_keystore_passphrase is None:
            raise ImproperlyConfigured("OPERATOR_KEYSTORE is set but OPERATOR_KEYSTORE_PASSPHRASE is not")
        return signer_from_keystore(cfg.operator_keystore, cfg.operator_keystore_passphrase)
    if cfg.operator_key:
        return signer_from_hex(cfg.operator_key)
    if chain_id == DEV_CHAIN_ID:
        return signer_from_hex(ANVIL_DEV_KEY)
    raise ImproperlyConfigured("no operator key: set OPERATOR_KEYSTORE (+ passphrase) or OPERATOR_KEY")


def deployment_current() -> Deployment | None:
    cfg = settings.CONFIG
    qs = Deployment.objects.filter(active=True)
    if cfg.market_address:
        qs = qs.filter(market_address__iexact=cfg.market_address)
    return qs.order_by("-id").first()


_cache: dict[tuple[int, str], ChainContext] = {}


def chain_context() -> ChainContext | None:
    """The chain context, or None when there is no chain to settle on (no deployment)."""
    deployment = deployment_current()
    if deployment is None:
        return None
    url = settings.CONFIG.chain_rpc_url or deployment.rpc_url
    if not url:
        return None
    key = (deployment.pk, url)
    ctx = _cache.get(key)
    if ctx is None:
        client = ChainClient(url, expected_chain_id=deployment.chain_id)
        ctx = ChainContext(client=client, deployment=deployment, operator=operator_signer(deployment.chain_id),
                           confirmations=settings.CONFIG.chain_confirmations)
        _cache.clear()
        _cache[key] = ctx
    return ctx


def chain_context_reset() -> None:
    """Forget cached clients (tests, and after a deployment changes)."""
    _cache.clear()


_min_stakes: dict[tuple[int, str], int] = {}


def market_min_stake(ctx: ChainContext) -> int:
    """The market contract's `min_stake`: an immutable, so it is read from the chain once
    per deployment and kept."""
    key = (ctx.chain_id, ctx.deployment.market_address.lower())
    if key not in _min_stakes:
        _min_stakes[key] = int(ctx.client.view(ctx.market, "min_stake"))
    return _min_stakes[key]
