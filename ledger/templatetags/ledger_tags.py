"""Template helpers for wallet (non-custodial) buyers."""

from __future__ import annotations

from typing import Any

from django import template
from eth_utils import function_signature_to_4byte_selector

from ledger.models import CustodialKey
from ledger.wallet import is_wallet_buyer

register = template.Library()


@register.filter
def wallet_buyer(user: Any) -> bool:
    """The user's orders are signed by its own browser wallet, not a custodial key."""
    return bool(getattr(user, "is_authenticated", False)) and is_wallet_buyer(user)


@register.filter
def can_link_wallet(user: Any) -> bool:
    """A wallet can still become the user's escrow address (no custodial escrow yet)."""
    return not getattr(user, "chain_address", "") and not CustodialKey.objects.filter(user=user).exists()


@register.simple_tag
def selector(signature: str) -> str:
    """The 4-byte function selector of e.g. ``deposit(uint256)``, as 0x hex."""
    return "0x" + function_signature_to_4byte_selector(signature).hex()
