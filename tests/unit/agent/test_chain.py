"""The agent's chain client and its `register` (on chain) and `withdraw` commands, against a
fake JSON-RPC node that plays the market and token contracts (the real contracts are
exercised by tests/e2e/test_agent_e2e.py on anvil)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from providers.agent import chain as ch
from providers.agent.cli import main

MARKET = "0x5FbDB2315678afecb367f053371D33aA2a4B0c5A"
TOKEN = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"
T = 10**6


# --- signatures and errors -----------------------------------------------------------------
def _abi_signatures(name: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    from contracts.compile import load_artifact

    def kind(p: dict[str, Any]) -> str:
        if p["type"].startswith("tuple"):
            return "(" + ",".join(kind(c) for c in p["components"]) + ")" + p["type"][5:]
        return str(p["type"])

    out = {}
    for item in load_artifact(name)["abi"]:
        if item.get("type") == "function":
            outputs = tuple(t for o in item["outputs"] for t in (kind(o)[1:-1].split(",") if kind(o).startswith("(") else [kind(o)]))
            out[item["name"]] = (f"{item['name']}({','.join(kind(i) for i in item['inputs'])})", outputs)
    return out


@pytest.mark.parametrize("contract,functions", [("GridBidMarket", ch.MARKET_FUNCTIONS), ("TestToken", ch.TOKEN_FUNCTIONS)])
def test_the_agents_function_signatures_match_the_compiled_abis(contract, functions):
    abi = _abi_signatures(contract)
    for name, (signature, outputs) in functions.items():
        assert abi[name] == (signature, outputs), name


def _error_data(reason: str) -> str:
    from eth_abi import encode

    return "0x" + (ch.ERROR_STRING + encode(["string"], [reason])).hex()


@pytest.mark.parametrize("error,reason", [
    ({"code": 3, "message": "execution reverted: market: paused", "data": _error_data("market: paused")}, "market: paused"),
    ({"code": -32000, "message": "execution reverted: market: low balance"}, "market: low balance"),
    ({"code": -32000, "message": "execution reverted"}, "reverted without a reason"),
    ({"code": -32000, "message": "nonce too low"}, None),
])
def test_a_revert_reason_is_read_from_the_node_error(error, reason):
    assert ch.revert_reason(error) == reason


@pytest.mark.parametrize("url", ["ftp://x", "localhost:8545", "", "http://"])
def test_an_rpc_url_must_be_http(url):
    with pytest.raises(ch.ChainError, match="not a JSON-RPC URL"):
        ch.Rpc(url)


def test_amounts_show_exactly():
    assert (ch.tokens(50_000), ch.tokens(100 * T), ch.tokens(1), ch.tokens(0)) == ("0.05", "100", "0.000001", "0")


# --- a fake node ---------------------------------------------------------------------------
class FakeChain:
    """Just enough of a node, the market and the token for the agent's calls."""

    def __init__(self, chain_id: int = 31337, min_stake: int = 100 * T) -> None:
        self.chain_id, self.min_stake = chain_id, min_stake
        self.eth: dict[str, int] = defaultdict(int)
        self.tokens: dict[str, int] = defaultdict(int)
        self.allowance: dict[tuple[str, str], int] = defaultdict(int)
        self.free: dict[str, int] = defaultdict(int)
        self.stake: dict[str, int] = {}
        self.sent: list[str] = []
        self.receipts: dict[str, dict[str, Any]] = {}
        self.nonce: dict[str, int] = defaultdict(int)
        self.down = False
        self.fns = {ch.selector(sig): (name, sig) for name, (sig, _) in {**ch.MARKET_FUNCTIONS, **ch.TOKEN_FUNCTIONS}.items()}

    def transport(self) -> httpx.MockTransport:
        def handle(request: httpx.Request) -> httpx.Response:
            if self.down:
                raise httpx.ConnectError("connection refused")
            body = json.loads(request.content)
            try:
                return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "result": self.rpc(body["method"], body["params"])})
            except ch.Reverted as exc:
                return httpx.Response(200, json={"jsonrpc": "2.0", "id": body["id"], "error": {"code": 3, "message": f"execution reverted: {exc.reason}", "data": _error_data(exc.reason)}})

        return httpx.MockTransport(handle)

    def rpc(self, method: str, params: list[Any]) -> Any:
        if method == "eth_chainId":
            return hex(self.chain_id)
        if method == "eth_getCode":
            return "0x6001" if params[0].lower() in (MARKET.lower(), TOKEN.lower()) else "0x"
        if method == "eth_getBalance":
            return hex(self.eth[params[0].lower()])
        if method == "eth_call":
            return self.execute(params[0].get("from", "0x" + "00" * 20), params[0]["to"], bytes.fromhex(params[0]["data"][2:]), dry=True)
        if method == "eth_estimateGas":
            return hex(100_000)
        if method == "eth_getBlockByNumber":
            return {"number": "0x10", "baseFeePerGas": hex(10**9)}
        if method == "eth_maxPriorityFeePerGas":
            return hex(10**9)
        if method == "eth_getTransactionCount":
            return hex(self.nonce[params[0].lower()])
        if method == "eth_sendRawTransaction":
            return self.send(bytes.fromhex(params[0][2:]))
        if method == "eth_getTransactionReceipt":
            return self.receipts.get(params[0])
        raise AssertionError(method)

    def send(self, raw: bytes) -> str:
        import rlp
        from eth_account import Account
        from eth_utils import keccak, to_checksum_address

        sender = Account.recover_transaction(raw).lower()
        fields = rlp.decode(raw[1:])  # type 2: chainId, nonce, tip, maxFee, gas, to, value, data, ...
        assert int.from_bytes(fields[0], "big") == self.chain_id and int.from_bytes(fields[1], "big") == self.nonce[sender]
        self.nonce[sender] += 1
        self.eth[sender] -= 100_000 * 10**9
        self.execute(sender, to_checksum_address(fields[5]), fields[7], dry=False)
        tx_hash = "0x" + keccak(raw).hex()
        self.sent.append(self.fns[fields[7][:4]][0])
        self.receipts[tx_hash] = {"status": "0x1", "blockNumber": hex(16 + len(self.sent)), "transactionHash": tx_hash}
        return tx_hash

    def execute(self, sender: str, to: str, data: bytes, *, dry: bool) -> str:
        from eth_abi import decode, encode

        sender = sender.lower()
        name, sig = self.fns[data[:4]]
        types = [t for t in sig[sig.index("(") + 1 : -1].split(",") if t]
        args = decode(types, data[4:])
        word = lambda *v: "0x" + encode(["uint256"] * len(v), list(v)).hex()  # noqa: E731
        if name == "providers":
            a = args[0].lower()
            state = 0 if a not in self.stake else 1 if self.stake[a] >= self.min_stake else 2
            return word(state, self.stake.get(a, 0), 0)
        if name == "min_stake":
            return word(self.min_stake)
        if name == "balance_of":
            return word(self.free[args[0].lower()])
        if name == "balanceOf":
            return word(self.tokens[args[0].lower()])
        if name == "allowance":
            return word(self.allowance[(args[0].lower(), args[1].lower())])
        if name == "approve":
            if not dry:
                self.allowance[(sender, args[0].lower())] = args[1]
            return word(1)
        if name == "register":
            pubkey, pop, stake = args
            if sender in self.stake:
                raise ch.Reverted("market: already registered")
            assert len(pubkey) == 128 and len(pop) == 256
            if self.allowance[(sender, MARKET.lower())] < stake:
                raise ch.Reverted("token: allowance")
            if not dry:
                self.stake[sender] = stake
                self.tokens[sender] -= stake
            return "0x"
        if name == "add_stake":
            if sender not in self.stake:
                raise ch.Reverted("market: not provider")
            if self.allowance[(sender, MARKET.lower())] < args[0]:
                raise ch.Reverted("token: allowance")
            if not dry:
                self.stake[sender] += args[0]
                self.tokens[sender] -= args[0]
            return "0x"
        if name == "withdraw":
            if self.free[sender] < args[0]:
                raise ch.Reverted("market: low balance")
            if not dry:
                self.free[sender] -= args[0]
                self.tokens[sender] += args[0]
            return "0x"
        raise AssertionError(name)


