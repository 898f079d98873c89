"""API throughput the way users meet it: a real server process, real sockets, a full book.

For each run mode it starts the server as a subprocess on a 127.0.0.1 port from the
test suite's port band (tests/workers.py's free_port) with its own GRIDBID_DATA_DIR:

- embedded: `gridbid up` (SQLite, in-memory channel layer, Celery in the process);
- production: PostgreSQL (a database this bench creates and drops) and Redis (the
  database the test suite numbers for this process from TEST_REDIS_URL, 15 by default:
  tests/workers.py's worker_redis_url; flushed before and after), `gridbid up` serving
  plus a separate `gridbid worker` and `gridbid beat`.

Before the server starts, a seeding step (this script, `seed`, in the server's
environment) migrates, loads the demo's providers and offers and puts --bids open bids
(default 10,000; reproducible from --seed) into the book through the ORM. Then, from
this process, asyncio + httpx drive `GET /api/v1/markets/`, `GET /` (the home page) and
`POST /api/v1/bids/` at each concurrency (default 1, 16, 64) for --seconds each and
print: mode, endpoint, concurrency, requests, req/s, p50, p99, errors, and req/s as a
ratio to the same endpoint at concurrency 1 in the same run.

The offers stay live: a machine silent for 30 s goes offline and its offers pause
(providers/tasks.py), and seeding, deploying and depositing take longer than that, so
`/markets/` was once measured on an empty book. From the moment the server answers, a
thread sends every demo machine's heartbeat over HTTP, as its agent would
(POST /api/v1/agent/machines/{id}/heartbeat/, every HEARTBEAT_EVERY_S), and the bench
waits for the book to show before it measures. It prints the markets (GPU model x region
books with open offers) and open bids `/markets/` served while it was measured, and
fails when it served an empty book.

Rounds are set an hour apart (ROUND_SECONDS=3600) so the figures are the API's own;
bench_engine.py measures rounds. The servers run with tests/bench/api_settings.py: the
real settings with the throttle's allowance raised (one client on one address would
otherwise get 429 after 600 requests a minute).

Target (the box this project runs on, 2 cores): `/markets/` >= 300 req/s with
p99 <= 100 ms at concurrency 16, with 10k open bids. Exits 1 on any non-2xx answer or a
missed target.

    python tests/bench/bench_api.py [--quick] [--modes embedded,production] [--bids 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.e2e.conftest import stop_server  # noqa: E402 - needs ROOT on the path
from tests.e2e.funds import escrow_deposit_many  # noqa: E402
from tests.workers import free_port, worker_redis_url  # noqa: E402

PG_ADMIN_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_URL = worker_redis_url(os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15"))
HEARTBEAT_EVERY_S = 10.0  # each machine, well inside providers.tasks.HEARTBEAT_TIMEOUT (30 s)
BOOK_TIMEOUT_S = 60
TARGET_ENDPOINT, TARGET_CONCURRENCY, TARGET_RPS, TARGET_P99_MS = "GET /api/v1/markets/", 16, 300.0, 100.0
START_TIMEOUT_S = 240
BUYER = "bench-buyer"
BENCH_ESCROW = 10**13  # ten million USDC: more than any run's bids may promise
last_database = ""  # the name of the PostgreSQL database the last production run made


# --- seeding (runs in a subprocess with the server's environment) -------------------------
def seed(n_bids: int, seed_value: int, n_rounds: int) -> dict[str, Any]:
    """Migrate, load the demo's providers and offers, add n_bids open bids, clear n_rounds
    real rounds over that book (what the `rounds` stream's snapshot reads); return a token."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.bench.api_settings")
    import django

    django.setup()
    from django.core.management import call_command

    from demo.market import PROVIDERS, demo_load
    from market import services
    from market.models import Bid, Role, User
    from providers.models import Machine, Region

    call_command("migrate", interactive=False, verbosity=0)
    demo_load(seed=seed_value)
    buyer = services.user_signup(username=BUYER, password=uuid.uuid4().hex, role=Role.BUYER)
    _, token = services.token_create(user=buyer, name="bench", scopes=["read", "trade"])
    rng = random.Random(seed_value)
    models = sorted({m for _, _, ms in PROVIDERS for m in ms}) + ["T4-16GB", "L4-24GB"]
    regions = sorted(Region.objects.values_list("id", flat=True))
    rows = []
    for i in range(n_bids):
        # most bids name one or two models and a region or two; some take any model or region
        gpu_models = [] if rng.random() < 0.1 else rng.sample(models, rng.choice([1, 1, 1, 2, 3]))
        allowed = [] if rng.random() < 0.4 else rng.sample(regions, rng.choice([1, 1, 2, 3]))
        rows.append(Bid(
            buyer=buyer, client_order_id=f"seed-{i}", job_spec={"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]},
            gpus=rng.choice([1, 1, 2, 4, 8]), gpu_models=gpu_models, allowed_regions=allowed,
            max_price=rng.randrange(100_000, 1_500_000, 1000), duration_s=rng.choice([1, 2, 6, 24]) * 3600,
            klass=rng.choice(["on_demand", "on_demand", "spot", "reserved"]),
        ))
    Bid.objects.bulk_create(rows, batch_size=1000)
    from django.utils import timezone

    from market.rounds import round_clear, slot_for

    now = timezone.now()
    for i in range(n_rounds):
        round_clear(now=now, slot=slot_for(now) - n_rounds + i)  # past slots: the server's own rounds keep theirs
    # the demo providers' agents: a token each, to heartbeat their machines while the bench runs
    agents = []
    for name, _, _ in PROVIDERS:
        provider = User.objects.get(username=name)
        _, agent_token = services.token_create(user=provider, name="bench-agent", scopes=["provide"])
        agents.append({"token": agent_token, "machines": list(Machine.objects.filter(provider__user=provider).values_list("id", flat=True))})
    return {"token": token, "open_bids": Bid.objects.filter(state="open").count(), "agents": agents}


# --- processes --------------------------------------------------------------------------
@contextlib.contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh PostgreSQL database for one run, dropped after it."""
    import psycopg

    global last_database
    name = last_database = f"gridbid_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def chain_node() -> Iterator[str]:
    """A dev chain (anvil) of this run's own; its JSON-RPC URL."""
    from ledger.chain.anvil import start_anvil, stop_anvil

    port = free_port()
    proc = start_anvil(port=port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_anvil(proc)


@contextlib.contextmanager
def redis_database() -> Iterator[str]:
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2)
    client.flushdb()
    try:
        yield REDIS_URL
    finally:
        client.flushdb()
        client.close()


class Heartbeats:
    """The demo machines' agents, reduced to their heartbeat: one thread posting each
    machine's over HTTP every HEARTBEAT_EVERY_S, so its offers stay open for the whole run."""

    def __init__(self, base: str, agents: list[dict[str, Any]]) -> None:
        self.base, self.agents = base, agents
        self.stop = threading.Event()
        self.sent = 0
        self.failed: list[str] = []
        self.thread = threading.Thread(target=self.run, name="bench-heartbeats", daemon=True)

    def beat_all(self, client: Any) -> None:
        for agent in self.agents:
            for machine_id in agent["machines"]:
                r = client.post(f"{self.base}/api/v1/agent/machines/{machine_id}/heartbeat/", json={"agent_version": "bench"},
                                headers={"Authorization": f"Bearer {agent['token']}"})
                self.sent += 1
                if r.status_code != 200 and len(self.failed) < 5:
                    self.failed.append(f"machine {machine_id}: {r.status_code} {r.text[:200]}")

    def run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                try:
                    self.beat_all(client)
                except httpx.HTTPError as exc:
                    if len(self.failed) < 5:
                        self.failed.append(repr(exc))
                self.stop.wait(HEARTBEAT_EVERY_S)

    def __enter__(self) -> Heartbeats:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def wait_for_book(base: str) -> list[dict[str, Any]]:
    """/markets/ once it lists a book with open offers (the first heartbeats reopen the
    offers the machines' silence paused)."""
    import httpx

    deadline = time.monotonic() + BOOK_TIMEOUT_S
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        rows = httpx.get(f"{base}/api/v1/markets/", timeout=10).json()
        if book_size(rows)[0]:
            return rows
        time.sleep(0.5)
    raise SystemExit(f"/api/v1/markets/ listed no book with open offers within {BOOK_TIMEOUT_S} s of the first heartbeats; last: {rows}")


def book_size(rows: list[dict[str, Any]]) -> tuple[int, int]:
    """(markets with open offers, open bids summed over them: a bid that fits several
    markets counts in each)."""
    live = [r for r in rows if r.get("offers")]
    return len(live), sum(r.get("open_bids") or 0 for r in live)


@contextlib.contextmanager
def server(mode: str, data: Path, n_bids: int, seed_value: int, n_rounds: int) -> Iterator[tuple[str, str, int]]:
    """Seed, then start the mode's processes and the machines' heartbeats; yields (base
    URL, the buyer's token, the serving process's pid) once the book shows."""
    with contextlib.ExitStack() as stack:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CHAIN_RPC_URL")}
        env.update(GRIDBID_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE="tests.bench.api_settings", PYTHONPATH=str(ROOT),
                   ROUND_SECONDS="3600", LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1", GRIDBID_CHAIN_PORT=str(free_port()),
                   # this one address stands in for many clients: no per-address socket cap
                   WS_MAX_PER_ADDRESS="100000")
        if mode == "production":
            env["DATABASE_URL"] = stack.enter_context(postgres_database())
            env["REDIS_URL"] = stack.enter_context(redis_database())
            # production settles on a chain of its own (CHAIN_RPC_URL; anvil stands in for it)
            env["CHAIN_RPC_URL"], env["CHAIN_CONFIRMATIONS"] = stack.enter_context(chain_node()), "0"
        started = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "seed", "--bids", str(n_bids), "--seed", str(seed_value),
                              "--rounds", str(n_rounds)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
        if out.returncode:
            raise SystemExit(f"{mode}: seeding failed:\n{out.stdout}\n{out.stderr}")
        seeded = json.loads(out.stdout.strip().splitlines()[-1])
        if mode == "production":  # the contracts, deployed as an operator does
            out = subprocess.run([sys.executable, "-m", "gridbid.cli", "chain", "deploy"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
            if out.returncode:
                raise SystemExit(f"{mode}: gridbid chain deploy failed:\n{out.stdout}\n{out.stderr}")
        print(f"  {mode}: seeded {seeded['open_bids']:,} open bids and {n_rounds} cleared rounds in {time.perf_counter() - started:.1f} s", flush=True)
        port = free_port()
        commands = [["up", "--port", str(port)]]
        if mode == "production":
            commands += [["worker", "--concurrency", "1"], ["beat"]]
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for args in commands:
                log = open(data / f"{args[0]}.log", "w")  # noqa: SIM115 - closed with the stack
                stack.callback(log.close)
                # cwd=data: beat keeps its schedule file in its working directory
                procs.append(subprocess.Popen([sys.executable, "-m", "gridbid.cli", *args], cwd=data, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, procs[0], data / "up.log")
            print(f"  {mode}: server up in {time.perf_counter() - started:.1f} s since seeding began", flush=True)
            beats = stack.enter_context(Heartbeats(base, seeded["agents"]))
            markets, bids = book_size(wait_for_book(base))
            print(f"  {mode}: {sum(len(a['machines']) for a in seeded['agents'])} machines heartbeating; "
                  f"/markets/ lists {markets} markets with {bids:,} open bids", flush=True)
            # bids need escrow behind them: the buyer deposits on the server's dev chain (the
            # seeded rounds, cleared before, set the unfunded seeded bids aside)
            escrow_deposit_many(env, [BUYER], BENCH_ESCROW)
            yield base, seeded["token"], procs[0].pid
            if beats.failed:
                raise SystemExit(f"{mode}: heartbeats failed ({beats.sent} sent): " + "; ".join(beats.failed))
        finally:
            for proc in reversed(procs):
                stop_server(proc)


def wait_healthy(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    import httpx

    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise SystemExit(f"server did not answer /healthz within {START_TIMEOUT_S} s:\n{log.read_text()[-4000:]}")


# --- load -------------------------------------------------------------------------------
@dataclass
class Cell:
    mode: str
    endpoint: str
    concurrency: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str = ""
    server_cpu_s: float = 0.0
    book: tuple[int, int] | None = None  # /markets/: the smallest (markets, open bids) it answered

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def cpu_ms(self) -> float:
        """The server process's CPU time per request: what a request costs, however busy
        the box is with other work (wall-clock figures here are shared with it)."""
        return 1000 * self.server_cpu_s / self.requests if self.requests else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bid_body(rng: random.Random) -> dict[str, Any]:
    return {"job_spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]}, "gpus": rng.choice([1, 2, 4]),
            "gpu_models": [rng.choice(["H100-SXM-80GB", "A100-SXM-80GB", "RTX-4090-24GB"])], "max_price": rng.randrange(100_000, 900_000, 1000),
            "duration_s": 3600}


async def drive(base: str, token: str, mode: str, endpoint: str, concurrency: int, seconds: float, max_requests: int) -> Cell:
    """`concurrency` clients, each sending its next request when the last one is answered,
    for `seconds` (and at most `max_requests` in all)."""
    import httpx

    method, path = endpoint.split(" ", 1)
    headers = {"Authorization": f"Bearer {token}"} if method == "POST" else {}
    latencies: list[float] = []
    errors = 0
    first_error = ""
    rng = random.Random(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30, headers=headers) as client:
        for _ in range(3):  # warm: connections, the server's first-request imports
            await client.request(method, path, json=bid_body(rng) if method == "POST" else None)
        started = time.perf_counter()
        deadline = started + seconds
        sent = 0

        async def one_client() -> None:
            nonlocal errors, first_error, sent
            while time.perf_counter() < deadline and sent < max_requests:
                sent += 1
                t0 = time.perf_counter()
                try:
                    r = await client.request(method, path, json=bid_body(rng) if method == "POST" else None)
                    ok, why = 200 <= r.status_code < 300, f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, why = False, repr(exc)
                latencies.append(time.perf_counter() - t0)
                if not ok:
                    errors += 1
                    first_error = first_error or why
                elif markets and sent % 50 == 1:  # what the book held, sampled: parsing every answer would load this client
                    books.append(book_size(r.json()))

        markets = path.startswith("/api/v1/markets/")
        books: list[tuple[int, int]] = []
        await asyncio.gather(*(one_client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan")
    return Cell(mode, endpoint, concurrency, len(ms), elapsed, statistics.median(ms) if ms else float("nan"), p99, errors, first_error,
                book=min(books) if books else None)


async def drive_ws(base: str, mode: str, channel: str, concurrency: int, seconds: float, max_requests: int) -> Cell:
    """`concurrency` subscribers, each opening a socket, subscribing to `channel` and timing
    the wait for its snapshot (then closing and starting over) for `seconds`."""
    from websockets.asyncio.client import connect

    url = base.replace("http://", "ws://") + "/ws/v1/stream"
    latencies: list[float] = []
    errors = 0
    first_error = ""
    started = time.perf_counter()
    deadline = started + seconds
    sent = 0

    async def one_subscriber() -> None:
        nonlocal errors, first_error, sent
        while time.perf_counter() < deadline and sent < max_requests:
            sent += 1
            try:
                async with asyncio.timeout(60), connect(url, max_size=2**24, open_timeout=30) as ws:
                    welcome = json.loads(await ws.recv())
                    assert welcome["type"] == "welcome", welcome
                    t0 = time.perf_counter()
                    await ws.send(json.dumps({"type": "subscribe", "channel": channel}))
                    msg = json.loads(await ws.recv())
                    latencies.append(time.perf_counter() - t0)
                    if msg.get("type") != "snapshot":
                        raise AssertionError(str(msg)[:200])
            except Exception as exc:  # noqa: BLE001 - a refused or closed socket, a timeout, a wrong answer: counted, not fatal
                errors += 1
                first_error = first_error or repr(exc)

    await asyncio.gather(*(one_subscriber() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    ms = sorted(x * 1000 for x in latencies)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan")
    return Cell(mode, f"WS {channel} snapshot", concurrency, len(ms), elapsed, statistics.median(ms) if ms else float("nan"), p99, errors, first_error)


ENDPOINTS = ("GET /api/v1/markets/", "GET /", "POST /api/v1/bids/", "WS rounds")


def print_row(cell: Cell, base_rps: float | None) -> None:
    ratio = f"{cell.rps / base_rps:6.2f}x" if base_rps else "   base"
    print(f"{cell.mode:<11}{cell.endpoint:<22}{cell.concurrency:>5}{cell.requests:>9,}{cell.rps:>9.1f}{cell.p50_ms:>9.1f}{cell.p99_ms:>9.1f}"
          f"{cell.errors:>8}{ratio:>9}{cell.cpu_ms:>10.2f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="run", choices=["run", "seed"], help=argparse.SUPPRESS)
    ap.add_argument("--modes", default="embedded,production")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--endpoints", default=",".join(ENDPOINTS), help="comma-separated, e.g. 'GET /api/v1/markets/'")
    ap.add_argument("--bids", type=int, default=10_000, help="open bids seeded into the book")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1, help="rounds cleared over the seeded book before the server starts")
    ap.add_argument("--seconds", type=float, default=4.0, help="per endpoint and concurrency")
    ap.add_argument("--max-requests", type=int, default=20_000, help="per endpoint and concurrency")
    ap.add_argument("--quick", action="store_true", help="2 s per figure, concurrency 1 and 16")
    args = ap.parse_args()
    if args.command == "seed":
        print(json.dumps(seed(args.bids, args.seed, args.rounds)))
        return 0
    if args.quick:
        args.seconds, args.concurrency = 2.0, "1,16"
    concurrencies = [int(c) for c in args.concurrency.split(",")]
    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    print(f"API throughput, {args.bids:,} open bids (seed {args.seed}), {args.seconds:g} s per figure; latencies in ms; "
          "ratio: req/s over the same endpoint's at concurrency 1; cpu ms/req: the serving process's CPU time per request", flush=True)
    cells: list[Cell] = []
    for mode in modes:
        with tempfile.TemporaryDirectory(prefix=f"gridbid-bench-{mode}-") as tmp, server(mode, Path(tmp), args.bids, args.seed, args.rounds) as (base, token, pid):
            print(f"{'mode':<11}{'endpoint':<22}{'conc':>5}{'requests':>9}{'req/s':>9}{'p50':>9}{'p99':>9}{'errors':>8}{'ratio':>9}{'cpu ms/req':>11}")
            for endpoint in endpoints:
                base_rps = None
                for c in concurrencies:
                    cpu_before = cpu_seconds(pid)
                    if endpoint.startswith("WS "):
                        cell = asyncio.run(drive_ws(base, mode, endpoint.split(" ", 1)[1], c, args.seconds, args.max_requests))
                    else:
                        cell = asyncio.run(drive(base, token, mode, endpoint, c, args.seconds, args.max_requests))
                    cell.server_cpu_s = cpu_seconds(pid) - cpu_before
                    cells.append(cell)
                    print_row(cell, base_rps)
                    base_rps = base_rps or cell.rps
            if any(c.errors for c in cells if c.mode == mode):  # the server's side of it, before its folder goes
                for log in sorted(Path(tmp).glob("*.log")):
                    print(f"--- {mode}: end of {log.name}\n{log.read_text(errors='replace')[-6000:]}")
    failed = False
    for cell in cells:
        if cell.errors:
            failed = True
            print(f"FAILED: {cell.mode} {cell.endpoint} at {cell.concurrency}: {cell.errors} errors, first: {cell.first_error}")
    for cell in cells:
        if cell.endpoint == TARGET_ENDPOINT:
            if not cell.book or not cell.book[0] or not cell.book[1]:
                failed = True
                print(f"FAILED: {cell.mode} {cell.endpoint} at {cell.concurrency} was measured on an empty book: {cell.book} (markets, open bids)")
            else:
                print(f"served: {cell.mode} {cell.endpoint} at {cell.concurrency}: {cell.book[0]} markets with open offers, "
                      f"{cell.book[1]:,} open bids (at least, over the answers sampled; a bid counts in each market it fits)")
    for cell in cells:
        if cell.endpoint == TARGET_ENDPOINT and cell.concurrency == TARGET_CONCURRENCY:
            met = cell.rps >= TARGET_RPS and cell.p99_ms <= TARGET_P99_MS
            failed = failed or not met
            print(f"{'met' if met else 'MISSED'}: {cell.mode} {TARGET_ENDPOINT} at {TARGET_CONCURRENCY}: {cell.rps:.0f} req/s "
                  f"(target >= {TARGET_RPS:g}), p99 {cell.p99_ms:.1f} ms (target <= {TARGET_P99_MS:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
