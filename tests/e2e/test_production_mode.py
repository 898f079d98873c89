"""The production mode as it is deployed: `gridbid up` on PostgreSQL and Redis as a real
process, `gridbid worker` and `gridbid beat` beside it, loaded by many clients at once
from this process over real sockets."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import ROOT, start_server, stop_server
from tests.e2e.funds import TOKENS, escrow_deposit_many, wait_for
from tests.workers import free_port

PG_ADMIN_URL = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
REDIS_HOST_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15").rsplit("/", 1)[0]
POOL_MAX = 4
CLIENTS = 64
REQUESTS_PER_CLIENT = 6  # 384 requests: the server's pool of 4 is full from the first burst (asserted)
WORKER_CONCURRENCY = 2

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow]


def _pg_admin():  # type: ignore[no-untyped-def]
    import psycopg

    try:
        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL at {PG_ADMIN_URL} is unreachable ({exc})")


@contextlib.contextmanager
def scratch_database(prefix: str) -> Iterator[str]:
    """A database of its own on the real PostgreSQL, named `prefix`_<random>, dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def production_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A database of its own on the real PostgreSQL, a Redis database and a chain of its own,
    migrated and deployed once for this file's tests (each names its own users)."""
    tmp_path = tmp_path_factory.mktemp("production")
    import redis

    try:
        redis.Redis.from_url(f"{REDIS_HOST_URL}/0", socket_connect_timeout=2).ping()
    except Exception as exc:
        service_missing(f"Redis at {REDIS_HOST_URL} is unreachable ({exc})")
    name = f"gridbid_prod_{uuid.uuid4().hex[:10]}"
    with _pg_admin() as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    # Redis databases 1-14 (15 is the unit tests'); two runs colliding on one is harmless
    # here except for a stolen task, and the round check below tolerates none missing
    redis_db = 1 + os.getpid() % 14
    redis_url = f"{REDIS_HOST_URL}/{redis_db}"
    redis.Redis.from_url(redis_url).flushdb()
    # a chain of its own, as production has (CHAIN_RPC_URL; anvil standing in for the
    # network), the contracts deployed the way an operator does: `gridbid chain deploy`
    from ledger.chain.anvil import AnvilNotFound, find_anvil, start_anvil, stop_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(str(exc))
    chain_port = free_port()
    chain = start_anvil(port=chain_port)
    env = {
        "DATABASE_URL": f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}",
        "REDIS_URL": redis_url,
        "DATABASE_POOL_MAX_SIZE": str(POOL_MAX),
        "ROUND_SECONDS": "1",
        "GRIDBID_DATA_DIR": str(tmp_path / "data"),
        "CHAIN_RPC_URL": f"http://127.0.0.1:{chain_port}",
        "CHAIN_CONFIRMATIONS": "0",
    }
    try:
        for step in (("manage", "migrate", "--no-input"), ("chain", "deploy")):
            out = subprocess.run([sys.executable, "-m", "gridbid.cli", *step], cwd=ROOT, env=_gridbid_env(env), capture_output=True, text=True, timeout=240)
            assert out.returncode == 0, out.stdout + out.stderr
        yield env
    finally:
        stop_anvil(chain)
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _gridbid_env(env: dict[str, str]) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "CHAIN_RPC_URL", "PGAPPNAME")}
    return {**base, "PYTHONUNBUFFERED": "1", **env}


