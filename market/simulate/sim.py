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
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from .trace import Node, Pod

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
BoolA = npt.NDArray[np.bool_]

PLACEMENTS = ("first", "best", "packed")
SIZED = 0.5  # packed (and the fill experiment's fgd-sized): a pod of the demand weighs (its GPUs) ** SIZED
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
    waited: F64  # per pod, seconds spent waiting in all (again after each preemption); NaN: never done
    timeline: F64  # GPUs held, averaged over each of TIMELINE_BINS bins of the window
    end_s: float  # when the last pod finished
    preemptions: int = 0
    work_lost_gpu_s: float = 0.0  # GPU-seconds of work preempted pods lost since their last checkpoint
    lent_gpu_s: float = 0.0  # GPU-seconds pods held on a service's nodes within the window
    pod_gpu_s: float = 0.0  # GPU-seconds pods held in all, window or not, preempted stretches included
    # the GPUs an inference service serves on, as (time, change) steps in time order: a
    # preemption's GPUs reach it ``Service.grace_s`` after the tide asked for them
    service_steps: tuple[tuple[float, int], ...] = ()
    service_short_gpu_s: float = 0.0  # GPU-seconds the service waited for preempted pods' GPUs

    @property
    def unscheduled(self) -> int:
        return int(np.isnan(self.start).sum())


class Chooser(Protocol):
    """A policy that decides for itself (the market): at ``clock``, given the waiting pods
    (indices, in arrival order), each node's free GPUs and each pod's runtime still to do,
    the (pod, node) pairs to start. ``preempted`` hears of a pod stopped after ``ran``
    seconds of the stretch it was started for (to bill it pro rata)."""

    def __call__(self, clock: float, waiting: list[int], free: I64, left: F64) -> list[tuple[int, int]]: ...

    def preempted(self, pod: int, ran: float) -> None: ...


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


@dataclass(frozen=True)
class Service:
    """A tidal inference service that owns nodes of the run (``tides.py``): it holds
    ``need(t)`` GPUs of them, changing on the hour. With ``lend``, the GPUs it does not need
    are sold to preemptible pods (of a QoS in ``spot_qos``) only, and when the tide rises the
    pods on them are preempted, most recently started first: each keeps the work up to its
    last checkpoint (every ``checkpoint_s`` of its run), loses the rest, and waits again for
    the runtime it has left. The preempted pod's GPUs are the service's at once, but it
    serves on them only ``grace_s`` later: the time the market gives a job to write its
    checkpoint (``PREEMPT_GRACE_S``, 30 s by default). Without ``lend`` the owned nodes are
    the service's alone."""

    owned: tuple[int, ...]  # indices into the run's nodes
    need: Callable[[float], int]
    lend: bool
    checkpoint_s: float = 1800.0
    grace_s: float = 30.0
    spot_qos: tuple[str, ...] = ("BE",)  # the pods that run as spot, and may be preempted


HORIZON_S = 400 * 86400.0  # a run stops here whatever still waits (a bound on the loop)


