"""The policies ``gridbid simulate`` compares, built from runs of ``sim.run``, and the
capacity each needs to meet the SLO.

* **static**: each team owns a fixed slice of the cluster sized to its share of the
  window's demand (``slices``), and runs its own pods there, first fit, in arrival order.
* **static-sized**: the same teams, each owning the smallest slice on which its own pods
  meet the SLO (``SLO_QUEUE_P95_S``): static at its best, the stronger baseline.
* **fifo**: one shared pool, first fit, in arrival order.
* **best-fit**: one shared pool, best fit (the node with the least room that still fits),
  in arrival order: a Kubernetes-like baseline.
* **packed** (issue 38): one shared pool, in arrival order, each pod on the node where the
  fragmentation of the pod list's demand grows least (FGD's step on whole GPUs, each pod of
  the demand weighing the square root of its GPUs, ``sim.SIZED``), ties to best fit.

**Capacity at the SLO.** A smaller cluster is the trace's nodes less those removed first in
a seeded order (``removal_order``): a cluster of ``k`` nodes keeps the first ``k`` of that
order, in the cluster's own order. A policy meets the SLO on a cluster when every pod that
fits some node of the trace's whole cluster runs to its end, and the 95th percentile of
their queueing delay (all their waiting, again after each preemption) is at most
``SLO_QUEUE_P95_S``. The fewest such nodes are found by steps
that double, then bisection (``smallest``; meeting the SLO is taken to be monotone in
``k``): to one node, finer than the issue's 2% (at the trace's own timing a day's demand
needs about 2% of the cluster, so 2% steps could not tell the policies apart). The fraction
reported is the GPUs kept over the cluster's. For static-sized it is the sum of each team's
smallest slice, found the same way on that team's pods alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from . import auction, tides
from .sim import F64, I64, TIMELINE_BINS, BoolA, Outcome, Service, fits_somewhere, run
from .trace import Node, Pod

SLO_QUEUE_P95_S = 600.0  # seconds: the queueing delay 95% of the pods that fit must start within
POLICIES = ("static", "static-sized", "fifo", "best-fit", "gridbid", "gridbid-no-preempt", "gridbid-no-predict", "gridbid-carbon",
            "gridbid-pack", "packed")
# gridbid-no-preempt and gridbid-no-predict are gridbid's twins unless an inference service lends
DEFAULT_POLICIES = POLICIES[:5]

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Capacity:
    """The smallest cluster a policy meets the SLO on: the nodes kept (indices into the
    trace's nodes; for static-sized, per team, and a node may count once per team)."""

    fraction: float
    nodes: tuple[int, ...]
    gpus: int
    alloc_gpu_s: float  # GPU-seconds held on it within the window, the policy running there
    preemptions: int = 0  # ... spot pods an inference service's tide preempted there
    work_lost_gpu_s: float = 0.0
    lent_gpu_s: float = 0.0
    stranded_gpu_s: float = 0.0  # ... GPUs free while a pod that could use some waited there (issue 38)


@dataclass(frozen=True)
class ServiceQueue:
    """How the inference service's requests fared (``tides.serve``) on one run."""

    requests: int
    queue_mean_s: float
    queue_p95_s: float
    queue_p99_s: float
    waited_share: float  # the share of requests that waited at all
    short_gpu_s: float  # GPU-seconds it waited for preempted jobs to checkpoint


@dataclass(frozen=True)
class PolicyResult:
    name: str
    outcome: Outcome  # on the trace's own cluster (static-sized: each team on its own slice)
    nodes: tuple[int, ...]  # per pod's ``outcome.node``: the trace node index it ran on (-1 none)
    capacity: Capacity | None  # None: the SLO is not met even on the whole cluster
    paid: float | None = None  # USD the market's rounds charged (gridbid), None for owned capacity
    rounds: int = 0  # the market's rounds on the trace's own cluster
    inference: ServiceQueue | None = None  # the inference service's requests, on the cluster at the SLO
    # the run on the cluster at the SLO (gridbid-carbon: on gridbid's, its own not searched), with
    # each pod's trace node (-1 none) and, for the market, what its rounds charged there
    there: Outcome | None = None
    there_nodes: tuple[int, ...] = ()
    there_paid: float | None = None
    there_of: str | None = None  # whose cluster at the SLO ``there`` is
    deferred: int | None = None  # the market's pods that waited for a cleaner hour (gridbid-carbon), on the trace's cluster
    there_deferred: int | None = None  # ... on the cluster at the SLO


def removal_order(nodes: Sequence[Node], seed: int) -> I64:
    """The order in which a smaller cluster loses the trace's nodes: seeded, documented."""
    return np.random.default_rng([30, 1, seed]).permutation(len(nodes)).astype(np.int64)


def slices(pods: Sequence[Pod], nodes: Sequence[Node], keep: I64, teams: int) -> list[list[int]]:
    """Static slices of the nodes ``keep``: each team's share of the GPUs is its share of the
    window's work (GPUs x runtime). Teams are served by demand, largest first: each first gets
    the first node (in ``keep``'s order) that holds its largest pod; then every node left goes,
    in order, to the team furthest below its share (ties: the lower team)."""
    work = np.zeros(teams)
    largest = np.zeros(teams, dtype=np.int64)
    for p in pods:
        work[p.team] += p.gpus * p.runtime
        largest[p.team] = max(largest[p.team], p.gpus)
    total_gpus = sum(nodes[j].gpus for j in keep.tolist())
    quota = work / work.sum() * total_gpus if work.sum() > 0 else np.zeros(teams)
    got = np.zeros(teams)
    out: list[list[int]] = [[] for _ in range(teams)]
    left = list(keep.tolist())
    for t in sorted(range(teams), key=lambda t: (-work[t], t)):
        if work[t] <= 0:
            continue
        for j in left:
            if nodes[j].gpus >= largest[t]:
                out[t].append(j)
                got[t] += nodes[j].gpus
                left.remove(j)
                break
    for j in left:
        t = int(np.argmax(quota - got))
        out[t].append(j)
        got[t] += nodes[j].gpus
    return [sorted(s) for s in out]


def merge(n: int, parts: Sequence[tuple[I64, I64, Outcome]], window_s: float, capacity: int,
          service_gpu_s: float = 0.0) -> tuple[Outcome, I64]:
    """One outcome from runs over disjoint pod sets: ``parts`` holds each run's pod indices,
    its node indices (into the trace's nodes) and its outcome; ``service_gpu_s`` is what an
    inference service held beside them in the window. Returns it and, per pod, the trace node
    it ran on."""
    start = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    node = np.full(n, -1, dtype=np.int64)
    timeline = np.zeros(TIMELINE_BINS)
    alloc = busy = service_gpu_s
    stranded = waiting = end = pod_gpu_s = 0.0
    waited = np.full(n, np.nan)
    for pods_i, nodes_i, o in parts:
        waited[pods_i] = o.waited
        start[pods_i] = o.start
        finish[pods_i] = o.finish
        node[pods_i] = np.where(o.node >= 0, nodes_i[np.maximum(o.node, 0)] if len(nodes_i) else -1, -1)
        timeline += o.timeline
        alloc += o.alloc_gpu_s
        busy += o.busy_gpu_s
        stranded += o.stranded_gpu_s
        pod_gpu_s += o.pod_gpu_s
        waiting = max(waiting, o.waiting_s)
        end = max(end, o.end_s)
    out = Outcome(start=start, finish=finish, node=node, window_s=window_s, capacity_gpus=capacity,
                  alloc_gpu_s=alloc, busy_gpu_s=busy, stranded_gpu_s=stranded, waiting_s=waiting,
                  timeline=timeline, end_s=end, pod_gpu_s=pod_gpu_s, waited=waited)
    return out, node



class Simulation:
    """The policies over one trace: ``pods`` (sorted by arrival) on ``nodes``."""

    def __init__(self, pods: Sequence[Pod], nodes: Sequence[Node], window_s: float, teams: int, seed: int,
                 progress: Progress = _quiet, service: tides.Options = tides.Options(),
                 carbon_weight: float = auction.CARBON_WEIGHT) -> None:
        """With ``service.share`` > 0, a tidal inference service (``tides.py``) owns that
        share of the cluster's GPUs in every policy; only ``gridbid`` lends what it does not
        need to spot pods and preempts them when the tide rises. Its nodes are never removed
        by the capacity search."""
        self.pods, self.nodes, self.window_s, self.teams = pods, nodes, window_s, teams
        self.progress = progress
        self.options = service
        self.carbon_weight = carbon_weight  # gridbid-carbon's bids' weight, base units per kg
        self.owned: tuple[int, ...] = tides.owned_nodes(nodes, service.share, seed) if service.share > 0 else ()
        self.tide = tides.tide(nodes, self.owned) if self.owned else None
        self.service_gpu_s = self.tide.gpu_hours(window_s) * 3600 if self.tide is not None else 0.0
        self.requests = tides.requests(self.tide, window_s, seed) if self.tide is not None else None
        self.queues: dict[tuple[tuple[float, int], ...], ServiceQueue] = {}
        mine = set(self.owned)
        self.order = np.asarray([j for j in removal_order(nodes, seed).tolist() if j not in mine], dtype=np.int64)
        self.arrival: F64 = np.asarray([p.arrival for p in pods], dtype=np.float64)
        # the pods the SLO counts: they fit the cluster outside the service's nodes
        self.must = fits_somewhere(pods, [nodes[j] for j in self.order.tolist()])
        self.capacity = sum(n.gpus for n in nodes)
        self.team_of = np.asarray([p.team for p in pods], dtype=np.int64)
        self.asks = auction.asks(nodes, seed)
        # the pods that bid as spot: the service's preemptible rule, in every market run
        self.spot = frozenset(i for i, p in enumerate(pods) if self.tide is not None and p.qos in service.spot_qos)
        self.limits = auction.limits(pods, nodes, seed)
        self.market: auction.Market | None = None  # the last market run
        self.found: dict[str, int] = {}  # per policy run so far, the nodes it needs at the SLO

    def slo_ok(self, waited: F64, among: BoolA) -> bool:
        """Every pod of ``among`` that fits the cluster ran to its end, and the 95th percentile
        of the time they spent waiting (again after each preemption) is within the SLO."""
        must = self.must & among
        if not must.any():
            return True
        w = waited[must]
        if np.isnan(w).any():
            return False
        return float(np.percentile(w, 95)) <= SLO_QUEUE_P95_S

    def cluster(self, k: int) -> I64:
        """The first ``k`` nodes of the removal order and the service's, in cluster order."""
        return np.sort(np.concatenate([self.order[:k], np.asarray(self.owned, dtype=np.int64)]))

    def service(self, keep: I64, lend: bool) -> Service | None:
        if self.tide is None:
            return None
        at = {j: i for i, j in enumerate(keep.tolist())}
        o = self.options
        return Service(tuple(at[j] for j in self.owned), self.tide.need, lend, o.checkpoint_s, o.grace_s, o.spot_qos)

    def queue(self, o: Outcome) -> ServiceQueue | None:
        """The service's requests served on the GPUs it held in run ``o`` (on its own nodes
        alone where the run had no service: a static policy's)."""
        if self.tide is None or self.requests is None:
            return None
        steps = tuple(x for x in o.service_steps if x[0] < self.window_s) or tides.alone(self.tide, self.window_s)
        if steps not in self.queues:
            arrival, took = self.requests
            w = tides.serve(arrival, took, steps)
            n = len(w)
            w = w if n else np.zeros(1)  # no request in the window: nothing waited
            self.queues[steps] = ServiceQueue(
                requests=n, queue_mean_s=float(w.mean()), queue_p95_s=float(np.percentile(w, 95)),
                queue_p99_s=float(np.percentile(w, 99)), waited_share=float((w > 0).mean()), short_gpu_s=o.service_short_gpu_s)
        return self.queues[steps]

    # -- one run of each policy on a set of nodes ----------------------------------------

    def shared(self, keep: I64, placement: str) -> tuple[Outcome, I64]:
        o = run(self.pods, [self.nodes[j] for j in keep.tolist()], placement, self.window_s,
                service=self.service(keep, lend=False))
        node = np.where(o.node >= 0, keep[np.maximum(o.node, 0)], -1)
        return o, node

    def static(self, keep: I64) -> tuple[Outcome, I64]:
        parts = []
        open_nodes = keep[~np.isin(keep, np.asarray(self.owned, dtype=np.int64))]
        for t, s in enumerate(slices(self.pods, self.nodes, open_nodes, self.teams)):
            mine = np.flatnonzero(self.team_of == t)
            if not len(mine):
                continue
            o = run([self.pods[i] for i in mine.tolist()], [self.nodes[j] for j in s], "first", self.window_s)
            parts.append((mine, np.asarray(s, dtype=np.int64), o))
        return merge(len(self.pods), parts, self.window_s, sum(self.nodes[j].gpus for j in keep.tolist()),
                     self.service_gpu_s)

    def auction(self, keep: I64, lend: bool, predict: bool = True, carbon: bool = False, pack: bool = False) -> tuple[Outcome, I64]:
        nodes = [self.nodes[j] for j in keep.tolist()]
        svc = self.service(keep, lend)
        owned = frozenset(svc.owned) if svc is not None else frozenset()
        self.market = auction.Market(self.pods, nodes, [self.asks[j] for j in keep.tolist()], self.limits,
                                     spot_only=owned if lend else frozenset(), closed=frozenset() if lend else owned,
                                     spot=self.spot, service=svc, predict=predict, carbon_aware=carbon,
                                     carbon_weight=self.carbon_weight, pack_band=auction.PACK_BAND if pack else 0)
        o = run(self.pods, nodes, "first", self.window_s, chooser=self.market, service=svc)
        return o, np.where(o.node >= 0, keep[np.maximum(o.node, 0)], -1)

    def at(self, name: str, keep: I64) -> tuple[Outcome, I64]:
        if name in ("gridbid", "gridbid-no-preempt", "gridbid-no-predict", "gridbid-carbon", "gridbid-pack"):
            return self.auction(keep, lend=name != "gridbid-no-preempt", predict=name in ("gridbid", "gridbid-carbon", "gridbid-pack"),
                                carbon=name == "gridbid-carbon", pack=name == "gridbid-pack")
        if name == "static":
            return self.static(keep)
        if name == "fifo":
            return self.shared(keep, "first")
        if name == "best-fit":
            return self.shared(keep, "best")
        if name == "packed":
            return self.shared(keep, "packed")
        raise ValueError(f"unknown policy {name!r}: choose from {', '.join(POLICIES)}")

    # -- capacity at the SLO ---------------------------------------------------------------

    def smallest(self, ok: Callable[[I64], bool], hint: int | None = None) -> int | None:
        """The fewest nodes (a prefix of ``removal_order``) whose cluster ``ok`` accepts, to one
        node. From ``hint`` (another policy's answer: the market's is usually within a few
        nodes of the pools', and each of its runs clears a round per event through the
        engine), steps of 1, 2, 4, ... down while it is met or up until it is, then
        bisection between the last two; without one, from a single node up. At the trace's own
        timing the answer is a few percent of the cluster, and small clusters are quick to
        simulate. Either way the answer is a k that meets the SLO next to k - 1 that does not
        (or the whole cluster, or None where even that fails)."""
        n = len(self.order)

        def test(k: int) -> bool:
            return ok(self.cluster(k))

        if hint is None or not 1 <= hint <= n:
            hint = 1
        step = 1
        if test(hint):
            hi, lo = hint, hint - step  # lo: not yet known to fail
            while lo >= 1 and test(lo):
                hi, step = lo, step * 2
                lo = hi - step
            lo = max(lo, 0)
        else:
            lo = hint
            hi = hint + step
            while hi < n and not test(hi):
                lo, step = hi, step * 2
                hi = lo + step
            if hi >= n:
                hi = n
                if not test(n):
                    return None
        while hi - lo > 1:  # test(hi) holds; test(lo) fails, or lo is 0
            mid = (lo + hi) // 2
            if test(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def pool_hint(self) -> int:
        """Where the market's capacity search starts: a pool's answer (best fit's, searched
        now if no pool policy ran: from one node up, the market's search runs a round per
        event on clusters far too small, which takes minutes on the whole trace)."""
        got = next((self.found[p] for p in ("best-fit", "fifo", "static") if p in self.found), None)
        if got is None:
            self.progress("best-fit: where the market's search starts")
            everyone = np.ones(len(self.pods), dtype=np.bool_)
            got = self.smallest(lambda keep: self.slo_ok(self.at("best-fit", keep)[0].waited, everyone)) or len(self.order)
            self.found["best-fit"] = got
        return got

    def policy(self, name: str) -> PolicyResult:
        if name == "static-sized":
            return self.static_sized()
        self.progress(f"{name}: the trace's cluster")
        full = np.arange(len(self.nodes), dtype=np.int64)
        o, node = self.at(name, full)
        mkt = self.market if name.startswith("gridbid") else None
        everyone = np.ones(len(self.pods), dtype=np.bool_)

        def ok(keep: I64) -> bool:
            self.progress(f"{name}: {len(keep)} nodes")
            return self.slo_ok(self.at(name, keep)[0].waited, everyone)

        hint = self.pool_hint() if name.startswith("gridbid") else None
        # gridbid-carbon's deferrable pods wait for cleaner hours by design, for hours, where the
        # SLO counts minutes: its capacity at the SLO is not searched
        k = None if name == "gridbid-carbon" else self.smallest(ok, hint)
        if k is not None:
            self.found[name] = k
        cap = None
        there, there_node, there_mkt = o, node, mkt
        if k is not None:
            keep = self.cluster(k)
            gpus = sum(self.nodes[j].gpus for j in keep.tolist())
            if len(keep) != len(self.nodes):
                there, there_node = self.at(name, keep)
                there_mkt = self.market if mkt is not None else None
            cap = Capacity(round(gpus / self.capacity, 6), tuple(keep.tolist()), gpus, there.alloc_gpu_s,
                           there.preemptions, there.work_lost_gpu_s, there.lent_gpu_s, there.stranded_gpu_s)
        of: str | None = name if k is not None else None
        if name == "gridbid-carbon" and "gridbid" not in self.found:
            self.progress("gridbid-carbon: gridbid's cluster at the SLO, to compare on")
            self.found["gridbid"] = self.smallest(lambda keep: self.slo_ok(self.at("gridbid", keep)[0].waited, everyone), hint) or len(self.order)
        if name == "gridbid-carbon":
            # its deferrable pods wait for cleaner hours by design, for hours where the SLO
            # counts minutes: it runs on gridbid's cluster at the SLO instead, to compare there
            self.progress(f"{name}: gridbid's cluster at the SLO")
            there, there_node = self.at(name, self.cluster(self.found["gridbid"]))
            there_mkt, of = self.market, "gridbid"
        return PolicyResult(name, o, tuple(node.tolist()), cap, mkt.paid if mkt is not None else None, mkt.rounds if mkt is not None else 0,
                            self.queue(there), there=there if of else None, there_nodes=tuple(there_node.tolist()) if of else (),
                            there_paid=there_mkt.paid if of and there_mkt is not None else None, there_of=of,
                            deferred=len(mkt.deferred) if mkt is not None and mkt.carbon_aware else None,
                            there_deferred=len(there_mkt.deferred) if of and there_mkt is not None and there_mkt.carbon_aware else None)

    def static_sized(self) -> PolicyResult:
        """Each team on the smallest prefix of ``removal_order`` (kept in cluster order) that
        meets the SLO on its own pods, found by bisection over the number of nodes."""
        parts = []
        owned: list[int] = []
        met = True
        n = len(self.order)
        for t in range(self.teams):
            mine = np.flatnonzero(self.team_of == t)
            if not len(mine):
                continue
            self.progress(f"static-sized: team {t + 1} of {self.teams}")
            pods = [self.pods[i] for i in mine.tolist()]
            among = np.zeros(len(self.pods), dtype=np.bool_)
            among[mine] = True

            def outcome(k: int, pods: list[Pod] = pods) -> tuple[Outcome, I64]:
                keep = np.sort(self.order[:k])  # the team's own slice: never the service's nodes
                return run(pods, [self.nodes[j] for j in keep.tolist()], "first", self.window_s), keep

            def ok(k: int, mine: I64 = mine, among: BoolA = among, outcome: Callable[[int], tuple[Outcome, I64]] = outcome) -> bool:
                o, _ = outcome(k)
                full = np.full(len(self.pods), np.nan)
                full[mine] = o.waited
                return self.slo_ok(full, among)

            if ok(n):
                lo, hi = 0, n
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    if ok(mid):
                        hi = mid
                    else:
                        lo = mid
                k = hi
            else:
                met, k = False, n
            o, keep = outcome(k)
            parts.append((mine, keep, o))
            owned.extend(keep.tolist())
        merged, node = merge(len(self.pods), parts, self.window_s, self.capacity, self.service_gpu_s)
        owned.extend(self.owned)  # the service keeps its slice
        cap = Capacity(round(sum(self.nodes[j].gpus for j in owned) / self.capacity, 6), tuple(owned),
                       sum(self.nodes[j].gpus for j in owned), merged.alloc_gpu_s, stranded_gpu_s=merged.stranded_gpu_s) if met else None
        return PolicyResult("static-sized", merged, tuple(node.tolist()), cap, inference=self.queue(merged))
