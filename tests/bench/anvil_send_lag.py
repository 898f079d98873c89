"""How far anvil's mining trails its answer to a send (tests/FLAKES.md, chain_mined).

    .venv/bin/python tests/bench/anvil_send_lag.py [seconds]

Sends value transfers one after another for `seconds` (default 20) and, after each, polls
for the receipt: prints the share of sends whose receipt was not there at once and the worst
lag. Then checks what tests/integration/helpers.chain_mined relies on: once anvil's pool has
no pending transaction, the receipt is there and the head has reached its block. Run it
beside the suite (or under `stress-ng --cpu 2`) to see the lag a loaded box gives."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from web3 import Web3  # noqa: E402
from web3.exceptions import TransactionNotFound  # noqa: E402

from ledger.chain.anvil import start_anvil, stop_anvil  # noqa: E402
from tests.workers import free_port  # noqa: E402


def main(seconds: float) -> int:
    port = free_port()
    proc = start_anvil(port=port)
    try:
        w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{port}"))
        sender = w3.eth.accounts[0]
        lags: list[float] = []
        missing = broken = 0
        stop = time.monotonic() + seconds / 2
        while time.monotonic() < stop:  # 1: how long until the receipt is there
            tx = w3.eth.send_transaction({"from": sender, "to": sender, "value": 1})
            sent, polls = time.perf_counter(), 0
            while True:
                try:
                    w3.eth.get_transaction_receipt(tx)
                    break
                except TransactionNotFound:
                    polls += 1
            lags.append(time.perf_counter() - sent)
            missing += polls > 0
        checked = 0
        stop = time.monotonic() + seconds / 2
        while time.monotonic() < stop:  # 2: an empty pool means mined and in the head
            tx = w3.eth.send_transaction({"from": sender, "to": sender, "value": 1})
            while int(w3.provider.make_request("txpool_status", [])["result"]["pending"], 16):
                pass
            checked += 1
            try:
                broken += w3.eth.block_number < w3.eth.get_transaction_receipt(tx)["blockNumber"]
            except TransactionNotFound:
                broken += 1
        print(f"receipt missing right after the send: {missing} of {len(lags)} ({100 * missing / len(lags):.1f}%), "
              f"worst lag {1000 * max(lags):.1f} ms")
        print(f"empty pool but no receipt or head behind it: {broken} of {checked}")
        return 1 if broken else 0
    finally:
        stop_anvil(proc)


if __name__ == "__main__":
    sys.exit(main(float(sys.argv[1]) if len(sys.argv) > 1 else 20.0))
