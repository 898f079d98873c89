"""Gas per trade of GridBid's whole trade lifecycle (record + settle) on anvil.

    .venv/bin/python tests/bench/bench_gas.py [--sizes 1,10,100,500] [--port 18645] [--profile 100]

Starts anvil (ledger/chain/anvil.py, Prague), deploys through contracts/deploy.py,
registers 20 providers with real BLS keys, funds 40 buyers, then for each batch
size records a batch (one signed EIP-712 order per buyer, trades spread over the
buyers and providers) and settles it with one aggregate BLS signature. Beside it,
a naive escrow opens and closes one trade at a time. Exits 1 if batch 100 costs
more than 20,000 gas per trade.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from eth_account import Account  # noqa: E402
from web3 import Web3  # noqa: E402

from contracts import bls  # noqa: E402
from contracts.batches import Completion, TradeFill, record_args, settlement_args  # noqa: E402
from contracts.compile import compile_contract  # noqa: E402
from contracts.deploy import deploy_market, deploy_token  # noqa: E402
from contracts.orders import Order, sign_order  # noqa: E402
from ledger.chain.anvil import start_anvil, stop_anvil  # noqa: E402
from tests.bench.gas_profile import print_profile  # noqa: E402

TARGET = 20_000
BUYERS = 40
PROVIDERS = 20
MNEMONIC = "test test test test test test test test test test test junk"
PRICE = 2_000_000  # 2 tokens per GPU-hour
DURATION = 3600


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,10,100,500")
    parser.add_argument("--port", type=int, default=18645)
    parser.add_argument("--profile", type=int, default=0, metavar="BATCH",
                        help="print where the gas of this batch size goes, by source line")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    Account.enable_unaudited_hdwallet_features()
    n_accounts = 4 + BUYERS + PROVIDERS
    keys = [
        Account.from_mnemonic(MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}") for i in range(n_accounts)
    ]
    admin, operator, arbiter, naive_operator = (k.address for k in keys[:4])
    buyers = keys[4 : 4 + BUYERS]
    providers = keys[4 + BUYERS :]

    proc = start_anvil(
        port=args.port,
        extra_args=["--accounts", str(n_accounts), "--mnemonic", MNEMONIC, "--gas-limit", "100000000",
                    *(["--steps-tracing"] if args.profile else [])],
    )
    try:
        w3 = Web3(Web3.HTTPProvider(f"http://127.0.0.1:{args.port}", request_kwargs={"timeout": 120}))
        chain_id = w3.eth.chain_id

        def send(fn, sender: str) -> dict:
            receipt = w3.eth.wait_for_transaction_receipt(fn.transact({"from": sender, "gas": 60_000_000}))
            if receipt["status"] != 1:
                raise RuntimeError(f"transaction reverted: {fn.fn_name}")
            return receipt

        token = deploy_token(w3, admin)
        market = deploy_market(
            w3, admin=admin, token=token.address, operator=operator, arbiter=arbiter, min_stake=0
        )
        naive_art = compile_contract(ROOT / "tests/contracts/NaiveEscrow.vy")
        naive_receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.contract(abi=naive_art["abi"], bytecode=naive_art["bytecode"])
            .constructor(token.address, naive_operator)
            .transact({"from": admin})
        )
        naive = w3.eth.contract(address=naive_receipt["contractAddress"], abi=naive_art["abi"])

        t0 = time.time()
        bls_keys = [bls.keygen(hashlib.sha256(b"bench provider %d" % i).digest()) for i in range(PROVIDERS)]
        for k, sk in zip(providers, bls_keys, strict=True):
            pk = bls.public_key(sk)
            send(market.functions.register(bls.g1_to_eip2537(pk), bls.g2_to_eip2537(bls.pop_prove(sk)), 0), k.address)
        for b in buyers:
            send(token.functions.mint(b.address, 10**15), admin)
            send(token.functions.approve(market.address, 2**256 - 1), b.address)
            send(token.functions.approve(naive.address, 2**256 - 1), b.address)
            send(market.functions.deposit(10**14), b.address)
        print(f"setup: {len(providers)} providers registered with proofs of possession, "
              f"{len(buyers)} buyers funded ({time.time() - t0:.0f} s)", file=sys.stderr)

        deadline = w3.eth.get_block("latest")["timestamp"] + 30 * 24 * 3600
        next_trade, next_order, batch_no = 1_000, 1_000, 0
        rows = []
        for size in sizes:
            nb, np_ = min(BUYERS, size), min(PROVIDERS, size)
            per_buyer: dict[int, list[int]] = {}
            for k in range(size):
                per_buyer.setdefault(k % nb, []).append(k)
            orders, fills = [], []
            for bi in sorted(per_buyer):
                buyer = buyers[bi]
                order = Order(next_order, buyer.address, PRICE, len(per_buyer[bi]), DURATION, deadline)
                orders.append(sign_order(buyer.key, order, chain_id=chain_id, market=market.address))
                for k in per_buyer[bi]:
                    fills.append(TradeFill(next_trade, next_order, providers[k % np_].address, PRICE, 1))
                    next_trade += 1
                next_order += 1
            call = record_args(orders, fills)
            recorded = call.recorded
            rec = send(market.functions.record_trades(*call.args), operator)

            completions = [
                Completion(t, batch_no, pos, DURATION * t.gpus * 3 // 4, hashlib.sha256(b"%d" % t.trade_id).digest())
                for pos, t in enumerate(recorded)
            ]
            by_address = {p.address: sk for p, sk in zip(providers, bls_keys, strict=True)}
            batch = settlement_args(completions, {batch_no: recorded}, chain_id=chain_id, market=market.address,
                                    keys={a: bls.public_key(sk) for a, sk in by_address.items()})
            agg = bls.aggregate([bls.sign(by_address[s], batch.message) for s in batch.signers])
            st = send(market.functions.settle_batch(*batch.args(bls.g2_to_eip2537(agg))), operator)
            batch_no += 1  # noqa: SIM113 - the contract numbers record batches; enumerate would hide that

            # naive escrow: the same trades, one open (buyer) + one release (operator) each
            naive_gas = 0
            sample = recorded[: min(size, 20)]
            for t in sample:
                buyer = next(b for b in buyers if b.address == t.buyer)
                naive_gas += send(naive.functions.open(t.trade_id, t.provider, t.lock), buyer.address)["gasUsed"]
                naive_gas += send(naive.functions.release(t.trade_id, t.payment(DURATION * 3 // 4)), naive_operator)["gasUsed"]
            rows.append((size, nb, np_, rec["gasUsed"], st["gasUsed"], naive_gas / len(sample)))
            if size == args.profile:
                source = ROOT / "contracts/GridBidMarket.vy"
                print_profile(w3, rec["transactionHash"], source, f"record_trades, batch {size}")
                print_profile(w3, st["transactionHash"], source, f"settle_batch, batch {size}")

        print(f"GridBid gas per trade on anvil (prague), {BUYERS} buyers / {PROVIDERS} providers at most, one order per buyer")
        print(f"{'batch':>6} {'buyers':>6} {'provs':>5} {'record':>9} {'settle':>9} {'total':>9} {'naive':>9} {'saving':>7}")
        ok = True
        for size, nb, np_, rg, sg, ng in rows:
            total = (rg + sg) / size
            print(f"{size:>6} {nb:>6} {np_:>5} {rg / size:>9.0f} {sg / size:>9.0f} {total:>9.0f} {ng:>9.0f} {ng / total:>6.1f}x")
            if size == 100 and total > TARGET:
                ok = False
        print(f"target: <= {TARGET} gas per trade at batch 100: {'met' if ok else 'MISSED'}")
        return 0 if ok else 1
    finally:
        stop_anvil(proc)


if __name__ == "__main__":
    sys.exit(main())
