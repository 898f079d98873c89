"""The discrete-event simulator: a virtual clock, jobs arriving and finishing, and a policy
that decides which waiting job starts on which machine.

One run (``run``) replays a set of pods on a set of nodes:

* the clock jumps from event to event (an arrival or a completion); nothing happens
  between two events, so a week of trace costs what its events cost, not its seconds;
* a pod holds ``gpus`` whole GPUs of one node (same machine) from its start until its
  runtime has passed; it never moves and is never preempted (part 2 adds preemption);
* a pod that fits no node of the run at all (too many GPUs, or none of its models) is
  *unschedulable* and never waits; every other pod waits until it fits, so a run ends
  with every such pod finished;
* after the events of an instant, the waiting pods are scanned in arrival order and each
  one that fits starts at once (a pod that does not fit does not hold back those behind
  it: Kubernetes-like backfill). Pods of the same shape (GPUs, models) wait in one queue,
  so the scan looks at one head per shape, and a node search is one numpy pass.

Placement is the policy's: ``first`` takes the first node, in the cluster's order, with
room; ``best`` takes the node with the least room that still fits (ties: the first), which
keeps whole machines free for large jobs. Policies over the whole trace (static silos,
static sized to the SLO, FIFO, best fit) are built from runs in ``policies``.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .trace import Node, Pod

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

PLACEMENTS = ("first", "best")
TIMELINE_BINS = 200  # utilisation over time is kept in this many equal bins of the window


@dataclass(frozen=True)
class Outcome:
    """What one run did. Per pod (in the order given to ``run``): its start (NaN if it never
    started: unschedulable), finish and node (index into the run's nodes, -1 if none)."""

    start: F64
    finish: F64
    node: I64
    window_s: float
    capacity_gpus: int
    alloc_gpu_s: float  # GPU-seconds held by pods within [0, window_s]
    busy_gpu_s: float  # ... weighted by each pod's gpu_milli share
    stranded_gpu_s: float  # free GPU-seconds while some schedulable pod waited, within the window
    waiting_s: float  # seconds within the window during which some pod waited
    timeline: F64  # GPUs held, averaged over each of TIMELINE_BINS bins of the window
    end_s: float  # when the last pod finished

    @property
    def unscheduled(self) -> int:
        return int(np.isnan(self.start).sum())


class Chooser(Protocol):
    """A policy that decides for itself (the market): at ``clock``, given the waiting pods
    (indices, in arrival order) and each node's free GPUs, the (pod, node) pairs to start."""

    def __call__(self, clock: float, waiting: list[int], free: I64) -> list[tuple[int, int]]: ...


def allowed_nodes(pods: Sequence[Pod], nodes: Sequence[Node]) -> list[BoolA | None]:
    """Per pod, the nodes of a model it may run on (None: any model)."""
    models = np.asarray([n.model for n in nodes])
    cache: dict[tuple[str, ...], BoolA | None] = {}
    out: list[BoolA | None] = []
    for p in pods:
        if p.models not in cache:
            cache[p.models] = None if not p.models else np.isin(models, np.asarray(p.models))
        out.append(cache[p.models])
    return out


def fits_somewhere(pods: Sequence[Pod], nodes: Sequence[Node]) -> BoolA:
    """Per pod, whether some node of ``nodes`` could hold it when empty."""
    cap = np.asarray([n.gpus for n in nodes], dtype=np.int64)
    out = np.zeros(len(pods), dtype=np.bool_)
    for i, (p, ok) in enumerate(zip(pods, allowed_nodes(pods, nodes), strict=True)):
        room = cap >= p.gpus
        if ok is not None:
            room &= ok
        out[i] = bool(room.any())
    return out


def run(pods: Sequence[Pod], nodes: Sequence[Node], placement: str, window_s: float,
        chooser: Chooser | None = None) -> Outcome:
    """Replay ``pods`` (sorted by arrival) on ``nodes`` with ``placement`` (``PLACEMENTS``),
    or, with a ``chooser``, as it decides: after the events of each instant with pods
    waiting, it is asked which to start where (a pair that does not fit is refused)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: choose from {', '.join(PLACEMENTS)}")
    n = len(pods)
    cap = np.asarray([nd.gpus for nd in nodes], dtype=np.int64)
    free = cap.copy()
    allowed = allowed_nodes(pods, nodes)
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    where = np.full(n, -1, dtype=np.int64)
    arrival = np.asarray([p.arrival for p in pods], dtype=np.float64)
    gpus = np.asarray([p.gpus for p in pods], dtype=np.int64)
    share = np.asarray([p.gpu_milli / 1000.0 for p in pods], dtype=np.float64)
    runtime = np.asarray([p.runtime for p in pods], dtype=np.float64)

    schedulable = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        room = cap >= gpus[i]
        ok = allowed[i]
        if ok is not None:
            room &= ok
        schedulable[i] = bool(room.any())

    queues: dict[tuple[int, tuple[str, ...]], deque[int]] = {}
    done: list[tuple[float, int]] = []  # (finish, pod)
    held = 0  # GPUs held now
    busy = 0.0  # ... weighted by share
    waiting = 0  # schedulable pods waiting now
    clock = 0.0
    alloc_s = busy_s = stranded_s = waiting_s = 0.0
    bins = np.zeros(TIMELINE_BINS)
    width = window_s / TIMELINE_BINS if window_s > 0 else 1.0
    total = int(cap.sum())

    def advance(to: float) -> None:
        """Integrate the state from ``clock`` to ``to`` (within the window only)."""
        nonlocal alloc_s, busy_s, stranded_s, waiting_s
        a, b = min(clock, window_s), min(to, window_s)
        if b <= a:
            return
        span = b - a
        alloc_s += held * span
        busy_s += busy * span
        if waiting:
            stranded_s += (total - held) * span
            waiting_s += span
        if held:  # spread over the timeline's bins
            lo, hi = int(a // width), min(int(np.ceil(b / width)), TIMELINE_BINS)
            for k in range(lo, hi):
                left, right = max(a, k * width), min(b, (k + 1) * width)
                if right > left:
                    bins[k] += held * (right - left)

    def place(i: int) -> bool:
        room = free >= gpus[i]
        ok = allowed[i]
        if ok is not None:
            room &= ok
        idx = np.flatnonzero(room)
        if not len(idx):
            return False
        j = int(idx[0]) if placement == "first" else int(idx[np.argmin(free[idx])])
        free[j] -= gpus[i]
        start[i] = clock
        finish[i] = clock + runtime[i]
        where[i] = j
        add(i)
        return True

    def choose() -> None:
        nonlocal waiting
        assert chooser is not None
        queued = sorted((i for q in queues.values() for i in q), key=lambda i: (arrival[i], i))
        for i, j in chooser(clock, queued, free.copy()):
            ok = allowed[i]
            if not np.isnan(start[i]) or free[j] < gpus[i] or (ok is not None and not ok[j]):
                raise ValueError(f"the policy started pod {pods[i].id} on node {nodes[j].id}, where it does not fit")
            free[j] -= gpus[i]
            start[i] = clock
            finish[i] = clock + runtime[i]
            where[i] = j
            add(i)
            queues[(int(gpus[i]), pods[i].models)].remove(i)
            waiting -= 1

    def add(i: int) -> None:
        nonlocal held, busy
        held += int(gpus[i])
        busy += gpus[i] * share[i]
        heapq.heappush(done, (float(finish[i]), i))

    def schedule() -> None:
        nonlocal waiting
        if chooser is not None:
            if waiting:
                choose()
            return
        blocked: set[tuple[int, tuple[str, ...]]] = set()
        while waiting:
            most = int(free.max()) if len(free) else 0
            best: tuple[float, int, tuple[int, tuple[str, ...]]] | None = None
            for key, q in queues.items():
                if q and key not in blocked and key[0] <= most:
                    head = q[0]
                    if best is None or (arrival[head], head) < (best[0], best[1]):
                        best = (float(arrival[head]), head, key)
            if best is None:
                return
            _, i, key = best
            if place(i):
                queues[key].popleft()
                waiting -= 1
            else:
                blocked.add(key)

    nxt = 0
    while nxt < n or done:
        t_arr = arrival[nxt] if nxt < n else np.inf
        t_done = done[0][0] if done else np.inf
        t = float(min(t_arr, t_done))
        advance(t)
        clock = t
        while done and done[0][0] <= t:
            _, i = heapq.heappop(done)
            free[where[i]] += gpus[i]
            held -= int(gpus[i])
            busy -= gpus[i] * share[i]
        while nxt < n and arrival[nxt] <= t:
            if schedulable[nxt]:
                queues.setdefault((int(gpus[nxt]), pods[nxt].models), deque()).append(nxt)
                waiting += 1
            nxt += 1
        schedule()
    advance(max(clock, window_s))
    timeline = bins / width
    end = float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0
    return Outcome(start=start, finish=finish, node=where, window_s=window_s, capacity_gpus=total,
                   alloc_gpu_s=alloc_s, busy_gpu_s=busy_s, stranded_gpu_s=stranded_s, waiting_s=waiting_s,
                   timeline=timeline, end_s=end)
