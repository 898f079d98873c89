"""The agent's local state: SQLite under the data directory.

One row per job, keyed by trade id, so a duplicate assignment starts nothing
new; an outbox of reports (events, receipts) sent in order and kept until the
market acknowledges them, so a crash loses none; a queue of output files to
upload to the market once their job's receipt is taken, so a restart resumes it. On restart the daemon reads
the jobs that were running and re-attaches to them or reports them failed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    trade_id     INTEGER PRIMARY KEY,
    job_id       INTEGER NOT NULL,
    spec         TEXT NOT NULL,
    spec_hash    TEXT NOT NULL,
    gpus         TEXT NOT NULL,
    duration_s   INTEGER NOT NULL,
    state        TEXT NOT NULL,          -- accepted, running, finished, refused
    runtime      TEXT NOT NULL DEFAULT 'process',
    pid          INTEGER,
    pid_ticks    INTEGER,
    started_at   REAL,
    ended_at     REAL,
    exit_code    INTEGER,
    reason       TEXT,
    gpu_seconds  INTEGER,
    checkpoint   TEXT,
    receipt      TEXT,
    signature    TEXT,
    resume       TEXT,
    progress     REAL NOT NULL DEFAULT 0,
    extensions   TEXT,                   -- [{trade, job, duration_s}]: time the buyer added, each its own trade
    created_at   REAL NOT NULL,
    updated_at   REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    trade_id  INTEGER NOT NULL,
    job_id    INTEGER NOT NULL,
    kind      TEXT NOT NULL,              -- event or receipt
    body      TEXT NOT NULL,
    created_at REAL NOT NULL,
    sent_at   REAL,
    error     TEXT
);
CREATE TABLE IF NOT EXISTS uploads (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    trade_id   INTEGER NOT NULL,
    job_id     INTEGER NOT NULL,
    path       TEXT NOT NULL,            -- relative to the job's output folder, as the receipt lists it
    size       INTEGER NOT NULL,
    sha256     TEXT NOT NULL,
    state      TEXT NOT NULL DEFAULT 'pending',  -- pending, done, failed
    attempts   INTEGER NOT NULL DEFAULT 0,
    next_at    REAL NOT NULL DEFAULT 0,
    error      TEXT,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    UNIQUE (trade_id, path)
);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""

JSON_COLUMNS = ("spec", "gpus", "checkpoint", "receipt", "resume", "extensions")
# columns added since the first release, for state files written by an older agent
ADDED_COLUMNS = {"extensions": "TEXT"}


class State:
    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.path = path
        self.db = sqlite3.connect(path, isolation_level=None, timeout=10)
        os.chmod(path, 0o600)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(SCHEMA)
        have = {row[1] for row in self.db.execute("PRAGMA table_info(jobs)")}
        for column, kind in ADDED_COLUMNS.items():
            if column not in have:
                self.db.execute(f"ALTER TABLE jobs ADD COLUMN {column} {kind}")

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    @staticmethod
    def _row(row: sqlite3.Row | None) -> dict[str, Any] | None:
        if row is None:
            return None
        d = dict(row)
        for k in JSON_COLUMNS:
            if d.get(k) is not None:
                d[k] = json.loads(d[k])
        return d

    # --- jobs ---
    def job_accept(self, *, trade_id: int, job_id: int, spec: dict[str, Any], spec_hash: str, gpus: list[int], duration_s: int, runtime: str, resume: dict[str, Any] | None = None, state: str = "accepted", reason: str | None = None) -> bool:
        """Record an assignment; False (and nothing changes) if this trade is known already."""
        now = time.time()
        cur = self.db.execute(
            "INSERT OR IGNORE INTO jobs (trade_id, job_id, spec, spec_hash, gpus, duration_s, state, runtime, resume, reason, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (trade_id, job_id, json.dumps(spec), spec_hash, json.dumps(gpus), duration_s, state, runtime, json.dumps(resume) if resume else None, reason, now, now),
        )
        return cur.rowcount == 1

    def job(self, trade_id: int) -> dict[str, Any] | None:
        return self._row(self.db.execute("SELECT * FROM jobs WHERE trade_id=?", (trade_id,)).fetchone())

    def jobs(self, *states: str) -> list[dict[str, Any]]:
        if states:
            q = f"SELECT * FROM jobs WHERE state IN ({','.join('?' * len(states))}) ORDER BY trade_id"
            rows = self.db.execute(q, states).fetchall()
        else:
            rows = self.db.execute("SELECT * FROM jobs ORDER BY trade_id").fetchall()
        return [self._row(r) for r in rows]  # type: ignore[misc]

    def job_update(self, trade_id: int, **values: Any) -> None:
        values["updated_at"] = time.time()
        for k in JSON_COLUMNS:
            if k in values and values[k] is not None:
                values[k] = json.dumps(values[k])
        cols = ", ".join(f"{k}=?" for k in values)
        self.db.execute(f"UPDATE jobs SET {cols} WHERE trade_id=?", (*values.values(), trade_id))

    # --- outbox ---
    def report(self, *, trade_id: int, job_id: int, kind: str, body: dict[str, Any]) -> None:
        self.db.execute("INSERT INTO outbox (trade_id, job_id, kind, body, created_at) VALUES (?,?,?,?,?)", (trade_id, job_id, kind, json.dumps(body), time.time()))

    def pending_reports(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.db.execute("SELECT * FROM outbox WHERE sent_at IS NULL ORDER BY id LIMIT ?", (limit,)).fetchall()
        return [dict(r, body=json.loads(r["body"])) for r in rows]

    def report_done(self, report_id: int, error: str | None = None) -> None:
        self.db.execute("UPDATE outbox SET sent_at=?, error=? WHERE id=?", (time.time(), error, report_id))

    # --- output uploads (to the market's storage, after the job's receipt) ---
    def uploads_queue(self, *, trade_id: int, job_id: int, files: list[dict[str, Any]]) -> int:
        """Queue the job's output files; a file queued already stays as it is. Returns how many were new."""
        now = time.time()
        added = 0
        with self.tx() as db:
            for f in files:
                cur = db.execute(
                    "INSERT OR IGNORE INTO uploads (trade_id, job_id, path, size, sha256, created_at, updated_at) VALUES (?,?,?,?,?,?,?)",
                    (trade_id, job_id, f["path"], int(f["size"]), f["sha256"], now, now),
                )
                added += cur.rowcount
        return added

    def uploads_pending(self, trade_id: int | None = None) -> list[dict[str, Any]]:
        q, args = "SELECT * FROM uploads WHERE state='pending'", []
        if trade_id is not None:
            q, args = q + " AND trade_id=?", [trade_id]
        return [dict(r) for r in self.db.execute(q + " ORDER BY id", args).fetchall()]

    def uploads(self, trade_id: int) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute("SELECT * FROM uploads WHERE trade_id=? ORDER BY id", (trade_id,)).fetchall()]

    def upload_due(self, now: float) -> dict[str, Any] | None:
        """The oldest pending upload whose wait is over and whose job's receipt the market has
        taken (the market checks each file against it)."""
        row = self.db.execute(
            "SELECT u.* FROM uploads u WHERE u.state='pending' AND u.next_at<=? AND NOT EXISTS ("
            " SELECT 1 FROM outbox o WHERE o.trade_id=u.trade_id AND o.kind='receipt' AND o.sent_at IS NULL) ORDER BY u.id LIMIT 1",
            (now,),
        ).fetchone()
        return dict(row) if row else None

    def upload_update(self, upload_id: int, **values: Any) -> None:
        values["updated_at"] = time.time()
        cols = ", ".join(f"{k}=?" for k in values)
        self.db.execute(f"UPDATE uploads SET {cols} WHERE id=?", (*values.values(), upload_id))

    def receipt_refused(self, trade_id: int) -> str | None:
        """Why the market refused this trade's receipt, if it did."""
        row = self.db.execute("SELECT error FROM outbox WHERE trade_id=? AND kind='receipt' AND error IS NOT NULL ORDER BY id DESC LIMIT 1", (trade_id,)).fetchone()
        return row[0] if row else None

    # --- key/value ---
    def get(self, key: str, default: Any = None) -> Any:
        row = self.db.execute("SELECT value FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default

    def put(self, key: str, value: Any) -> None:
        self.db.execute("INSERT INTO kv (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, json.dumps(value)))
