"""The production setup as a real process: `gridbid up` on PostgreSQL and Redis beside a
`gridbid worker` and `gridbid beat` (started by tests/bench/bench_api.py's helper, with a
database of its own), answering many concurrent clients over real sockets."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.bench import bench_api

CLIENTS = 64


def postgres_backends(database: str) -> int:
    with psycopg.connect(bench_api.PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", [database]).fetchone()
        return int(row[0]) if row else 0


def test_64_concurrent_bids_are_all_placed_and_hold_a_bounded_number_of_database_connections() -> None:
    try:
        postgres_backends("postgres")
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL is not reachable at {bench_api.PG_ADMIN_URL}: {exc}")
    with tempfile.TemporaryDirectory(prefix="gridbid-e2e-prod-") as tmp, bench_api.server("production", Path(tmp), 200, 1, 0) as (base, token, _):
        database = bench_api.last_database

        async def place_all() -> list[int]:
            limits = httpx.Limits(max_connections=CLIENTS)
            async with httpx.AsyncClient(base_url=base, limits=limits, timeout=60, headers={"Authorization": f"Bearer {token}"}) as client:
                async def one(i: int) -> int:
                    body = {**bench_api.bid_body(bench_api.random.Random(i)), "client_order_id": f"e2e-{i}"}
                    return (await client.post("/api/v1/bids/", json=body)).status_code

                statuses: list[int] = []
                for _ in range(3):  # three waves of 64 at once
                    statuses += await asyncio.gather(*(one(len(statuses) + i) for i in range(CLIENTS)))
                return statuses

        statuses = asyncio.run(place_all())
        assert statuses.count(201) == len(statuses), {s: statuses.count(s) for s in set(statuses)}
        # the server's pool, the worker's and beat's connections: far under PostgreSQL's 100
        assert postgres_backends(database) <= 20
        for log in ("up.log", "worker.log", "beat.log"):
            text = (Path(tmp) / log).read_text(errors="replace")
            assert "Traceback" not in text and "OperationalError" not in text, f"{log}:\n{text[-3000:]}"
