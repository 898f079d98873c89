"""Deposits and withdrawals asked for by custodial users (REST and the wallet page).

The request is checked here (positive integer base units, at most what the user
has) and the transactions are sent after the surrounding database transaction
commits: the outbox must store its signed bytes in a committed row before it
broadcasts them, and the Idempotency-Key decorator holds a transaction open
around the view. Each request has one key, so a repeat sends nothing new.
"""

from __future__ import annotations

import logging
from typing import Any

import requests
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction

from ledger.chain import ChainError
from ledger.context import (
    DEV_CHAIN_ID,
    ChainContext,
    chain_context,
    deployment_current,
    market_min_stake,
)
from ledger.custody import custodial_key_get_or_create, custodial_signer
from ledger.models import ChainTx, CustodialKey
from ledger.outbox import tx_submit
from ledger.services import escrow_deposit
from ledger.wallet import is_wallet_buyer
from market.audit import AuditAction, audit_record
from market.errors import Conflict, DomainError, NotAllowed
from market.funding import funds_of
from market.models import User
from market.money import usdc
from providers.models import Provider

log = logging.getLogger("gridbid.ledger.escrow")

ACTIONS = ("deposit", "withdraw")
UNREACHABLE = (ChainError, ConnectionError, TimeoutError, requests.RequestException, ImproperlyConfigured)


class ChainUnavailable(Exception):
    """There is no chain to send to: none configured, or its node does not answer."""


def chain_for_writes() -> ChainContext:
    try:
        ctx = chain_context()
    except UNREACHABLE as exc:
        raise ChainUnavailable(f"The chain node does not answer ({exc}); balances are read-only until it does.") from exc
    if ctx is None:
        raise ChainUnavailable("No chain is configured on this server: balances are read-only, deposits and withdrawals are off.")
    return ctx


def _amount(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str) or not (str(value).isascii() and str(value).isdigit()):
        raise DomainError("Invalid input. amount: a positive whole number of token base units.", fields={"amount": ["A positive whole number of token base units (1 USDC = 1000000)."]})
    amount = int(value)
    if amount <= 0 or amount >= 2**255:
        raise DomainError("Invalid input. amount: must be more than 0.", fields={"amount": ["Must be more than 0."]})
    return amount


@transaction.atomic  # the withdrawal's money check holds the buyer's row lock until it is sent
def escrow_request(*, user: User, action: str, amount: Any, key: str) -> dict[str, Any]:
    """Check a deposit or withdrawal of `amount` from the user's custodial key and send it
    once the current database transaction commits. `key` names the request (one per
    Idempotency-Key): the same key never sends a second transaction."""
    if action not in ACTIONS:
        raise ValueError(action)
    value = _amount(amount)
    if is_wallet_buyer(user):
        raise Conflict(f"Your escrow belongs to your own wallet ({user.chain_address}): {action} from the wallet, not through the server.")
    if action == "withdraw":
        # what open bids and matched, unrecorded trades still need stays: the same money
        # check as a bid's, under the same row lock, so a bid and a withdrawal cannot both spend it
        User.objects.select_for_update().filter(pk=user.pk).values_list("pk", flat=True).first()
        funds = funds_of(user)
        if value > funds.available:
            available = max(funds.available, 0)
            promised = f"; {usdc(funds.committed)} of it is promised to your open bids and unrecorded trades" if funds.committed else ""
            raise DomainError(f"Invalid input. amount: more than your free balance ({available} base units, {usdc(available)}): "
                              f"{usdc(funds.free)} deposited and unlocked{promised}. Cancel bids to free more.",
                              fields={"amount": [f"More than your free balance ({available} base units, {usdc(available)})."]})
    ctx = chain_for_writes()
    address = custodial_key_get_or_create(user=user).address
    if action == "deposit":
        try:
            held = int(ctx.client.view(ctx.token, "balanceOf", address))
        except UNREACHABLE as exc:
            raise ChainUnavailable(f"The chain node does not answer ({exc}).") from exc
        if value > held:
            raise DomainError(f"Invalid input. amount: more than the {held} base units ({usdc(held)}) your custodial address {address} holds.",
                              fields={"amount": [f"More than the tokens at your custodial address ({held} base units, {usdc(held)})."]})
    keys = [f"approve:{key}", f"deposit:{key}"] if action == "deposit" else [f"withdraw:{key}"]
    transaction.on_commit(lambda: _send(user_id=user.pk, action=action, amount=value, key=key))
    audit_record(actor=user, action=AuditAction.ESCROW_WITHDRAW if action == "withdraw" else AuditAction.ESCROW_DEPOSIT,
                 obj=("escrow", address), details={"amount": value, "transactions": keys})
    return {"action": action, "amount": value, "address": address, "state": "accepted", "transactions": keys}


