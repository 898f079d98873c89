"""Non-custodial buyers: a browser wallet (EIP-1193, e.g. MetaMask) instead of a key kept by
the server.

- Linking: the user signs a one-time challenge (EIP-191 personal_sign) with the wallet; the
  recovered address becomes the user's escrow address. Only before any custodial escrow
  exists, so one account never has money in two places.
- Orders: the buyer's consent to each bid is the same EIP-712 order the custodial key would
  sign (contracts/orders.py), signed in the wallet with ``eth_signTypedData_v4``. The server
  checks the signature recovers to the linked address before it keeps it, and records the
  bid's trades on chain only once it holds one: the operator can never spend a wallet
  buyer's escrow without the buyer's signature.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from django.core import signing
from django.db import transaction
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_utils import is_address, to_checksum_address

from contracts.orders import Order, SignedOrder, recover_order_signer, typed_data
from contracts.receipts import spec_hash, spec_message, spec_signer
from ledger.context import deployment_current
from ledger.models import CustodialKey
from market.errors import Conflict, DomainError, NotFound
from market.models import Bid, User

CHALLENGE_SALT = "gridbid.ledger.wallet-link"
CHALLENGE_MAX_AGE_S = 600
ORDER_TTL_S = 24 * 3600  # an order without a bid deadline can be recorded for a day after signing


def is_wallet_buyer(user: User) -> bool:
    return bool(user.chain_address) and not CustodialKey.objects.filter(user=user).exists()


def wallet_challenge(*, user: User) -> str:
    """A message for the wallet to sign, naming the user and valid for ten minutes."""
    token = signing.dumps({"u": user.pk, "n": secrets.token_hex(8)}, salt=CHALLENGE_SALT)
    return f"GridBid: link this wallet to the account {user.username}.\n\nOne-time code: {token}"


def wallet_link(*, user: User, address: Any, message: Any, signature: Any) -> User:
    """Make the wallet that signed ``message`` (a fresh challenge) the user's escrow address."""
    if not isinstance(address, str) or not is_address(address):
        raise DomainError("Invalid input. address: an Ethereum address, 0x and 40 hex digits.", fields={"address": ["0x followed by 40 hex digits."]})
    if not isinstance(message, str) or "One-time code: " not in message:
        raise DomainError("Invalid input. message: the challenge from POST /api/v1/me/wallet/challenge/, unchanged.", fields={"message": ["The challenge text, unchanged."]})
    token = message.rsplit("One-time code: ", 1)[1].strip()
    try:
        data = signing.loads(token, salt=CHALLENGE_SALT, max_age=CHALLENGE_MAX_AGE_S)
    except signing.SignatureExpired:
        raise DomainError("Invalid input. message: the challenge expired; ask for a new one.", fields={"message": ["Expired: ask for a new challenge."]}) from None
    except signing.BadSignature:
        raise DomainError("Invalid input. message: not a challenge this server issued.", fields={"message": ["Not issued by this server."]}) from None
    if data.get("u") != user.pk:
        raise DomainError("Invalid input. message: the challenge was issued to another account.", fields={"message": ["Issued to another account."]})
    try:
        signer = Account.recover_message(encode_defunct(text=message), signature=signature)
    except Exception:  # noqa: BLE001 - any malformed signature is the caller's input error
        signer = None
    if signer is None or signer.lower() != address.lower():
        raise DomainError("Invalid input. signature: it was not made by that address over this challenge.", fields={"signature": ["Not a signature of the challenge by that address."]})
    if CustodialKey.objects.filter(user=user).exists():
        raise Conflict("This account already has a custodial escrow address; a wallet can be linked only before the first custodial deposit.")
    address = to_checksum_address(address)
    if User.objects.filter(chain_address__iexact=address).exclude(pk=user.pk).exists():
        raise Conflict("That wallet is linked to another GridBid account.")
    User.objects.filter(pk=user.pk).update(chain_address=address)
    user.chain_address = address
    return user


def _order(bid: Bid) -> Order:
    if bid.order_deadline is None:
        raise ValueError("the order has no deadline yet")
    return Order(order_id=bid.pk, buyer=bid.buyer.chain_address, max_price=bid.max_price, gpus=bid.gpus,
                 duration=bid.duration_s, deadline=int(bid.order_deadline))