def _manage_shell(env: dict[str, str], code: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=_gridbid_env(env),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _tokens(env: dict[str, str], count: int, prefix: str) -> list[str]:
    """`count` buyers named `prefix`0..., each with an API token (one user each keeps us under
    the per-user throttle)."""
    code = (
        # the load signs in with tokens, never a password: production's PBKDF2 (~0.5 s a
        # user) made these 64 sign-ups a large part of the test
        "from django.conf import settings\n"
        "settings.PASSWORD_HASHERS = ['django.contrib.auth.hashers.MD5PasswordHasher']\n"
        "from market import services\n"
        f"for i in range({count}):\n"
        f"    u = services.user_signup(username=f'{prefix}{{i}}', password='correct-horse-battery-staple', role='buyer')\n"
        "    print('TOKEN', services.token_create(user=u, name='load', scopes=['read', 'trade'])[1])\n"
    )
    tokens = [line.split()[1] for line in _manage_shell(env, code).splitlines() if line.startswith("TOKEN ")]
    escrow_deposit_many(_gridbid_env(env), [f"{prefix}{i}" for i in range(count)], 100 * TOKENS)  # bids need escrow behind them
    return tokens


def _rounds(env: dict[str, str]) -> tuple[int, int]:
    """(rounds so far, rounds failed), read from the server's database."""
    import psycopg

    with psycopg.connect(env["DATABASE_URL"].replace("postgres://", "postgresql://", 1), connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*), count(*) FILTER (WHERE state = 'failed') FROM market_auctionround").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _rounds_if(env: dict[str, str], *, at_least: int) -> tuple[int, int] | None:
    seen = _rounds(env)
    return seen if seen[0] >= at_least else None


class ConnectionSampler(threading.Thread):
    """Polls pg_stat_activity for the connections to one database, per application_name."""

    def __init__(self, database: str) -> None:
        super().__init__(daemon=True)
        self.database = database
        self.peak: dict[str, int] = {}
        self.samples = 0
        self.stopping = threading.Event()

    def run(self) -> None:
        with _pg_admin() as admin:
            deadline = time.monotonic() + 600
            while not self.stopping.is_set() and time.monotonic() < deadline:
                rows = admin.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY application_name",
                    (self.database,),
                ).fetchall()
                self.samples += 1
                total = 0
                for app, n in rows:
                    self.peak[app] = max(self.peak.get(app, 0), n)
                    total += n
                self.peak["(all)"] = max(self.peak.get("(all)", 0), total)
                time.sleep(0.05)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


