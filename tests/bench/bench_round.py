"""One real round at scale, and the market list while rounds run (issue 39), measured from outside.

The market runs in production mode as tests/bench/bench_api.py starts it (PostgreSQL in a
database this bench creates and drops, Redis, a dev chain, `gridbid up` serving plus a
`gridbid worker` and `gridbid beat`, ROUND_SECONDS an hour so that the rounds measured
are this bench's). Before it starts, a seeding step (this script, `seed`, in the server's
environment) migrates and writes the book in bulk, row for row what the services write
(`services.user_signup`, `machine_register`, `offer_publish`, `bid_place`), and these
rows alone:

- --offers offers (default 10,000), one per machine, of 1, 2, 4 or 8 GPUs of a catalogue
  model, in a catalogue region, at the model's catalogue rate x [0.7, 1.3], from providers
  of 10 machines each; every machine online, heartbeating;
- --bids open bids (default 10,000) of --buyers buyers (100), drawn as bench_api.py draws
  them, each buyer's escrow then deposited on the dev chain by the ledger's own code and
  journaled by its listener (the real path: the round checks every bid's funding).

The machines stay live as their agents would keep them: the first --http-agents providers'
machines heartbeat over HTTP (their agents' tokens, every 10 s, through the server), and
this process writes the rest's heartbeats to the database every 10 s (one UPDATE: 10,000
agents' requests are more than one 2-core server can answer besides the load measured;
a market of that size runs several servers).

Then, in this process (Django against the same database):

1. **The market list at rest**: a client in a separate process (`load`: asyncio + httpx,
   real sockets) sends `GET /api/v1/markets/` from --concurrency clients (16) for --seconds;
2. **One round over the whole book**, through `market.rounds.round_clear` as the beat's
   task runs it: its wall time, and its phases (`round_ms` in its stats: prepare, snapshot,
   left out, engine, trades, bookings, explanations, record; commit and publish the rest);
3. **The market list while rounds run**: the same client again, while this process clears
   round after round (new bids keep coming: each round's matched bids are replaced by as
   many new ones, so the book stays at its size). The ratio is req/s over (1).

Targets (2 cores): the round at most 5 s at 10k orders a side; `/markets/` at least 300
req/s with p99 at most 100 ms at concurrency 16 while rounds run. Exits 1 when one is
missed, or on any error.

    python tests/bench/bench_round.py [--bids 10000] [--offers 10000] [--seconds 8] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.bench_api import (  # noqa: E402 - needs ROOT on the path
    Cell,
    Heartbeats,
    chain_node,
    cpu_seconds,
    drive,
    postgres_database,
    redis_database,
    wait_for_book,
    wait_healthy,
)
from tests.e2e.conftest import stop_server  # noqa: E402
from tests.e2e.funds import escrow_deposit_many  # noqa: E402
from tests.workers import free_port  # noqa: E402

TARGET_ROUND_S = 5.0
TARGET_RPS, TARGET_P99_MS, TARGET_CONCURRENCY = 300.0, 100.0, 16
MACHINES_PER_PROVIDER = 10
DB_HEARTBEAT_EVERY_S = 10.0
ESCROW = 10**13  # each buyer: more than its bids may promise
SETTINGS = "tests.bench.api_settings"


def _bid_rows(buyers: list[Any], models: list[str], regions: list[str], n: int, rng: random.Random, tag: str) -> list[Any]:
    """Bids as `services.bid_place` writes them (its defaults: the expiry, the weights), drawn
    as bench_api.py draws them."""
    from market.models import Bid

    rows = []
    for i in range(n):
        gpu_models = [] if rng.random() < 0.1 else rng.sample(models, rng.choice([1, 1, 1, 2, 3]))
        allowed = [] if rng.random() < 0.4 else rng.sample(regions, rng.choice([1, 1, 2, 3]))
        rows.append(Bid(buyer=rng.choice(buyers), client_order_id=f"{tag}-{i}",
                        job_spec={"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]},
                        gpus=rng.choice([1, 1, 2, 4, 8]), gpu_models=gpu_models, allowed_regions=allowed,
                        max_price=rng.randrange(200_000, 4_000_000, 1000), duration_s=rng.choice([1, 2, 6, 24]) * 3600,
                        klass=rng.choice(["on_demand", "on_demand", "spot", "reserved"])))
    return rows


def seed(n_bids: int, n_offers: int, n_buyers: int, n_agents: int, seed_value: int) -> dict[str, Any]:
    """Migrate and write the book in bulk (the module's doc); return what the bench needs."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", SETTINGS)
    import django

    django.setup()
    from django.contrib.auth.hashers import make_password
    from django.core.management import call_command
    from django.utils import timezone

    from market import services
    from market.models import Bid, GpuModel, Offer, Role, User
    from providers import catalogue
    from providers.models import Gpu, Machine, Provider, Region

    call_command("migrate", interactive=False, verbosity=0)
    rng = random.Random(seed_value)
    now = timezone.now()
    models = list(GpuModel.objects.order_by("id"))
    regions = list(Region.objects.order_by("id"))
    password = make_password(uuid.uuid4().hex)  # one hash for all: hashing 1,000 passwords is not what is measured
    n_providers = -(-n_offers // MACHINES_PER_PROVIDER)
    User.objects.bulk_create([User(username=f"bench-provider-{i}", password=password, role=Role.PROVIDER) for i in range(n_providers)]
                             + [User(username=f"bench-buyer-{i}", password=password, role=Role.BUYER) for i in range(n_buyers)], batch_size=2000)
    users = list(User.objects.filter(username__startswith="bench-provider-").order_by("id"))
    Provider.objects.bulk_create([Provider(user=u, display_name=u.username) for u in users], batch_size=2000)
    providers = list(Provider.objects.filter(user__in=users).order_by("id"))
    machines = [Machine(provider=providers[k // MACHINES_PER_PROVIDER], name=f"m{k}", region=rng.choice(regions), interconnect="nvlink",
                        state="online", last_heartbeat=now, reliability=round(rng.uniform(0.82, 0.995), 3)) for k in range(n_offers)]
    Machine.objects.bulk_create(machines, batch_size=2000)
    machines = list(Machine.objects.filter(provider__in=providers).order_by("id"))
    gpus, offers = [], []
    for k, m in enumerate(machines):
        model, count = rng.choice(models), rng.choice([1, 2, 4, 8])
        gpus += [Gpu(machine=m, index=i, uuid=f"GPU-bench-{k}-{i}", model=model, memory_gib=model.memory_gib) for i in range(count)]
        rate = catalogue.gpu_models()[model.id].usd_per_hour
        offers.append(Offer(machine=m, gpu_model=model, gpus=count, gpus_free=count, price=int(rate * rng.uniform(0.7, 1.3) * 1000) * 1000,
                            min_duration_s=600, max_duration_s=rng.choice([24, 72, 168, 720]) * 3600, available_from=now,
                            spot_allowed=rng.random() < 0.8, reserved_only=False))
    Gpu.objects.bulk_create(gpus, batch_size=5000)
    Offer.objects.bulk_create(offers, batch_size=2000)
    buyers = list(User.objects.filter(username__startswith="bench-buyer-").order_by("id"))
    Bid.objects.bulk_create(_bid_rows(buyers, [m.id for m in models], [r.id for r in regions], n_bids, rng, "seed"), batch_size=2000)
    agents = []
    for p in providers[:n_agents]:
        _, token = services.token_create(user=p.user, name="bench-agent", scopes=["provide"])
        agents.append({"token": token, "machines": list(Machine.objects.filter(provider=p).values_list("id", flat=True))})
    return {"buyers": [b.username for b in buyers], "agents": agents, "open_bids": Bid.objects.filter(state="open").count(),
            "open_offers": Offer.objects.filter(state="open").count(), "gpus": len(gpus)}


def load(base: str, concurrency: int, seconds: float) -> dict[str, Any]:
    """The client (a process of its own): GET /api/v1/markets/ for `seconds`."""
    cell = asyncio.run(drive(base, "", "production", "GET /api/v1/markets/", concurrency, seconds, 10**7))
    return {"requests": cell.requests, "seconds": cell.seconds, "p50_ms": cell.p50_ms, "p99_ms": cell.p99_ms, "errors": cell.errors,
            "first_error": cell.first_error, "book": cell.book}


class DbHeartbeats:
    """The other machines' heartbeats, written as the heartbeat service writes them (each
    machine's last_heartbeat), in one UPDATE every DB_HEARTBEAT_EVERY_S."""

    def __init__(self, skip: set[int]) -> None:
        self.skip = skip
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, name="bench-db-heartbeats", daemon=True)

    def run(self) -> None:
        from django.db import connection
        from django.utils import timezone

        from providers.models import Machine

        try:
            while not self.stop.is_set():
                Machine.objects.filter(name__startswith="m").exclude(pk__in=self.skip).update(last_heartbeat=timezone.now())
                self.stop.wait(DB_HEARTBEAT_EVERY_S)
        finally:
            connection.close()

    def __enter__(self) -> DbHeartbeats:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=60)


def one_round(k: int) -> tuple[float, dict[str, Any]]:
    """A round through market.rounds as the beat's task runs it; (wall seconds, its stats)."""
    from django.utils import timezone

    from market.rounds import round_clear, slot_for

    now = timezone.now()
    began = time.perf_counter()
    rnd = round_clear(now=now, slot=slot_for(now) + 1000 + k)  # slots of their own: the beat's hourly ones stay its
    wall = time.perf_counter() - began
    if rnd is None or rnd.state != "cleared":
        raise SystemExit(f"round {k} did not clear: {rnd and rnd.state} {rnd and rnd.error}")
    return wall, rnd.stats


def refill(n: int, rng: random.Random, k: int) -> None:
    """As many new bids as the round matched, so the book keeps its size."""
    from market.models import Bid, GpuModel, User
    from providers.models import Region

    buyers = list(User.objects.filter(username__startswith="bench-buyer-"))
    Bid.objects.bulk_create(_bid_rows(buyers, list(GpuModel.objects.values_list("id", flat=True)), list(Region.objects.values_list("id", flat=True)),
                                      n, rng, f"refill-{k}"), batch_size=2000)


def print_round(label: str, wall: float, stats: dict[str, Any]) -> None:
    phases = stats.get("round_ms", {})
    inside = sum(phases.values())
    print(f"{label}: {wall:.2f} s wall, {stats.get('bids', 0):,} bids x {stats.get('offers', 0):,} offers -> {stats.get('trades', 0):,} trades "
          f"({stats.get('method', '')})", flush=True)
    from market.rounds import ROUND_PHASES

    print("  " + ", ".join(f"{p} {phases.get(p, 0) / 1000:.2f} s" for p in ROUND_PHASES)
          + f", commit and publish {max(0.0, wall - inside / 1000):.2f} s", flush=True)
    engine = stats.get("stage_ms", {})
    top = sorted(engine.items(), key=lambda kv: -kv[1])[:4]
    print("  engine's largest stages: " + ", ".join(f"{k} {v / 1000:.2f} s" for k, v in top), flush=True)


@contextlib.contextmanager
def market(data: Path, args: argparse.Namespace) -> Iterator[tuple[str, dict[str, Any], dict[str, str], int]]:
    """The production market, seeded and live; yields (base URL, what seeding said, its
    environment, the serving process's pid)."""
    with contextlib.ExitStack() as stack:
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "CHAIN_RPC_URL")}
        env.update(GRIDBID_DATA_DIR=str(data), DJANGO_SETTINGS_MODULE=SETTINGS, PYTHONPATH=str(ROOT), ROUND_SECONDS="3600",
                   LOG_LEVEL="WARNING", PYTHONUNBUFFERED="1", GRIDBID_CHAIN_PORT=str(free_port()), WS_MAX_PER_ADDRESS="100000")
        env["DATABASE_URL"] = stack.enter_context(postgres_database())
        env["REDIS_URL"] = stack.enter_context(redis_database())
        env["CHAIN_RPC_URL"], env["CHAIN_CONFIRMATIONS"] = stack.enter_context(chain_node()), "0"
        started = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "seed", "--bids", str(args.bids), "--offers", str(args.offers), "--buyers", str(args.buyers),
                              "--http-agents", str(args.http_agents), "--seed", str(args.seed)],
                             cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
        if out.returncode:
            raise SystemExit(f"seeding failed:\n{out.stdout}\n{out.stderr}")
        seeded = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"seeded {seeded['open_offers']:,} offers ({seeded['gpus']:,} GPUs) and {seeded['open_bids']:,} open bids of "
              f"{len(seeded['buyers'])} buyers in {time.perf_counter() - started:.1f} s", flush=True)
        out = subprocess.run([sys.executable, "-m", "gridbid.cli", "chain", "deploy"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
        if out.returncode:
            raise SystemExit(f"gridbid chain deploy failed:\n{out.stdout}\n{out.stderr}")
        began = time.perf_counter()
        escrow_deposit_many(env, seeded["buyers"], ESCROW)
        print(f"{len(seeded['buyers'])} buyers' escrow deposited on the dev chain and journaled in {time.perf_counter() - began:.1f} s", flush=True)
        # this process clears the rounds: Django against the same database
        os.environ.update({k: env[k] for k in ("DATABASE_URL", "REDIS_URL", "CHAIN_RPC_URL", "CHAIN_CONFIRMATIONS", "GRIDBID_DATA_DIR",
                                                "DJANGO_SETTINGS_MODULE", "ROUND_SECONDS", "LOG_LEVEL")})
        import django

        django.setup()
        http_machines = {m for a in seeded["agents"] for m in a["machines"]}
        stack.enter_context(DbHeartbeats(http_machines))
        port = free_port()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for cmd in (["up", "--port", str(port)], ["worker", "--concurrency", "1"], ["beat"]):
                log = open(data / f"{cmd[0]}.log", "w")  # noqa: SIM115 - closed with the stack
                stack.callback(log.close)
                procs.append(subprocess.Popen([sys.executable, "-m", "gridbid.cli", *cmd], cwd=data, env=env, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True))
            base = f"http://127.0.0.1:{port}"
            wait_healthy(base, procs[0], data / "up.log")
            beats = stack.enter_context(Heartbeats(base, seeded["agents"]))
            wait_for_book(base)
            print(f"server up; {len(http_machines)} machines heartbeat over HTTP, {seeded['open_offers'] - len(http_machines):,} "
                  f"to the database", flush=True)
            yield base, seeded, env, procs[0].pid
            if beats.failed:
                raise SystemExit(f"heartbeats failed ({beats.sent} sent): " + "; ".join(beats.failed))
        finally:
            for proc in reversed(procs):
                stop_server(proc)


def measure(base: str, args: argparse.Namespace, pid: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "load", "--base", base, "--concurrency", str(args.concurrency), "--seconds", str(args.seconds)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen[str], label: str, cpu: float) -> Cell:
    out, err = proc.communicate(timeout=600)
    if proc.returncode:
        raise SystemExit(f"the {label} client failed:\n{err}")
    got = json.loads(out.strip().splitlines()[-1])
    cell = Cell("production", f"GET /markets/ {label}", TARGET_CONCURRENCY, got["requests"], got["seconds"], got["p50_ms"], got["p99_ms"],
                got["errors"], got["first_error"], server_cpu_s=cpu, book=tuple(got["book"]) if got["book"] else None)
    return cell


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", nargs="?", default="run", choices=["run", "seed", "load"], help=argparse.SUPPRESS)
    ap.add_argument("--bids", type=int, default=10_000)
    ap.add_argument("--offers", type=int, default=10_000)
    ap.add_argument("--buyers", type=int, default=100)
    ap.add_argument("--http-agents", type=int, default=20, help="providers whose machines heartbeat over HTTP (10 machines each)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=8.0, help="each measurement of /markets/")
    ap.add_argument("--concurrency", type=int, default=TARGET_CONCURRENCY)
    ap.add_argument("--base", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="2,000 orders a side, 4 s per measurement")
    args = ap.parse_args()
    if args.command == "seed":
        print(json.dumps(seed(args.bids, args.offers, args.buyers, args.http_agents, args.seed)))
        return 0
    if args.command == "load":
        print(json.dumps(load(args.base, args.concurrency, args.seconds)))
        return 0
    if args.quick:
        args.bids, args.offers, args.seconds, args.http_agents = 2_000, 2_000, 4.0, 5
    print(f"one round at scale: {args.bids:,} open bids, {args.offers:,} offers (seed {args.seed}); /markets/ at concurrency "
          f"{args.concurrency} for {args.seconds:g} s from a separate process", flush=True)
    failed = False
    with tempfile.TemporaryDirectory(prefix="gridbid-bench-round-") as tmp, market(Path(tmp), args) as (base, seeded, _env, pid):
        cpu = cpu_seconds(pid)
        rest = finished(measure(base, args, pid), "at rest", 0.0)
        rest.server_cpu_s = cpu_seconds(pid) - cpu
        wall, stats = one_round(0)
        print_round("round 1 (the whole book)", wall, stats)
        first_wall, first_stats = wall, stats
        rng = random.Random(args.seed + 1)
        cpu = cpu_seconds(pid)
        client = measure(base, args, pid)
        walls = []
        k = 1
        while client.poll() is None and k < 1000:
            refill(stats.get("matched_bids", 0), rng, k)
            wall, stats = one_round(k)
            walls.append(wall)
            k += 1
        busy = finished(client, "while rounds run", 0.0)
        busy.server_cpu_s = cpu_seconds(pid) - cpu
        print(f"rounds while measured: {len(walls)}, {min(walls, default=0):.2f}-{max(walls, default=0):.2f} s each", flush=True)
        print(f"{'/markets/':<28}{'requests':>9}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}{'ratio':>8}{'cpu ms/req':>11}")
        for cell in (rest, busy):
            print(f"{cell.endpoint:<28}{cell.requests:>9,}{cell.rps:>9.1f}{cell.p50_ms:>9.1f}{cell.p99_ms:>9.1f}{cell.errors:>8}"
                  f"{cell.rps / rest.rps if rest.rps else 0:>7.2f}x{cell.cpu_ms:>11.2f}", flush=True)
            if cell.errors:
                failed = True
                print(f"FAILED: {cell.endpoint}: {cell.errors} errors, first: {cell.first_error}")
            if not cell.book or not cell.book[0]:
                failed = True
                print(f"FAILED: {cell.endpoint} served an empty book: {cell.book}")
    met = first_wall <= TARGET_ROUND_S
    print(f"{'met' if met else 'MISSED'}: the round over {args.bids:,} bids x {args.offers:,} offers took {first_wall:.2f} s (target <= {TARGET_ROUND_S:g})")
    if not met:
        print("  in the way: " + in_the_way_of_the_round(first_wall, first_stats))
    met_api = busy.rps >= TARGET_RPS and busy.p99_ms <= TARGET_P99_MS
    print(f"{'met' if met_api else 'MISSED'}: GET /api/v1/markets/ at {args.concurrency} while rounds run: {busy.rps:.0f} req/s "
          f"(target >= {TARGET_RPS:g}), p99 {busy.p99_ms:.1f} ms (target <= {TARGET_P99_MS:g})")
    if not met_api:
        print("  in the way: " + in_the_way_of_the_list(rest, busy))
    return 1 if failed or not met or not met_api else 0


def in_the_way_of_the_round(wall: float, stats: dict[str, Any]) -> str:
    """The phases that take the round past its target, largest first, with the engine's stages."""
    from market.rounds import ROUND_PHASES

    phases = {p: stats.get("round_ms", {}).get(p, 0) / 1000 for p in ROUND_PHASES}
    phases["commit and publish"] = max(0.0, wall - sum(phases.values()))
    top = sorted(phases.items(), key=lambda kv: -kv[1])[:3]
    stages = sorted(stats.get("stage_ms", {}).items(), key=lambda kv: -kv[1])[:2]
    return (", ".join(f"{p} {v:.2f} s ({100 * v / wall:.0f}%)" for p, v in top)
            + f"; of the engine, {', '.join(f'{k} {v / 1000:.2f} s' for k, v in stages)}. The engine alone is "
            + f"{phases['engine'] / TARGET_ROUND_S:.1f}x the whole round's target.")


def in_the_way_of_the_list(rest: Cell, busy: Cell) -> str:
    """What one server process can answer at the CPU a request costs it, against what the target needs."""
    budget_ms = 1000 / TARGET_RPS
    ceiling = 1000 / busy.cpu_ms if busy.cpu_ms else float("inf")
    return (f"the server spent {busy.cpu_ms:.2f} ms of CPU per request while rounds ran ({rest.cpu_ms:.2f} at rest), so one server "
            f"process answers at most ~{ceiling:.0f} req/s on its one core (Python's GIL); {TARGET_RPS:g} req/s needs at most "
            f"{budget_ms:.2f} ms a request, or more server processes than this box has cores to spare beside the round. "
            f"p99 at concurrency {busy.concurrency} is the queue for that core: {busy.concurrency} x {1000 / busy.rps if busy.rps else 0:.1f} ms "
            f"per request served ~ {busy.concurrency * 1000 / busy.rps if busy.rps else 0:.0f} ms on average.")


if __name__ == "__main__":
    sys.exit(main())
