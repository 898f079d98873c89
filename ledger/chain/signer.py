"""The keys this server signs with: the operator's (keystore file + passphrase in
production, a hex key in development) and custodial buyer keys."""

from __future__ import annotations

import json
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

__all__ = ["Signer", "signer_from_hex", "signer_from_keystore"]

Signer = LocalAccount


def signer_from_hex(key: str | bytes) -> Signer:
    account: LocalAccount = Account.from_key(key)
    return account


def signer_from_keystore(path: Path, passphrase: str) -> Signer:
    """Decrypt a JSON keystore (Web3 Secret Storage). A wrong passphrase raises ValueError."""
    keystore = json.loads(Path(path).read_text())
    key = Account.decrypt(keystore, passphrase)
    return signer_from_hex(bytes(key))