def run(pods: Sequence[Pod], nodes: Sequence[Node], placement: str, window_s: float,
        chooser: Chooser | None = None, service: Service | None = None) -> Outcome:
    """Replay ``pods`` (sorted by arrival) on ``nodes`` with ``placement`` (``PLACEMENTS``),
    or, with a ``chooser``, as it decides: after the events of each instant with pods
    waiting, it is asked which to start where (a pair that does not fit is refused). With a
    ``service``, the inference tide holds part of the owned nodes, hour by hour."""
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}: choose from {', '.join(PLACEMENTS)}")
    n = len(pods)
    cap = np.asarray([nd.gpus for nd in nodes], dtype=np.int64)
    free = cap.copy()
    allowed = allowed_nodes(pods, nodes)
    start = np.full(n, np.nan)  # the first start
    finish = np.full(n, np.nan)
    where = np.full(n, -1, dtype=np.int64)
    arrival = np.asarray([p.arrival for p in pods], dtype=np.float64)
    gpus = np.asarray([p.gpus for p in pods], dtype=np.int64)
    share = np.asarray([p.gpu_milli / 1000.0 for p in pods], dtype=np.float64)
    left = np.asarray([p.runtime for p in pods], dtype=np.float64)  # run time still to do
    since = np.full(n, np.nan)  # when the current stretch of running began
    gen = np.zeros(n, dtype=np.int64)  # a preempted pod's completion events go stale
    owned = np.zeros(len(nodes), dtype=np.bool_)
    if service is not None:
        owned[list(service.owned)] = True
    lend = service is not None and service.lend
    preemptible = np.asarray([service is not None and p.qos in service.spot_qos for p in pods], dtype=np.bool_)
    svc = np.zeros(len(nodes), dtype=np.int64)  # GPUs the service holds, per node
    steps: list[tuple[float, int]] = []  # the GPUs it serves on: (time, change)
    short_gpu_s = 0.0

    shared: dict[tuple[tuple[str, ...], bool], npt.NDArray[np.bool_]] = {}

    def usable(i: int) -> npt.NDArray[np.bool_]:
        """The nodes pod ``i`` may ever run on: one mask per (models, may use lent GPUs)."""
        key = (pods[i].models, bool(lend and preemptible[i]))
        if key not in shared:
            ok = allowed[i]
            room = np.ones(len(nodes), dtype=np.bool_) if ok is None else ok.copy()
            if service is not None and not key[1]:
                room &= ~owned
            shared[key] = room
        return shared[key]

    usable_of = [usable(i) for i in range(n)]
    schedulable = np.asarray([bool(((cap >= gpus[i]) & usable_of[i]).any()) for i in range(n)], dtype=np.bool_)

    queues: dict[tuple[int, tuple[str, ...], bool], deque[int]] = {}
    done: list[tuple[float, int, int]] = []  # (finish, pod, generation)
    held = 0  # GPUs held now, by pods and the service
    busy = 0.0  # ... weighted by share (the service's count whole)
    waiting = 0  # schedulable pods waiting now
    running: set[int] = set()
    clock = 0.0
    alloc_s = busy_s = stranded_s = waiting_s = lent_s = 0.0
    preemptions = 0
    lost_gpu_s = pod_gpu_s = 0.0
    lost_s = np.zeros(n)  # per pod, run time lost to preemptions
    bins = np.zeros(TIMELINE_BINS)
    width = window_s / TIMELINE_BINS if window_s > 0 else 1.0
    total = int(cap.sum())

    def key_of(i: int) -> tuple[int, tuple[str, ...], bool]:
        return int(gpus[i]), pods[i].models, bool(lend and preemptible[i])

    def advance(to: float) -> None:
        """Integrate the state from ``clock`` to ``to`` (within the window only)."""
        nonlocal alloc_s, busy_s, stranded_s, waiting_s, lent_s
        a, b = min(clock, window_s), min(to, window_s)
        if b <= a:
            return
        span = b - a
        alloc_s += held * span
        busy_s += busy * span
        if lend:
            lent_s += sum(int(gpus[i]) for i in running if owned[where[i]]) * span
        if waiting:
            stranded_s += (total - held) * span
            waiting_s += span
        if held:  # spread over the timeline's bins
            lo, hi = int(a // width), min(int(np.ceil(b / width)), TIMELINE_BINS)
            for k in range(lo, hi):
                lft, rgt = max(a, k * width), min(b, (k + 1) * width)
                if rgt > lft:
                    bins[k] += held * (rgt - lft)

    def begin(i: int, j: int) -> None:
        nonlocal held, busy
        free[j] -= gpus[i]
        if np.isnan(start[i]):
            start[i] = clock
        since[i] = clock
        finish[i] = clock + left[i]
        where[i] = j
        held += int(gpus[i])
        busy += gpus[i] * share[i]
        running.add(i)
        heapq.heappush(done, (float(finish[i]), i, int(gen[i])))

    def stop(i: int) -> None:
        nonlocal held, busy, pod_gpu_s
        pod_gpu_s += float(gpus[i]) * (clock - since[i])
        free[where[i]] += gpus[i]
        held -= int(gpus[i])
        busy -= gpus[i] * share[i]
        running.discard(i)

    def enqueue(i: int) -> None:
        nonlocal waiting
        q = queues.setdefault(key_of(i), deque())
        q.append(i)
        if len(q) > 1 and (arrival[q[-2]], q[-2]) > (arrival[i], i):  # a preempted pod goes back in its place
            queues[key_of(i)] = deque(sorted(q, key=lambda x: (arrival[x], x)))
        waiting += 1

    def preempt(i: int) -> None:
        nonlocal preemptions, lost_gpu_s
        ran = clock - since[i]
        kept = math.floor(ran / service.checkpoint_s) * service.checkpoint_s if service else 0.0
        left[i] -= kept
        lost_gpu_s += float(gpus[i]) * (ran - kept)
        lost_s[i] += ran - kept
        preemptions += 1
        gen[i] += 1
        if chooser is not None:
            chooser.preempted(i, ran)
        stop(i)
        finish[i] = np.nan
        where[i] = -1
        enqueue(i)

    def tide() -> None:
        """The service takes or gives back GPUs to hold ``need(clock)`` on its nodes."""
        nonlocal held, busy, short_gpu_s
        assert service is not None
        want = min(int(service.need(clock)), int(cap[owned].sum()))
        have = before = int(svc.sum())
        nodes_in = list(service.owned)
        if want < have:
            for j in reversed(nodes_in):
                give = min(int(svc[j]), have - want)
                svc[j] -= give
                free[j] += give
                have -= give
        if want > have:
            for j in nodes_in:
                take = min(int(free[j]), want - have)
                svc[j] += take
                free[j] -= take
                have += take
            if have != before:
                steps.append((clock, have - before))
            freed = have
            victims = sorted((i for i in running if owned[where[i]]), key=lambda i: (-since[i], -i))
            for i in victims:
                if have >= want:
                    break
                j = int(where[i])
                preempt(i)
                take = min(int(free[j]), want - have)
                svc[j] += take
                free[j] -= take
                have += take
            if have > freed:  # served on once the preempted jobs have written their checkpoints
                steps.append((clock + service.grace_s, have - freed))
                short_gpu_s += (have - freed) * service.grace_s
        elif have != before:
            steps.append((clock, have - before))
        held += have - before
        busy += have - before

    if placement == "packed":  # the pod list's demand in GPUs, each pod weighing its GPUs ** SIZED (packing.Demand.of)
        sizes, counts = np.unique(gpus, return_counts=True)
        mass = counts * sizes.astype(np.float64) ** SIZED
        demand_w = mass / mass.sum()

    def frag(f: I64) -> F64:
        """Each node's expected GPUs the demand could not use with ``f`` free (whole GPUs)."""
        return np.asarray((demand_w[None, :] * (sizes[None, :] > f[:, None])).sum(axis=1) * f, dtype=np.float64)

    def place(i: int) -> bool:
        room = (free >= gpus[i]) & usable_of[i]
        idx = np.flatnonzero(room)
        if not len(idx):
            return False
        if placement == "first":
            j = int(idx[0])
        elif placement == "best":
            j = int(idx[np.argmin(free[idx])])
        else:  # least growth of fragmentation (rounded: a tie is a tie), then best fit, then the first
            grow = np.round(frag(free[idx] - gpus[i]) - frag(free[idx]), 9)
            j = int(idx[np.lexsort((idx, free[idx], grow))[0]])
        begin(i, j)
        return True

    def choose() -> None:
        nonlocal waiting
        assert chooser is not None
        queued = sorted((i for q in queues.values() for i in q), key=lambda i: (arrival[i], i))
        for i, j in chooser(clock, queued, free.copy(), left.copy()):
            if i in running or free[j] < gpus[i] or not usable_of[i][j]:
                raise ValueError(f"the policy started pod {pods[i].id} on node {nodes[j].id}, where it does not fit")
            queues[key_of(i)].remove(i)
            waiting -= 1
            begin(i, j)

    def schedule() -> None:
        nonlocal waiting
        if chooser is not None:
            if waiting:
                choose()
            return
        blocked: set[tuple[int, tuple[str, ...], bool]] = set()
        while waiting:
            most = int(free.max()) if len(free) else 0
            best: tuple[float, int, tuple[int, tuple[str, ...], bool]] | None = None
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
    hour = 0.0
    if service is not None:
        tide()
    # a chooser whose pods may wait for an hour (gridbid-carbon) is woken each hour as a tide is
    ticking = service is not None or bool(getattr(chooser, "hourly", False))
    while (nxt < n or done or (service is not None and clock < window_s) or (ticking and waiting)) and clock < HORIZON_S:
        t_arr = arrival[nxt] if nxt < n else np.inf
        t_done = done[0][0] if done else np.inf
        t_hour = hour + 3600.0 if ticking else np.inf
        t = float(min(t_arr, t_done, t_hour))
        advance(t)
        clock = t
        while done and done[0][0] <= t:
            _, i, g = heapq.heappop(done)
            if g == gen[i] and i in running:
                stop(i)
        if t >= t_hour:
            hour = t_hour
            if service is not None:
                tide()
        while nxt < n and arrival[nxt] <= t:
            if schedulable[nxt]:
                enqueue(nxt)
            nxt += 1
        schedule()
    advance(max(clock, window_s))
    timeline = bins / width
    end = float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0
    runtime = np.asarray([p.runtime for p in pods], dtype=np.float64)
    waited = finish - arrival - runtime - lost_s  # NaN where the pod never finished
    return Outcome(start=start, finish=finish, node=where, window_s=window_s, capacity_gpus=total,
                   alloc_gpu_s=alloc_s, busy_gpu_s=busy_s, stranded_gpu_s=stranded_s, waiting_s=waiting_s,
                   timeline=timeline, end_s=end, preemptions=preemptions, work_lost_gpu_s=lost_gpu_s,
                   lent_gpu_s=lent_s, pod_gpu_s=pod_gpu_s, waited=waited, service_steps=tuple(steps),
                   service_short_gpu_s=short_gpu_s)
