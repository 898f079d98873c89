"""A tidal inference service: the ``alibaba-genai-2026`` requests as a GPU need per hour,
and the nodes the service owns.

The trace (alibaba/clusterdata ``cluster-trace-v2026-GenAI``, shipped with its attribution
in ``market/simulate/data/alibaba-genai-2026/``) holds 26,823 text-to-image requests over
about three weeks, each with its creation time (``gmt_create``, UTC) and how long it ran
(``exec_time_seconds``). Every request counts, failed ones too: they held a GPU as long.

**The GPU need per hour.** A GPU serves ``throughput = BUSY_TARGET * 3600 / mean exec
time`` requests an hour (kept ``BUSY_TARGET`` busy, so requests seldom queue: about 75
requests a GPU-hour at the trace's mean of 28.7 s). An hour with ``r`` requests needs
``r / throughput`` GPUs. The trace's own service is small (6 GPUs at its busiest hour), so
the simulation scales it: the service owns ``share`` of the cluster's GPUs (whole nodes,
``owned_nodes``), and its need is scaled so that the trace's busiest hour takes all of
them. Hour ``k`` of a simulation window needs what hour ``k`` (modulo the trace's length)
of the trace does: the tide repeats, day and night as recorded.

**Its requests, one by one** (``requests``, ``serve``). To measure the service's own
queueing, the scaled service gets the scaled requests: window hour ``k`` (trace hour
``h = k`` modulo its length) receives ``round(scale * r_h)`` requests, at seeded uniform
times within the hour (arrivals at random at the hour's recorded rate), each taking the
execution time of a seeded draw from hour ``h``'s recorded requests. They are served first
come, first served, on the GPUs the service serves on at each moment (one request per GPU).
A GPU given back when the tide ebbs finishes the request it holds; a preempted job's GPU
serves only after its grace (``sim.Service.grace_s``). A request's queueing is its start
less its arrival.

Bad input (a missing file, a row without a time or with an unreadable one, a negative
execution time) is a ``TraceError`` naming the line and the field.
"""

from __future__ import annotations

import csv
import gzip
import heapq
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import numpy.typing as npt

from .trace import DATA, Node, TraceError

REQUESTS = DATA / "alibaba-genai-2026" / "lora_request_trace.csv.gz"
BUSY_TARGET = 0.6  # the share of each hour a serving GPU is kept busy
HOUR_S = 3600.0


F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


SPOT_QOS = ("BE", "Burstable")  # what --spot-qos can name
# The pods that run as spot by default: the trace's best-effort ones, and its Burstable ones,
# which Kubernetes too evicts before Guaranteed pods under pressure. LS (latency-sensitive)
# and Guaranteed pods are never preempted. BE alone is 4% of the trace's GPU work, too
# little to fill what a service lends (docs/simulate.md measures both).
DEFAULT_SPOT_QOS = ("BE", "Burstable")


@dataclass(frozen=True)
class Options:
    """A simulation's inference service: it owns ``share`` of the GPUs (0: none). Where it
    lends, pods of a QoS in ``spot_qos`` run as spot on its idle GPUs; a preempted one keeps
    its work up to its last checkpoint (every ``checkpoint_s``), and the service serves on
    its GPUs ``grace_s`` after asking for them."""

    share: float = 0.0
    checkpoint_s: float = 1800.0
    grace_s: float = 30.0
    spot_qos: tuple[str, ...] = DEFAULT_SPOT_QOS


