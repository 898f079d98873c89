"""The provider's keys: an Ethereum account and a BLS12-381 key with its proof of possession.

Both live under `<home>/keys/`, the directory 0700 and every file 0600:

* `eth-keystore.json`: the Ethereum account in the standard encrypted keystore
  (Web3 Secret Storage); its password is in `keystore-password` unless the
  provider passes `--password-file` and keeps it elsewhere;
* `bls.json`: the BLS secret key, public key and proof of possession. The agent
  signs receipts unattended, so this key is protected by file permissions only.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path
from typing import Any

from contracts.bls import BlsKey
from providers.agent.config import write_private

KEYSTORE = "eth-keystore.json"
PASSWORD = "keystore-password"
BLS_FILE = "bls.json"


class KeyError_(Exception):
    """A key is missing, unreadable or exposed."""


def keys_dir(home: Path) -> Path:
    return home / "keys"


def keys_exist(home: Path) -> bool:
    d = keys_dir(home)
    return (d / KEYSTORE).exists() and (d / BLS_FILE).exists()


def create_keys(home: Path, *, password: str | None = None, kdf_iterations: int | None = None) -> tuple[str, BlsKey]:
    """Create both keys; refuses to overwrite existing ones. Returns (eth address, BLS key)."""
    from eth_account import Account

    # lazy: py_ecc takes a second to load, and only making keys needs it
    from contracts import bls

    d = keys_dir(home)
    if keys_exist(home):
        raise KeyError_(f"Keys already exist in {d}; refusing to overwrite them.")
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(d, 0o700)
    if password is None:
        password = secrets.token_urlsafe(32)
        write_private(d / PASSWORD, password.encode())
    account = Account.create()
    kdf: dict[str, Any] = {"kdf": "scrypt"}
    if kdf_iterations:
        kdf["iterations"] = kdf_iterations
    keystore = Account.encrypt(account.key, password, **kdf)
    write_private(d / KEYSTORE, json.dumps(keystore).encode())
    sk = bls.keygen(secrets.token_bytes(32))
    key = BlsKey(sk, bls.public_key(sk), bls.pop_prove(sk))
    body = {"secret_key": hex(sk), "public_key": key.public_key.hex(), "proof_of_possession": key.proof_of_possession.hex()}
    write_private(d / BLS_FILE, json.dumps(body).encode())
    return account.address, key


def _check_private(path: Path) -> None:
    if not path.exists():
        raise KeyError_(f"{path} is missing. Run `gridbid-agent init` to create the keys.")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise KeyError_(f"{path} is readable by others (mode {mode:o}); run `chmod 600 {path}`.")


def load_bls(home: Path) -> BlsKey:
    path = keys_dir(home) / BLS_FILE
    _check_private(path)
    raw = json.loads(path.read_text())
    return BlsKey(int(raw["secret_key"], 16), bytes.fromhex(raw["public_key"]), bytes.fromhex(raw["proof_of_possession"]))


def eth_address(home: Path) -> str:
    """The account's address, read from the keystore without decrypting it."""
    from eth_utils import to_checksum_address

    path = keys_dir(home) / KEYSTORE
    _check_private(path)
    return to_checksum_address("0x" + json.loads(path.read_text())["address"])


def load_eth(home: Path, *, password: str | None = None) -> Any:
    """The decrypted Ethereum account (an eth-account LocalAccount)."""
    from eth_account import Account

    d = keys_dir(home)
    _check_private(d / KEYSTORE)
    if password is None:
        _check_private(d / PASSWORD)
        password = (d / PASSWORD).read_text().strip()
    try:
        key = Account.decrypt(json.loads((d / KEYSTORE).read_text()), password)
    except ValueError as exc:
        raise KeyError_(f"Cannot unlock {d / KEYSTORE}: {exc}") from exc
    return Account.from_key(key)


def sign_text(account: Any, text: str) -> str:
    """EIP-191 personal signature of `text`, hex."""
    from eth_account.messages import encode_defunct

    return "0x" + account.sign_message(encode_defunct(text=text)).signature.hex().removeprefix("0x")
