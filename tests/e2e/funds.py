"""Accounts and money on a real `gridbid up` server and its dev chain, for the e2e tests.

A bid must be covered by the buyer's free escrow, and escrow is what the chain holds: so an
e2e buyer gets test tokens minted to its custodial address on the server's dev chain and
deposits them through the API, as a real buyer would (Wallet page, or
POST /api/v1/ledger/deposit/). Nothing here writes the server's journal directly."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266"  # anvil's account 0: the dev chain's operator and token minter
TOKENS = 10**6  # base units of one test USDC


def manage_shell(env: Mapping[str, str], code: str, timeout: float = 60) -> str:
    """Run `code` in `gridbid manage shell` against the server's database; its stdout."""
    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def make_tokens(env: Mapping[str, str], **users: tuple[str, tuple[str, ...]]) -> dict[str, str]:
    """Create accounts and their tokens on the server's database in one go: {name: (role, scopes)}."""
    code = "from market import services\nfrom market.models import User\n" + "".join(
        (f"u = User.objects.create_user(username={name!r}, password='correct-horse-battery-staple', role='operator')\n" if role == "operator" else
         f"u = services.user_signup(username={name!r}, password='correct-horse-battery-staple', role={role!r})\n")
        + f"print({name!r}, services.token_create(user=u, name='e2e', scopes={list(scopes)!r})[1])\n"
        for name, (role, scopes) in users.items()
    )
    stdout = manage_shell(env, code)
    return dict(line.split() for line in stdout.splitlines() if line.split()[:1] and line.split()[0] in users)


def chain_rpc(server: str) -> tuple[Any, dict[str, Any]]:
    from providers.agent.chain import Rpc

    chain = httpx.get(f"{server}/api/v1/ledger/chain/").json()["chain"]
    assert chain and chain["rpc_url"] and chain["min_stake"] == 100 * TOKENS, chain
    return Rpc(chain["rpc_url"]), chain


def fund(rpc: Any, chain: dict[str, Any], address: str, amount: int) -> None:
    """Gas and `amount` test tokens for `address`, minted by the operator (a node-signed
    transaction, so no nonce of the server's is taken from under it)."""
    from providers.agent.chain import calldata

    rpc.call("anvil_setBalance", [address, hex(10**20)])
    rpc.call("anvil_impersonateAccount", [OPERATOR])
    tx = rpc.call("eth_sendTransaction", [{"from": OPERATOR, "to": chain["token"], "data": "0x" + calldata("mint(address,uint256)", address, amount).hex()}])
    for _ in range(100):
        receipt = rpc.call("eth_getTransactionReceipt", [tx])
        if receipt:
            assert receipt["status"] == "0x1", receipt
            return
        time.sleep(0.1)
    pytest.fail(f"mint {tx} not mined")


def token_balance(rpc: Any, chain: dict[str, Any], address: str) -> int:
    from providers.agent.chain import calldata

    return int(rpc.call("eth_call", [{"to": chain["token"], "data": "0x" + calldata("balanceOf(address)", address).hex()}, "latest"]), 16)


def wait_for(what: str, check: Callable[[], Any], *, seconds: float, logs: Callable[[], str] = lambda: "",
             seen: Callable[[], Any] | None = None) -> Any:
    """Poll `check` until it returns something true, and return that. Past the deadline, fail
    naming what was awaited and the last state seen (`seen()`, else `check`'s last answer),
    so a failure says where things stood."""
    deadline = time.monotonic() + seconds
    value: Any = None
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    last = seen() if seen is not None else value
    pytest.fail(f"{what}: not within {seconds:.0f} s; last seen: {last!r}\n{logs()}")


def custodial_address(env: Mapping[str, str], username: str) -> str:
    code = ("from market.models import User\nfrom ledger.custody import custodial_key_get_or_create\n"
            f"print('ADDR', custodial_key_get_or_create(user=User.objects.get(username={username!r})).address)")
    return next(line.split()[1] for line in manage_shell(env, code).splitlines() if line.startswith("ADDR "))