def _send(*, user_id: int, action: str, amount: int, key: str) -> None:
    """Send the transactions of one request (after commit; failures are logged, the request
    shows no transaction then and can be made again with a new key)."""
    try:
        ctx = chain_for_writes()
        user = User.objects.get(pk=user_id)
        if action == "deposit":
            escrow_deposit(ctx=ctx, user=user, amount=amount, key=key)
        else:
            signer = custodial_signer(CustodialKey.objects.get(user=user))
            tx_submit(client=ctx.client, signer=signer, key=f"withdraw:{key}", purpose="withdraw", call=ctx.market.functions.withdraw(amount))
    except (*UNREACHABLE, ChainUnavailable) as exc:
        log.warning("%s of %s for user %s (%s) not sent: %s", action, amount, user_id, key, exc)


FAUCET_TOKENS = 1_000 * 10**6  # 1,000 test USDC
FAUCET_GAS_WEI = 10**18


def faucet_available() -> bool:
    """Whether the test-token faucet runs here: only on the dev chain (31337) with the market's
    own test token (no TOKEN_ADDRESS), and there only when CHAIN_FAUCET says so (unset: on for
    the embedded dev chain, `gridbid up` without CHAIN_RPC_URL)."""
    from django.conf import settings

    cfg = settings.CONFIG
    if cfg.chain_faucet is False or cfg.token_address:
        return False
    d = deployment_current()
    if d is None or d.chain_id != DEV_CHAIN_ID:
        return False
    return cfg.chain_faucet is True or not cfg.chain_rpc_url


class FaucetUnavailable(NotAllowed):
    code = "faucet_unavailable"


class FaucetTooSoon(Exception):
    """The address had its grant this hour (the API answers 429 with Retry-After)."""

    def __init__(self, message: str, *, wait_s: int) -> None:
        super().__init__(message)
        self.message, self.wait_s = message, wait_s


PROVIDER_FAUCET_INTERVAL_S = 3600  # one grant per address per hour
FAUCET_NOT_HERE = ("The test-token faucet runs only on a dev chain: the embedded one of `gridbid up` (without CHAIN_RPC_URL), "
                   "or chain 31337 with the market's own test token and CHAIN_FAUCET=true. On this market, send the token "
                   "({token}) and some ETH for gas to {address} yourself.")


