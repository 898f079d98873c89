"""Custodial buyer keys: an Ethereum key the server holds for a buyer without a wallet,
used to sign the buyer's EIP-712 orders and escrow deposits.

Keys are encrypted at rest with Fernet (AES-128-CBC + HMAC-SHA256) under a key
derived from SECRET_KEY by HKDF, so a database dump alone does not reveal them.
Rotating SECRET_KEY therefore needs a re-encryption step (not written yet).
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings
from django.db import IntegrityError, transaction
from eth_account import Account

from ledger.chain import Signer, signer_from_hex
from ledger.models import CustodialKey
from market.models import User

HKDF_INFO = b"gridbid.ledger.custodial-keys.v1"


def _fernet() -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=HKDF_INFO).derive(settings.SECRET_KEY.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def custodial_key_get_or_create(*, user: User) -> CustodialKey:
    """The user's custodial key, created on first use (the address is then the user's)."""
    existing = CustodialKey.objects.filter(user=user).first()
    if existing is not None:
        return existing
    account = Account.create()
    token = _fernet().encrypt(bytes(account.key)).decode()
    try:
        with transaction.atomic():
            return CustodialKey.objects.create(user=user, address=account.address, ciphertext=token)
    except IntegrityError:  # created by a concurrent call
        return CustodialKey.objects.get(user=user)


def custodial_signer(key: CustodialKey) -> Signer:
    return signer_from_hex(_fernet().decrypt(key.ciphertext.encode()))


def buyer_address(user: User) -> str | None:
    """Where a buyer's escrow lives: its custodial key if it has one, else its own wallet."""
    key = CustodialKey.objects.filter(user=user).first()
    if key is not None:
        return key.address
    return user.chain_address or None
