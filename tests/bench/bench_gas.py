"""Gas per trade of GridBid's whole trade lifecycle (record + settle) on anvil.

    .venv/bin/python tests/bench/bench_gas.py [--sizes 1,10,100,128] [--port 18645] [--profile 100]

Starts anvil (ledger/chain/anvil.py, Prague), deploys through contracts/deploy.py,
registers 20 providers with real BLS keys, funds 40 buyers, then for each batch
size records a batch (one signed EIP-712 order per buyer, trades spread over the
buyers and providers) and settles it with one aggregate BLS signature. Beside it,
a naive escrow opens and closes one trade at a time.

The target row is batch 100 on a cold contract: a market of its own whose first
batch it is, so its record root, batch counter, order bitmap and trade bitmap are
fresh storage (20,000 gas a slot). In the sequence the earlier batches warm some of
that storage up, and batch 100 there costs less. Exits 1 if the cold batch 100
costs more than 20,000 gas per trade.
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
    parser.add_argument("--sizes", default="1,10,100,128", help="batch sizes run in turn on one market (at most 128, the contract's MAX_TRADES)")
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

        def fresh_market():
            token = deploy_token(w3, admin)
            return token, deploy_market(w3, admin=admin, token=token.address, operator=operator, arbiter=arbiter, min_stake=0)

        token, market = fresh_market()
        naive_art = compile_contract(ROOT / "tests/contracts/NaiveEscrow.vy")
        naive_receipt = w3.eth.wait_for_transaction_receipt(
            w3.eth.contract(abi=naive_art["abi"], bytecode=naive_art["bytecode"])
            .constructor(token.address, naive_operator)
            .transact({"from": admin})
        )
        naive = w3.eth.contract(address=naive_receipt["contractAddress"], abi=naive_art["abi"])

        bls_keys = [bls.keygen(hashlib.sha256(b"bench provider %d" % i).digest()) for i in range(PROVIDERS)]
        by_address = {p.address: sk for p, sk in zip(providers, bls_keys, strict=True)}

        def set_up(token, market) -> None:
            t0 = time.time()
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
        ids = {"trade": 1_000, "order": 1_000}

        def run(market, sizes: list[int], *, naive_sample: bool, profile: int = 0) -> list[tuple]:
            rows = []
            for batch_no, size in enumerate(sizes):  # a fresh market numbers its batches from 0
                nb, np_ = min(BUYERS, size), min(PROVIDERS, size)
                per_buyer: dict[int, list[int]] = {}
                for k in range(size):
                    per_buyer.setdefault(k % nb, []).append(k)
                orders, fills = [], []
                for bi in sorted(per_buyer):
                    buyer = buyers[bi]
                    order = Order(ids["order"], buyer.address, PRICE, len(per_buyer[bi]), DURATION, deadline)
                    orders.append(sign_order(buyer.key, order, chain_id=chain_id, market=market.address))
                    for k in per_buyer[bi]:
                        fills.append(TradeFill(ids["trade"], ids["order"], providers[k % np_].address, PRICE, 1))
                        ids["trade"] += 1
                    ids["order"] += 1
                call = record_args(orders, fills)
                recorded = call.recorded
                rec = send(market.functions.record_trades(*call.args), operator)

                completions = [
                    Completion(t, batch_no, pos, DURATION * t.gpus * 3 // 4, hashlib.sha256(b"%d" % t.trade_id).digest())
                    for pos, t in enumerate(recorded)
                ]
                batch = settlement_args(completions, {batch_no: recorded}, chain_id=chain_id, market=market.address,
                                        keys={a: bls.public_key(sk) for a, sk in by_address.items()})
                agg = bls.aggregate([bls.sign(by_address[s], batch.message) for s in batch.signers])
                st = send(market.functions.settle_batch(*batch.args(bls.g2_to_eip2537(agg))), operator)

                # naive escrow: the same trades, one open (buyer) + one release (operator) each
                naive_gas = 0.0
                if naive_sample:
                    sample = recorded[: min(size, 20)]
                    for t in sample:
                        buyer = next(b for b in buyers if b.address == t.buyer)
                        naive_gas += send(naive.functions.open(t.trade_id, t.provider, t.lock), buyer.address)["gasUsed"]
                        naive_gas += send(naive.functions.release(t.trade_id, t.payment(DURATION * 3 // 4)), naive_operator)["gasUsed"]
                    naive_gas /= len(sample)
                rows.append((size, nb, np_, rec["gasUsed"], st["gasUsed"], naive_gas))
                if size == profile:
                    source = ROOT / "contracts/GridBidMarket.vy"
                    print_profile(w3, rec["transactionHash"], source, f"record_trades, batch {size}")
                    print_profile(w3, st["transactionHash"], source, f"settle_batch, batch {size}")
            return rows

        # the target: batch 100 as the first batch of a market of its own
        cold_token, cold_market = fresh_market()
        set_up(cold_token, cold_market)
        cold = run(cold_market, [100], naive_sample=False, profile=args.profile)
        set_up(token, market)
        rows = run(market, sizes, naive_sample=True)
        naive_100 = next((r[5] for r in rows if r[0] == 100), rows[-1][5])
        cold = [(*r[:5], naive_100) for r in cold]

        print(f"GridBid gas per trade on anvil (prague), {BUYERS} buyers / {PROVIDERS} providers at most, one order per buyer")
        print(f"{'':>5}{'batch':>6} {'buyers':>6} {'provs':>5} {'record':>9} {'settle':>9} {'total':>9} {'naive':>9} {'saving':>7}")
        for label, size, nb, np_, rg, sg, ng in [("cold", *cold[0]), *(("", *r) for r in rows)]:
            total = (rg + sg) / size
            print(f"{label:>5}{size:>6} {nb:>6} {np_:>5} {rg / size:>9.0f} {sg / size:>9.0f} {total:>9.0f} {ng:>9.0f} {ng / total:>6.1f}x")
        size, _, _, rg, sg, _ = cold[0]
        cold_total = (rg + sg) / size
        ok = cold_total <= TARGET
        print(f"cold: batch 100 as a fresh market's first batch (fresh storage); below it, {', '.join(map(str, sizes))} in turn on one market")
        print(f"target: <= {TARGET} gas per trade at batch 100 on a cold contract: {cold_total:,.0f}, {'met' if ok else 'MISSED'}")
        return 0 if ok else 1
    finally:
        stop_anvil(proc)


if __name__ == "__main__":
    sys.exit(main())