def _load(base: str, tokens: list[str]) -> tuple[int, list[str]]:
    """Each token on its own thread: reads and writes of the API. (requests done, failures)."""
    failures: list[str] = []
    done = [0]
    lock = threading.Lock()
    start = threading.Barrier(len(tokens), timeout=60)

    def client(i: int, token: str) -> None:
        with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
            start.wait()
            for n in range(REQUESTS_PER_CLIENT):
                try:
                    if n % 3 == 0:
                        r = http.post("/api/v1/bids/", json={"job_spec": {"image": "ghcr.io/acme/train:1"}, "gpus": 1, "gpu_models": ["H100-SXM-80GB"],
                                                               "max_price": 2_000_000, "duration_s": 3600, "client_order_id": f"c{i}-{n}"})
                    elif n % 3 == 1:
                        r = http.get("/api/v1/bids/")
                    else:
                        r = http.get("/api/v1/me/")
                    ok = r.status_code < 400
                    detail = f"{r.request.method} {r.request.url.path}: {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, detail = False, f"{type(exc).__name__}: {exc}"
                with lock:
                    done[0] += 1
                    if not ok:
                        failures.append(detail)

    threads = [threading.Thread(target=client, args=(i, t), daemon=True) for i, t in enumerate(tokens)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return done[0], failures


@contextlib.contextmanager
def _process(env: dict[str, str], log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gridbid.cli", *args], cwd=ROOT, env=_gridbid_env(env),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        stop_server(proc)


def test_production_server_and_worker_stay_within_their_connection_pools_under_64_clients(production_env, tmp_path):
    env = production_env
    database = env["DATABASE_URL"].rsplit("/", 1)[1]
    data = Path(env["GRIDBID_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)  # the fixture's migrate and deploy made it
    proc, base, _ = start_server(data, demo=False, extra_env=env, up_args=("--no-worker",))
    try:
        tokens = _tokens(env, CLIENTS, "load")
        assert len(tokens) == CLIENTS
        sampler = ConnectionSampler(database)
        sampler.start()
        with _process(env, tmp_path / "worker.log", "worker", "-c", str(WORKER_CONCURRENCY)) as worker, \
                _process(env, tmp_path / "beat.log", "beat") as beat:
            started = time.monotonic()
            done, failures = _load(base, tokens)
            elapsed = time.monotonic() - started
            # the worker keeps clearing rounds (every second) beside the load: wait for three
            rounds = wait_for("three rounds cleared by the worker beside the load", lambda: _rounds_if(env, at_least=3),
                              seconds=120, seen=lambda: f"(rounds, failed) = {_rounds(env)}", logs=lambda: (tmp_path / "worker.log").read_text()[-3000:])
            assert worker.poll() is None and beat.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        sampler.stop()
        print(f"{done} requests from {CLIENTS} clients in {elapsed:.1f} s; peak connections {sampler.peak} over {sampler.samples} samples")
        assert done == CLIENTS * REQUESTS_PER_CLIENT
        assert not failures, f"{len(failures)} of {done} failed, e.g. {failures[:5]}"
        assert sampler.samples > 20
        # the load filled the server's pool (a load that never fills it would show nothing) and never went past it:
        # one fewer than DATABASE_POOL_MAX_SIZE, the last kept for a round's lock (this server clears none)
        assert sampler.peak.get("gridbid up", 0) == POOL_MAX - 1, sampler.peak
        # every worker child holds its own pool; the parent holds none
        assert sampler.peak.get("gridbid worker", 0) <= POOL_MAX * WORKER_CONCURRENCY, sampler.peak
        assert sampler.peak["(all)"] <= POOL_MAX * (1 + WORKER_CONCURRENCY) + 1, sampler.peak  # +1: this test's sampler
        total, failed = rounds
        assert total >= 3 and failed == 0, f"{total} rounds, {failed} failed"
    finally:
        stop_server(proc)
    log = (data / "server.log").read_text()
    assert "Traceback" not in log, log[-3000:]


def test_beat_keeps_its_schedule_under_the_data_dir_not_the_current_folder(tmp_path):
    """`gridbid beat` run from any folder writes celerybeat-schedule.* under GRIDBID_DATA_DIR."""
    import redis

    try:
        redis.Redis.from_url(f"{REDIS_HOST_URL}/0", socket_connect_timeout=2).ping()
    except Exception as exc:
        service_missing(f"Redis at {REDIS_HOST_URL} is unreachable ({exc})")
    cwd, data = tmp_path / "cwd", tmp_path / "data"
    cwd.mkdir()
    env = _gridbid_env({"REDIS_URL": f"{REDIS_HOST_URL}/{1 + os.getpid() % 14}", "GRIDBID_DATA_DIR": str(data),
                        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    with open(tmp_path / "beat.log", "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gridbid.cli", "beat"], cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not list(data.glob("celerybeat-schedule*")) and not list(cwd.iterdir()):
            assert proc.poll() is None, (tmp_path / "beat.log").read_text()
            time.sleep(0.2)
    finally:
        stop_server(proc)
    assert list(cwd.iterdir()) == [], f"beat wrote into the current folder: {list(cwd.iterdir())}"
    assert list(data.glob("celerybeat-schedule*")), (tmp_path / "beat.log").read_text()


def test_a_request_that_finds_the_pool_exhausted_gets_a_503_that_says_retry(production_env):
    """Past DATABASE_POOL_TIMEOUT without a free connection: a clear 503 with Retry-After, not a 500."""
    env = {**production_env, "DATABASE_POOL_MAX_SIZE": "1", "DATABASE_POOL_TIMEOUT": "1"}
    database = env["DATABASE_URL"].rsplit("/", 1)[1]
    data = Path(env["GRIDBID_DATA_DIR"])
    data.mkdir(parents=True, exist_ok=True)  # the fixture's migrate and deploy made it
    proc, base, _ = start_server(data, demo=False, extra_env=env, up_args=("--no-worker",))
    try:
        token = _tokens(env, 1, "pool")[0]
        headers = {"Authorization": f"Bearer {token}"}
        assert httpx.get(f"{base}/api/v1/me/", headers=headers, timeout=30).status_code == 200
        import psycopg

        first: dict[str, httpx.Response] = {}
        with psycopg.connect(f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{database}", connect_timeout=3) as locker:
            # the first request's token lookup waits on this lock, holding the pool's only connection
            locker.execute("LOCK TABLE market_apitoken IN ACCESS EXCLUSIVE MODE")
            holder = threading.Thread(target=lambda: first.update(r=httpx.get(f"{base}/api/v1/me/", headers=headers, timeout=60)), daemon=True)
            holder.start()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                waiting = locker.execute("SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'market_apitoken'::regclass").fetchone()
                if waiting and waiting[0] > 0:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("the first request never reached the database")
            second = httpx.get(f"{base}/api/v1/me/", headers=headers, timeout=30)
            locker.rollback()  # releases the lock: the first request goes on
        holder.join(30)
        assert second.status_code == 503, second.text
        assert second.headers["Retry-After"].isdigit()
        error = second.json()["error"]
        assert error["code"] == "busy" and "retry" in error["message"].lower()
        assert first["r"].status_code == 200
        assert httpx.get(f"{base}/api/v1/me/", headers=headers, timeout=30).status_code == 200
    finally:
        stop_server(proc)
