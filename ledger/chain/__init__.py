"""The only code that talks to web3.py: a typed client over one node, the operator's
signer, EIP-1559 fees, raw-transaction broadcast, confirmed receipts and decoded logs.

Nothing here reads Django settings or the database; ledger/outbox.py and
ledger/listener.py hold the Django side (nonce cursors, stored transactions).
"""

from ledger.chain.client import (
    ChainClient,
    ChainError,
    ChainIdMismatch,
    ContractCall,
    Fees,
    LogEvent,
    Receipt,
    SignedTx,
    call_decode,
)
from ledger.chain.signer import Signer, signer_from_hex, signer_from_keystore

__all__ = [
    "ChainClient",
    "ChainError",
    "ChainIdMismatch",
    "ContractCall",
    "Fees",
    "LogEvent",
    "Receipt",
    "SignedTx",
    "Signer",
    "call_decode",
    "signer_from_hex",
    "signer_from_keystore",
]