def _chain() -> tuple[int, str]:
    """The deployment orders are signed for (no node needed: its chain id and address)."""
    d = deployment_current()
    if d is None:
        raise Conflict("No chain is configured on this server: there is no market contract to sign orders for.")
    return d.chain_id, d.market_address


@transaction.atomic
def wallet_order(*, user: User, bid_id: int) -> dict[str, Any]:
    """The EIP-712 order of one of the user's bids, for its wallet to sign. The order's
    deadline is fixed the first time it is asked for, so every request gives the same order."""
    bid = Bid.objects.select_for_update().select_related("buyer").filter(pk=bid_id, buyer=user).first()
    if bid is None:
        raise NotFound("No such bid of yours.")
    if not is_wallet_buyer(user):
        raise Conflict("Your orders are signed by your custodial key; link a wallet first (POST /api/v1/me/wallet/).")
    chain_id, market = _chain()
    if bid.order_deadline is None:
        deadline = int(bid.deadline.timestamp()) if bid.deadline else int(time.time()) + bid.duration_s + ORDER_TTL_S
        Bid.objects.filter(pk=bid.pk).update(order_deadline=deadline)
        bid.order_deadline = deadline
    return {"bid": bid.pk, "signed": bool(bid.order_signature), "typed_data": typed_data(_order(bid), chain_id=chain_id, market=market),
            "spec_message": spec_message(spec_hash(bid.job_spec)), "spec_signed": bool(bid.spec_signature)}


def wallet_order_sign(*, user: User, bid_id: int, signature: Any, spec_signature: Any = None) -> dict[str, Any]:
    """Keep the wallet's signature of the bid's order once it recovers to the linked address,
    and of its job spec (what agents check before they run it) when given."""
    order = wallet_order(user=user, bid_id=bid_id)
    bid = Bid.objects.select_related("buyer").get(pk=bid_id)
    if spec_signature is not None:
        try:
            signer_of_spec = spec_signer(bid.job_spec, spec_signature)
        except Exception:  # noqa: BLE001 - a malformed signature is the caller's input error
            signer_of_spec = ""
        if signer_of_spec.lower() != user.chain_address.lower():
            raise DomainError("Invalid input. spec_signature: not your linked wallet's signature of spec_message.",
                              fields={"spec_signature": ["personal_sign of spec_message by your linked wallet."]})
    raw = signature.removeprefix("0x") if isinstance(signature, str) else ""
    if len(raw) != 130 or any(c not in "0123456789abcdefABCDEF" for c in raw):
        raise DomainError("Invalid input. signature: 65 bytes as 0x and 130 hex digits (eth_signTypedData_v4's result).", fields={"signature": ["0x and 130 hex digits."]})
    sig = bytes.fromhex(raw)
    v = sig[64] if sig[64] >= 27 else sig[64] + 27
    domain = order["typed_data"]["domain"]
    chain_id, market = int(domain["chainId"]), str(domain["verifyingContract"])
    signed = SignedOrder(order=_order(bid), v=v, r=sig[:32], s=sig[32:64])
    try:
        signer = recover_order_signer(signed, chain_id=chain_id, market=market)
    except Exception:  # noqa: BLE001 - a malformed signature is the caller's input error
        signer = ""
    if signer.lower() != user.chain_address.lower():
        raise DomainError("Invalid input. signature: it does not recover to your linked wallet over this order.", fields={"signature": ["Not your wallet's signature of this order."]})
    Bid.objects.filter(pk=bid.pk).update(order_signature="0x" + sig[:64].hex() + f"{v:02x}")
    if spec_signature is not None:
        Bid.objects.filter(pk=bid.pk).update(spec_signature=str(spec_signature))
    return {**order, "signed": True, "spec_signed": bool(spec_signature) or order["spec_signed"]}


def signed_order_of(bid: Bid, *, chain_id: int, market: str) -> SignedOrder | None:
    """The wallet-signed order of a bid, or None while the buyer has not signed it."""
    if not bid.order_signature or bid.order_deadline is None:
        return None
    sig = bytes.fromhex(bid.order_signature[2:])
    signed = SignedOrder(order=_order(bid), v=sig[64], r=sig[:32], s=sig[32:64])
    if recover_order_signer(signed, chain_id=chain_id, market=market).lower() != bid.buyer.chain_address.lower():
        return None  # signed for another deployment, or the wallet changed: ask again
    return signed