def faucet_provider(*, provider: Provider, key: str) -> dict[str, Any]:
    """Dev chain only: test tokens (the market's minimum stake, at least 1,000) and gas to the
    provider's proven agent address, so a new agent can stake and register. One grant per
    address per PROVIDER_FAUCET_INTERVAL_S; sent after commit."""
    import time

    from django.core.cache import cache

    address = provider.chain_address
    if not faucet_available():
        d = deployment_current()
        raise FaucetUnavailable(FAUCET_NOT_HERE.format(token=d.token_address if d else "none: no chain", address=address or "your agent's address"))
    if not address:
        raise Conflict("No agent address proven for this provider yet: `gridbid-agent faucet` (or `register`) proves it by a signed "
                       "challenge (POST /api/v1/agent/challenge/ then /verify/) before asking the faucet.")
    ctx = chain_for_writes()
    try:
        amount = max(FAUCET_TOKENS, market_min_stake(ctx))
    except UNREACHABLE as exc:
        raise ChainUnavailable(f"The chain node does not answer ({exc}).") from exc
    slot = f"gridbid:faucet:provider:{address.lower()}"
    now = time.time()
    if not cache.add(slot, now + PROVIDER_FAUCET_INTERVAL_S, PROVIDER_FAUCET_INTERVAL_S):
        until = cache.get(slot)
        wait = max(1, int((until if isinstance(until, int | float) else now + PROVIDER_FAUCET_INTERVAL_S) - now))
        raise FaucetTooSoon(f"The faucet sent test tokens to {address} less than an hour ago; ask again in {wait} s "
                            f"(it gives each address {amount} base units and gas once an hour).", wait_s=wait)
    tx_key = f"faucet:provider:{address.lower()}:{int(now)}:{key}"

    def send() -> None:
        try:
            ctx = chain_for_writes()
            if int(ctx.client.rpc("eth_getBalance", [address, "latest"]), 16) < FAUCET_GAS_WEI:
                ctx.client.rpc("anvil_setBalance", [address, hex(FAUCET_GAS_WEI)])
            tx_submit(client=ctx.client, signer=ctx.operator, key=tx_key, purpose="mint", call=ctx.token.functions.mint(address, amount))
        except (*UNREACHABLE, ChainUnavailable) as exc:
            cache.delete(slot)  # nothing was sent: the provider may ask again at once
            log.warning("faucet for provider %s (%s) not sent: %s", provider.pk, address, exc)

    transaction.on_commit(send)
    return {"action": "faucet", "address": address, "amount": amount, "gas_wei": FAUCET_GAS_WEI, "state": "accepted", "transactions": [tx_key]}


def faucet_request(*, user: User, key: str) -> dict[str, Any]:
    """Dev chain only: mint 1,000 test USDC (and gas) to the user's custodial address, so a
    new buyer can deposit and trade without a wallet. Sent after commit, once per key."""
    if not faucet_available():
        raise Conflict("The test-token faucet only runs on the embedded dev chain (gridbid up without CHAIN_RPC_URL).")
    if is_wallet_buyer(user):
        raise Conflict(f"Your escrow belongs to your own wallet ({user.chain_address}); the faucet funds custodial accounts.")
    address = custodial_key_get_or_create(user=user).address

    def send() -> None:
        try:
            ctx = chain_for_writes()
            if int(ctx.client.rpc("eth_getBalance", [address, "latest"]), 16) < FAUCET_GAS_WEI:
                ctx.client.rpc("anvil_setBalance", [address, hex(FAUCET_GAS_WEI)])
            tx_submit(client=ctx.client, signer=ctx.operator, key=f"faucet:{key}", purpose="mint",
                      call=ctx.token.functions.mint(address, FAUCET_TOKENS))
        except (*UNREACHABLE, ChainUnavailable) as exc:
            log.warning("faucet for user %s (%s) not sent: %s", user.pk, key, exc)

    transaction.on_commit(send)
    return {"action": "faucet", "amount": FAUCET_TOKENS, "address": address, "state": "accepted"}


def tokens_held(address: str | None) -> int | None:
    """Tokens at an address (not yet deposited), or None when the chain cannot say."""
    if not address:
        return None
    try:
        ctx = chain_context()
        return None if ctx is None else int(ctx.client.view(ctx.token, "balanceOf", address))
    except UNREACHABLE:
        return None


def escrow_transactions(*, keys: list[str]) -> list[dict[str, Any]]:
    found = {r.key: r for r in ChainTx.objects.filter(key__in=keys)}
    return [{"key": k, "tx_hash": found[k].tx_hash if k in found else None, "state": found[k].state if k in found else "not sent"} for k in keys]