def market_api(chain: dict[str, Any] | None, calls: list[str]) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        calls.append(f"{request.method} {path}")
        if path == "/api/v1/ledger/chain/":
            return httpx.Response(200, json={"chain": chain})
        if path == "/api/v1/agent/challenge/":
            return httpx.Response(200, json={"challenge": "c", "expires_in_s": 300})
        if path == "/api/v1/machines/" and request.method == "GET":
            return httpx.Response(200, json=[{"name": "m1", "id": 7}])
        return httpx.Response(200, json={})

    return httpx.MockTransport(handle)


@pytest.fixture(scope="module")
def keyed_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from providers.agent.config import AgentConfig, save_config
    from providers.agent.keys import create_keys

    home = tmp_path_factory.mktemp("agent")
    inventory = home / "inv.json"
    inventory.write_text(json.dumps({"gpus": [{"name": "NVIDIA L4", "memory_mib": 23034}]}))
    save_config(home, AgentConfig(market_url="http://m", token="gb_x", machine_name="m1", inventory_file=str(inventory)))
    create_keys(home, kdf_iterations=2)
    return home


class Setup:
    def __init__(self, home: Path, monkeypatch: pytest.MonkeyPatch, chain_body: dict[str, Any] | None) -> None:
        from providers.agent import commands
        from providers.agent.client import MarketClient
        from providers.agent.keys import eth_address

        self.home, self.node, self.api_calls, self.rpc_urls = home, FakeChain(), [], []
        self.address = eth_address(home).lower()
        monkeypatch.setattr(commands, "client_for", lambda config: MarketClient(config.market_url, config.token, transport=market_api(chain_body, self.api_calls)))

        def rpc_for(url: str) -> ch.Rpc:
            self.rpc_urls.append(url)
            return ch.Rpc(url, transport=self.node.transport())

        monkeypatch.setattr(commands, "rpc_for", rpc_for)

    def run(self, *args: str) -> Any:
        r = CliRunner().invoke(main, ["--home", str(self.home), *args], env={"COLUMNS": "300"})
        r.flat = " ".join(r.output.split())
        return r