@dataclass(frozen=True)
class Tide:
    """The service's need, in GPUs, for each hour of the trace (the scaled need), and what
    it came from."""

    hourly_gpus: tuple[int, ...]
    requests_per_hour: tuple[int, ...]
    mean_exec_s: float
    throughput: float  # requests a GPU serves an hour
    owned_gpus: int
    scale: float = 1.0  # the need's scale: the simulated service gets this many times the trace's requests
    exec_s: F64 = field(default_factory=lambda: np.zeros(0), compare=False, repr=False)  # each request's execution time
    hour: I64 = field(default_factory=lambda: np.zeros(0, dtype=np.int64), compare=False, repr=False)  # ... and trace hour

    def need(self, t: float) -> int:
        """GPUs the service needs at simulation second ``t`` (the tide repeats)."""
        return self.hourly_gpus[int(t // HOUR_S) % len(self.hourly_gpus)]

    def gpu_hours(self, window_s: float) -> float:
        """The GPU-hours the service holds over ``[0, window_s)``."""
        full, rest = divmod(window_s, HOUR_S)
        total = sum(self.need(k * HOUR_S) for k in range(int(full)))
        return total + self.need(full * HOUR_S) * rest / HOUR_S


def read_requests(path: Path = REQUESTS) -> tuple[np.ndarray, np.ndarray]:
    """Each request's creation time (unix seconds) and execution time (seconds)."""
    try:
        raw = path.read_bytes()
        text = gzip.decompress(raw).decode("utf-8") if path.suffix == ".gz" else raw.decode("utf-8")
    except FileNotFoundError:
        raise TraceError(f"{path}: no such request trace; check the path") from None
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile) as e:
        raise TraceError(f"{path}: cannot read the request trace as (gzipped) UTF-8 CSV: {e}") from None
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in ("gmt_create", "exec_time_seconds") if c not in (reader.fieldnames or [])]
    if missing:
        raise TraceError(f"{path}, line 1: the request trace's header lacks {', '.join(missing)}; "
                         "it needs gmt_create (YYYY-MM-DD HH:MM:SS, UTC) and exec_time_seconds")
    created: list[float] = []
    took: list[float] = []
    for row in reader:
        line = reader.line_num
        when = (row.get("gmt_create") or "").strip()
        try:
            t = datetime.strptime(when, "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC).timestamp()
        except ValueError:
            raise TraceError(f"{path}, line {line}: gmt_create is {when!r}; write it as YYYY-MM-DD HH:MM:SS (UTC)") from None
        text_s = (row.get("exec_time_seconds") or "").strip()
        try:
            s = float(text_s)
        except ValueError:
            raise TraceError(f"{path}, line {line}: exec_time_seconds is {text_s!r}; write seconds as a number >= 0") from None
        if not math.isfinite(s) or s < 0:
            raise TraceError(f"{path}, line {line}: exec_time_seconds is {text_s!r}; write seconds as a number >= 0")
        created.append(t)
        took.append(s)
    if not created:
        raise TraceError(f"{path}: the request trace has no rows")
    return np.asarray(created, dtype=np.float64), np.asarray(took, dtype=np.float64)


def owned_nodes(nodes: Sequence[Node], share: float, seed: int) -> tuple[int, ...]:
    """The nodes the service owns: a seeded shuffle of the cluster's nodes, taken in order
    until they hold ``share`` of its GPUs (at least one node)."""
    if not 0 < share < 1:
        raise ValueError(f"the inference share is {share!r}; give a fraction with 0 < share < 1")
    total = sum(n.gpus for n in nodes)
    order = np.random.default_rng([31, 1, seed]).permutation(len(nodes))
    out: list[int] = []
    got = 0
    for j in order.tolist():
        if out and got >= share * total:
            break
        out.append(int(j))
        got += nodes[j].gpus
    return tuple(sorted(out))


def tide(nodes: Sequence[Node], owned: Sequence[int], path: Path = REQUESTS) -> Tide:
    """The service's hourly need, scaled so its busiest hour takes every GPU it owns."""
    created, took = read_requests(path)
    start = math.floor(float(created.min()) / HOUR_S) * HOUR_S
    hours = np.floor((created - start) / HOUR_S).astype(np.int64)
    per_hour = np.bincount(hours)
    mean_exec = float(took.mean()) if float(took.mean()) > 0 else 1.0
    throughput = BUSY_TARGET * HOUR_S / mean_exec
    raw = per_hour / throughput
    owned_gpus = sum(nodes[j].gpus for j in owned)
    scale = owned_gpus / float(raw.max())
    need = np.minimum(np.ceil(raw * scale - 1e-9), owned_gpus).astype(np.int64)
    return Tide(tuple(need.tolist()), tuple(per_hour.tolist()), mean_exec, throughput, owned_gpus,
                scale=scale, exec_s=took, hour=hours)


def requests(t: Tide, window_s: float, seed: int) -> tuple[F64, F64]:
    """The scaled service's requests within ``[0, window_s)``: arrival times (sorted) and
    execution times, as the module's docstring says."""
    rng = np.random.default_rng([31, 2, seed])
    order = np.argsort(t.hour, kind="stable")
    cut = np.searchsorted(t.hour[order], np.arange(len(t.hourly_gpus) + 1))
    arrivals: list[F64] = []
    took: list[F64] = []
    for k in range(math.ceil(window_s / HOUR_S)):
        h = k % len(t.hourly_gpus)
        recorded = t.exec_s[order[cut[h]:cut[h + 1]]]
        n = round(t.scale * len(recorded))
        if not n:
            continue
        lo, hi = k * HOUR_S, min((k + 1) * HOUR_S, window_s)
        arrivals.append(np.sort(rng.uniform(lo, hi, n)))
        took.append(recorded[rng.integers(0, len(recorded), n)])
    if not arrivals:
        return np.zeros(0), np.zeros(0)
    return np.concatenate(arrivals), np.concatenate(took)


def alone(t: Tide, window_s: float) -> tuple[tuple[float, int], ...]:
    """The GPUs the service serves on, as (time, change) steps, on its own nodes alone: its
    need, on the hour."""
    out: list[tuple[float, int]] = []
    have = 0
    for k in range(math.ceil(window_s / HOUR_S)):
        want = min(t.need(k * HOUR_S), t.owned_gpus)
        if want != have:
            out.append((k * HOUR_S, want - have))
            have = want
    return tuple(out)


def serve(arrival: F64, took: F64, steps: Sequence[tuple[float, int]]) -> F64:
    """Each request's queueing, first come first served on a number of GPUs that changes by
    ``steps`` ((time, change), applied in time order): one request a GPU at a time. A GPU
    taken away is the one free soonest, after the request it holds. A request that finds no
    GPU ever (the steps end with none) waits forever: ``inf``."""
    changes = sorted(steps)
    free: list[float] = []  # when each GPU serving now is next free
    out = np.empty(len(arrival))
    k = 0
    pop, push, swap = heapq.heappop, heapq.heappush, heapq.heapreplace
    for i, (a, e) in enumerate(zip(arrival.tolist(), took.tolist(), strict=True)):
        while k < len(changes) and changes[k][0] <= max(a, free[0] if free else math.inf):
            when, d = changes[k]
            k += 1
            if d > 0:
                for _ in range(d):
                    push(free, when)
            else:
                for _ in range(min(-d, len(free))):
                    pop(free)
        if not free:
            out[i:] = math.inf
            break
        s = max(a, free[0])
        swap(free, s + e)
        out[i] = s - a
    return out