def escrow_deposit(server: str, env: Mapping[str, str], username: str, auth: Mapping[str, str], amount: int) -> None:
    """Mint `amount` to the user's custodial address and deposit it into escrow through the
    API; returns once the escrow shows it free (the chain's event, confirmed)."""
    rpc, chain = chain_rpc(server)
    fund(rpc, chain, custodial_address(env, username), amount)
    before = httpx.get(f"{server}/api/v1/ledger/escrow/", headers=dict(auth), timeout=30).json()["free"]
    r = httpx.post(f"{server}/api/v1/ledger/deposit/", headers={**auth, "Idempotency-Key": f"{username}-deposit-{before}-{amount}"}, json={"amount": amount}, timeout=30)
    assert r.status_code == 202, r.text
    wait_for("the deposit in escrow", lambda: httpx.get(f"{server}/api/v1/ledger/escrow/", headers=dict(auth), timeout=30).json()["free"] >= before + amount, seconds=60)


def funded_buyer(server: str, env: Mapping[str, str], name: str, amount: int = 50 * TOKENS) -> dict[str, str]:
    """A new buyer with `amount` in escrow, deposited on the server's dev chain; its auth header."""
    token = make_tokens(env, **{name: ("buyer", ("read", "trade"))})[name]
    auth = {"Authorization": f"Bearer {token}"}
    escrow_deposit(server, env, name, auth, amount)
    return auth


DEPOSIT_SCRIPT = """
import json
from ledger.context import chain_context
from ledger.custody import custodial_key_get_or_create
from ledger.listener import events_sync
from ledger.outbox import tx_submit
from ledger.services import escrow_deposit
from market.models import User

ctx = chain_context()
assert ctx is not None, "the server has no chain"
names, amount = json.loads({args!r})
users = list(User.objects.filter(username__in=names))
mints = []
for user in users:  # the dev chain mines each transaction as it comes: wait for the last only
    address = custodial_key_get_or_create(user=user).address
    ctx.client.rpc("anvil_setBalance", [address, hex(10**20)])
    mints.append(tx_submit(client=ctx.client, signer=ctx.operator, key=f"e2e-mint:{{address}}:{{amount}}", purpose="mint",
                           call=ctx.token.functions.mint(address, amount)))
assert ctx.client.wait(mints[-1].tx_hash).succeeded
deposits = [escrow_deposit(ctx=ctx, user=user, amount=amount, key=f"e2e-deposit:{{user.pk}}:{{amount}}") for user in users]
assert all(ctx.client.wait(tx.tx_hash).succeeded for tx in deposits)
events_sync(ctx=ctx, confirmations=0)
print("DEPOSITED", len(names))
"""


def escrow_deposit_many(env: Mapping[str, str], usernames: list[str], amount: int) -> None:
    """Each user's custodial address gets `amount` test tokens, deposited into escrow on the
    server's dev chain by the ledger's own deposit code, and the listener journals them: the
    real path, in one process (for load tests with many buyers, where a deposit each through
    the API would take minutes)."""
    import json

    out = manage_shell(env, DEPOSIT_SCRIPT.format(args=json.dumps([usernames, amount])), timeout=300)
    assert f"DEPOSITED {len(usernames)}" in out, out


def buyer_view(server: str, headers: Mapping[str, str]) -> str:
    """A buyer's bids (state, what the last round said of each), trades and jobs, from the
    API: what a wait for a job prints when it fails, so the failure says which step held it."""
    import httpx

    def rows(path: str, *fields: str) -> list[tuple[Any, ...]]:
        r = httpx.get(f"{server}/api/v1/{path}/", headers=dict(headers), timeout=10)
        return [tuple(x.get(f) for f in fields) for x in r.json().get("results", [])] if r.status_code == 200 else [(r.status_code, r.text[:200])]

    return (f"bids {rows('bids', 'id', 'state', 'explanation')}; trades {rows('trades', 'id', 'state', 'offer', 'round')}; "
            f"jobs {rows('jobs', 'id', 'state', 'machine')}; at {time.strftime('%H:%M:%S')}")