CHAIN = {"chain_id": 31337, "market": MARKET, "token": TOKEN, "rpc_url": "http://node:8545", "min_stake": 100 * T, "token_decimals": 6}


@pytest.fixture
def agent(keyed_home: Path, monkeypatch: pytest.MonkeyPatch) -> Setup:
    from providers.agent.config import load_config, save_config

    config = load_config(keyed_home)
    config.rpc_url = None
    save_config(keyed_home, config)
    return Setup(keyed_home, monkeypatch, CHAIN)


# --- register ------------------------------------------------------------------------------
def test_register_approves_the_stake_and_registers_the_bls_key_on_chain_once(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.tokens[agent.address] = 150 * T
    r = agent.run("register")
    assert r.exit_code == 0, r.output
    assert agent.node.sent == ["approve", "register"] and agent.node.stake[agent.address] == 100 * T
    assert "Approved the market to take the 100-token stake" in r.flat and "Registered on chain 31337" in r.flat and "staked 100 tokens" in r.flat
    assert "POST /api/v1/agent/challenge/verify/" in agent.api_calls  # the market learns the address as before
    assert agent.rpc_urls == ["http://node:8545"]  # the market's node

    again = agent.run("register")
    assert again.exit_code == 0 and "Already registered on chain 31337" in again.flat and "nothing to do" in again.flat
    assert agent.node.sent == ["approve", "register"]


def test_register_with_a_larger_stake_and_an_existing_allowance_skips_the_approval(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.tokens[agent.address] = 300 * T
    agent.node.allowance[(agent.address, MARKET.lower())] = 250 * T
    r = agent.run("register", "--stake", "250", "--rpc-url", "http://own-node:8545")
    assert r.exit_code == 0, r.output
    assert agent.node.sent == ["register"] and agent.node.stake[agent.address] == 250 * T
    assert agent.rpc_urls == ["http://own-node:8545"]
    from providers.agent.config import load_config

    assert load_config(agent.home).rpc_url == "http://own-node:8545"  # kept for withdraw and the next register


def test_register_without_enough_tokens_says_how_many_more_to_send(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.tokens[agent.address] = 40 * T
    r = agent.run("register")
    assert r.exit_code == 1
    assert "Registered machine" in r.flat or "registered already" in r.flat
    assert "Not enough tokens for the stake" in r.flat and "holds 40 of token" in r.flat and "Send at least 60 more tokens" in r.flat
    assert agent.node.sent == [] and "Traceback" not in r.output


def test_register_without_gas_says_to_send_eth(agent):
    agent.node.tokens[agent.address] = 100 * T
    r = agent.run("register")
    assert r.exit_code == 1 and "No ETH for gas" in r.flat and f"send some eth to {agent.address.lower()}" in r.flat.lower()
    assert "`gridbid-agent faucet`, runs only on a market's dev chain, not on this one" in r.flat and agent.node.sent == []


@pytest.mark.parametrize("stake,msg", [("50", "below the market's minimum stake of 100 tokens"), ("lots", "not an amount")])
def test_a_bad_stake_is_refused_before_anything_is_sent(agent, stake, msg):
    agent.node.eth[agent.address] = 10**18
    agent.node.tokens[agent.address] = 500 * T
    r = agent.run("register", "--stake", stake)
    assert r.exit_code == 2 and msg in r.flat and agent.node.sent == []


def test_a_market_without_a_chain_registers_the_machine_and_says_why_staking_is_skipped(keyed_home, monkeypatch):
    agent = Setup(keyed_home, monkeypatch, None)
    r = agent.run("register")
    assert r.exit_code == 0, r.output
    assert "On-chain registration skipped" in r.flat and "no settlement chain configured" in r.flat and agent.rpc_urls == []


def test_an_unreachable_node_is_one_clear_message(agent):
    agent.node.down = True
    r = agent.run("register")
    assert r.exit_code == 1 and "cannot reach the chain node at http://node:8545" in r.flat and "--rpc-url" in r.flat and "Traceback" not in r.output


def test_a_node_of_another_chain_is_refused(agent):
    agent.node.chain_id = 1
    r = agent.run("register")
    assert r.exit_code == 1 and "is chain 1, but the market settles on chain 31337" in r.flat


def test_no_published_node_asks_for_one(keyed_home, monkeypatch):
    agent = Setup(keyed_home, monkeypatch, {**CHAIN, "rpc_url": None})
    r = agent.run("register")
    assert r.exit_code == 2 and "publishes no node URL" in r.flat and "--rpc-url" in r.flat


def test_a_rejected_registration_shows_the_contracts_reason(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.tokens[agent.address] = 150 * T
    market = ch.Market(ch.Rpc("http://node:8545", transport=agent.node.transport()), ch.ChainInfo(31337, MARKET, TOKEN, None, 0))
    with pytest.raises(ch.Reverted, match="token: allowance"):
        market.register(type("A", (), {"address": agent.address})(), pubkey_eip2537=b"\0" * 128, pop_eip2537=b"\0" * 256, stake=T)


# --- withdraw ------------------------------------------------------------------------------
def test_withdraw_takes_the_whole_free_balance_and_shows_before_and_after(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.free[agent.address] = 1_234_567
    agent.node.tokens[agent.address] = 5 * T
    r = agent.run("withdraw")
    assert r.exit_code == 0, r.output
    assert agent.node.sent == ["withdraw"] and agent.node.free[agent.address] == 0 and agent.node.tokens[agent.address] == 5 * T + 1_234_567
    assert "Withdrew 1.234567 tokens" in r.flat and "1.234567 -> 0" in r.flat and "5 -> 6.234567" in r.flat and "1234567 base units" in r.flat


def test_withdraw_an_amount(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.free[agent.address] = 3 * T
    r = agent.run("withdraw", "--amount", "1.5")
    assert r.exit_code == 0, r.output
    assert agent.node.free[agent.address] == 1_500_000 and "3 -> 1.5" in r.flat


@pytest.mark.parametrize("amount,msg", [("4", "more than the free balance of 3 tokens"), ("0", "must be more than 0"), ("-1", "amount"), ("x", "not an amount")])
def test_withdraw_refuses_a_bad_amount(agent, amount, msg):
    agent.node.eth[agent.address] = 10**18
    agent.node.free[agent.address] = 3 * T
    r = agent.run("withdraw", "--amount", amount)
    assert r.exit_code == 2 and msg in r.flat and agent.node.sent == []


def test_withdraw_with_nothing_free_says_so(agent):
    r = agent.run("withdraw")
    assert r.exit_code == 0 and "Nothing to withdraw" in r.flat and agent.node.sent == []


def test_withdraw_without_a_chain_says_why(keyed_home, monkeypatch):
    agent = Setup(keyed_home, monkeypatch, None)
    r = agent.run("withdraw")
    assert r.exit_code == 2 and "Nothing to withdraw on chain" in r.flat and "no settlement chain" in r.flat


def test_withdraw_from_an_unreachable_node_says_so(agent):
    agent.node.down = True
    r = agent.run("withdraw", "--rpc-url", "http://127.0.0.1:9")
    assert r.exit_code == 1 and "cannot reach the chain node at http://127.0.0.1:9" in r.flat


# --- stake ---------------------------------------------------------------------------------
def test_stake_tops_a_suspended_provider_up_to_the_minimum(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.stake[agent.address] = 40 * T  # a ruling slashed it below the 100-token minimum
    agent.node.tokens[agent.address] = 70 * T
    r = agent.run("stake")
    assert r.exit_code == 0, r.output
    assert agent.node.sent == ["approve", "add_stake"] and agent.node.stake[agent.address] == 100 * T
    assert "Added 60 tokens of stake" in r.flat and "40 -> 100 (minimum 100)" in r.flat
    assert "suspended: stake below the minimum -> active" in r.flat


def test_stake_an_amount_above_the_minimum(agent):
    agent.node.eth[agent.address] = 10**18
    agent.node.stake[agent.address] = 100 * T
    agent.node.tokens[agent.address] = 70 * T
    r = agent.run("stake", "--amount", "25")
    assert r.exit_code == 0, r.output
    assert agent.node.stake[agent.address] == 125 * T and "active -> active" in r.flat


@pytest.mark.parametrize("setup,args,msg", [
    ({}, [], "not registered in the market contract"),
    ({"stake": 100 * T}, [], "Nothing to add"),
    ({"stake": 40 * T, "tokens": 10 * T}, [], "Not enough tokens"),
    ({"stake": 40 * T}, ["--amount", "0"], "must be more than 0"),
])
def test_stake_says_why_it_sends_nothing(agent, setup, args, msg):
    agent.node.eth[agent.address] = 10**18
    if "stake" in setup:
        agent.node.stake[agent.address] = setup["stake"]
    agent.node.tokens[agent.address] = setup.get("tokens", 0)
    r = agent.run("stake", *args)
    assert msg in r.flat and agent.node.sent == []
    assert r.exit_code == (0 if msg == "Nothing to add" else 2)
