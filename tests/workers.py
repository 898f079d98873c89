"""What each pytest-xdist worker owns alone, so workers running side by side never meet.

A worker's PostgreSQL test database is named by pytest-django (tests/settings.py plus the
`_gwN` suffix), its data directory by tests/settings.py. Here: its Redis database and the
ports it hands to the servers and dev chains it starts. Without xdist (a plain `pytest`
run) the process is worker 0.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import socket
from urllib.parse import urlsplit, urlunsplit

# Ports come from a band of their own per worker, below the kernel's ephemeral range
# (32768+ on Linux), where a port the OS hands out for `bind(("", 0))` lands. A port
# picked as "free" is released before the server binds it; two workers picking from
# the same pool could both get it in that window. Bands cannot overlap.
PORT_BASE = 20_000
PORT_BAND = 400
PORT_LIMIT = 32_768
MAX_WORKERS = (PORT_LIMIT - PORT_BASE) // PORT_BAND  # 31, more than Redis has databases


def worker_name() -> str:
    """`gw0`, `gw1`, ... under xdist; `main` without it."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def worker_index() -> int:
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", ""))
    return int(match.group(1)) if match else 0


def worker_redis_url(base: str) -> str:
    """`base` with its database number lowered by the worker's index (15, 14, 13, ...),
    so each worker can FLUSHDB its own database without touching another's."""
    parts = urlsplit(base)
    path = parts.path.strip("/")
    db = int(path) if path.isdigit() else 0
    own = db - worker_index()
    if own < 0:
        raise RuntimeError(
            f"TEST_REDIS_URL {base} names database {db}, too low for worker {worker_name()} "
            f"(each worker takes the next lower number); use a higher database (e.g. /15) or fewer workers (-n)"
        )
    return urlunsplit(parts._replace(path=f"/{own}"))


def _band_ports() -> itertools.cycle[int]:
    index = worker_index()
    if index >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} xdist workers have a port band of their own; run with fewer (-n)")
    first = PORT_BASE + index * PORT_BAND
    start = random.randrange(PORT_BAND)  # a fresh start per run, so a lingering server from a killed run is skipped quickly
    return itertools.cycle([first + (start + i) % PORT_BAND for i in range(PORT_BAND)])


_ports = _band_ports()


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on, from this worker's band. Successive
    calls return different ports, so two picked before either is bound never clash."""
    for _ in range(PORT_BAND):
        port = next(_ports)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in worker {worker_name()}'s band {PORT_BASE + worker_index() * PORT_BAND}+{PORT_BAND}")
