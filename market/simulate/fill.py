"""The fill experiment of FGD (Weng et al., USENIX ATC'23), issue 38: how much of a cluster a
placement policy can allocate before fragmentation stops it.

Pods of a pod list are placed one by one in arrival order, none ever leaving, until the first
pod that no node can take; the list is taken again from its start (the same order) until
then, as FGD inflates its workload. At that moment:

- ``allocated``: the share of the cluster's GPU capacity held (a pod of ``gpu_milli`` < 1000
  holds that share of one GPU; a whole-GPU pod its GPUs);
- ``stranded``: the share left free, which the next pod could not use (unallocated GPUs:
  1 - ``allocated``);
- ``fragmented``: the share the pod list's demand could not use (``market.packing``'s
  expected fragments over every node), the finer view.

And as FGD itself measures (its workload inflation): the list submitted again and again, a
pod that no node can take skipped rather than stopping, until the GPU requests submitted
reach ``INFLATE`` (130%) of the capacity; ``inflated_stranded`` is the share left free then,
``inflated_skipped`` the pods skipped. A policy that keeps big holes whole for the big pods
can fail on one early and still leave less stranded in the end.

A pod holds ``gpus`` whole GPUs, or a ``gpu_milli`` share of one GPU (MIG slice or
time-share; the trace's shared-GPU pods), and its ``cpu_milli`` of its node's CPU: a node
out of CPU strands its free GPUs, as FGD measures (memory is not counted: the pod list's
is not kept). The policies:

- ``first-fit``: the first node (in the cluster's order) that can take it; a share on the
  first GPU with room;
- ``best-fit``: the node with the least room left that can take it; a share on the GPU with
  the least room that is enough;
- ``fgd``: the node and GPU where the demand's fragmentation grows least
  (``packing.best_placement``; the demand is the pod list's shapes);
- ``fgd-sized``: the same with each pod of the demand weighing the square root of the GPUs
  it asks (``SIZED``; FGD weighs each pod alike), so that the rare 8-GPU pods count for
  more than their number: FGD breaks whole 8-GPU nodes, and the first 8-GPU pod then
  finds none;
- ``gridbid``: the market's engine (``market.engine.clear_round``) with the pod as the one
  bid, and the nodes that can take it as offers of the GPUs there that can, at the
  simulator's asks (``auction.asks``); the node it trades with takes the pod. A pod's
  share of one GPU is a share bid (``Bid.gpu_milli``, engine 1.16.0, ``engine.shares``) and
  each node offers its GPUs' free eighths (``Offer.shares``): the engine picks the GPU, and a
  GPU whose free share is not a whole number of eighths sells the eighths in it. It weighs price, reliability and region, not what the placement leaves:
  a lone bid's offers differ by price alone, so each bucket's cheapest node stands for it.
- ``gridbid-pack``: the same with the engine's packing on (``RoundConfig.pack_band``,
  ``auction.PACK_BAND``), shown each bucket's nodes within the band of its cheapest. A lone
  bid pays the bottom of its clearing interval, its offer's own ask, and packing may only
  move it to an offer whose ask is at most what it pays: it has room only among equal asks.

Nodes in the same state (model, free share per GPU) are alike to every policy, so each step
looks at the distinct states, not at every node: the cluster's 1,213 nodes are a few dozen.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from market import engine, packing
from market.packing import MILLI, Shape

from . import auction
from .sim import (
    SIZED,  # fgd-sized: each pod of the demand weighs (its GPUs) ** SIZED (packing.Demand.of)
)
from .trace import Node, Pod

FILL_POLICIES = ("first-fit", "best-fit", "fgd", "fgd-sized", "gridbid", "gridbid-pack")
WEIGHTS = dataclasses.replace(engine.DEFAULT_WEIGHTS, carbon_per_kg=0.0)  # gridbid's, as the simulator's market bids
PACK_SHOWN = 64  # gridbid-pack: the most nodes of one bucket shown to the engine, cheapest first
INFLATE = 1.3  # FGD inflates its workload to 130% of the cluster's capacity
MAX_PLACEMENTS = 1_000_000  # bound: a pod list that never fails (an empty cluster aside) stops here


@dataclass(frozen=True)
class FillResult:
    policy: str
    placed: int  # pods placed before the first that no node could take
    allocated: float  # share of the GPU capacity held then
    stranded: float  # share left free then
    fragmented: float  # share the pod list's demand could not use then (packing.Fragmentation)
    failed_pod: str | None  # the pod that found no node (None: MAX_PLACEMENTS reached)
    seconds: float
    # FGD's own way (its workload inflation): the list submitted again and again, a pod no node
    # can take skipped, until the requests submitted reach INFLATE x the capacity
    inflated_stranded: float = 0.0  # the share left free then
    inflated_skipped: int = 0  # the pods skipped on the way


def shape_of(p: Pod) -> Shape:
    """A pod's shape: its whole GPUs, or its share of one GPU, and its CPU."""
    return Shape(p.gpus, p.gpu_milli if p.gpus == 1 and 0 < p.gpu_milli < MILLI else MILLI, p.models, p.cpu_milli)


def _share_gpu(free: np.ndarray, need: int, best: bool) -> int:
    ok = np.flatnonzero(free >= need)
    return int(ok[np.argmin(free[ok])]) if best else int(ok[0])


State = tuple[str, tuple[int, ...], int]  # model, free share per GPU, CPU left


class Cluster:
    """The nodes' free GPU shares and CPU, grouped by state -> node indices."""

    def __init__(self, nodes: Sequence[Node]) -> None:
        self.nodes = nodes
        self.free = [np.full(n.gpus, MILLI, dtype=np.int64) for n in nodes]
        self.cpu = [n.cpu_milli for n in nodes]
        self.groups: dict[State, list[int]] = {}
        for j in range(len(nodes)):
            self.groups.setdefault(self.state(j), []).append(j)
        self.capacity = sum(n.gpus for n in nodes) * MILLI

    def state(self, j: int) -> State:
        return (self.nodes[j].model, tuple(self.free[j].tolist()), self.cpu[j])

    def candidates(self, s: Shape) -> list[tuple[State, int]]:
        """Each state that can take ``s``, with its first node."""
        out = []
        for key, js in self.groups.items():
            model, free, cpu = key
            if js and (not s.models or model in s.models) and packing.fits(np.asarray(free, dtype=np.int64), s, cpu):
                out.append((key, min(js)))
        return out

    def place(self, j: int, s: Shape, gpu: int | None) -> None:
        key = self.state(j)
        self.groups[key].remove(j)
        if not self.groups[key]:
            del self.groups[key]
        self.free[j] = packing.take(self.free[j], s, gpu)
        self.cpu[j] -= s.cpu_milli
        self.groups.setdefault(self.state(j), []).append(j)

    def held(self) -> int:
        return self.capacity - sum(int(f.sum()) for f in self.free)


Chooser = Callable[[Cluster, Shape], tuple[int, int | None] | None]


def first_fit(c: Cluster, s: Shape) -> tuple[int, int | None] | None:
    got = c.candidates(s)
    if not got:
        return None
    j = min(j for _, j in got)
    return j, None if s.milli >= MILLI else _share_gpu(c.free[j], s.milli, best=False)


def best_fit(c: Cluster, s: Shape) -> tuple[int, int | None] | None:
    got = c.candidates(s)
    if not got:
        return None
    _, j = min(((sum(key[1]), j) for key, j in got))
    return j, None if s.milli >= MILLI else _share_gpu(c.free[j], s.milli, best=True)


def fgd(frag: packing.Fragmentation) -> Chooser:
    def choose(c: Cluster, s: Shape) -> tuple[int, int | None] | None:
        got = sorted(c.candidates(s), key=lambda g: g[1])  # ties fall to the first node, as best_placement's to the first machine
        if not got:
            return None
        machines = [np.asarray(key[1], dtype=np.int64) for key, _ in got]
        pick = packing.best_placement(frag, machines, [key[0] for key, _ in got], s, cpus=[key[2] for key, _ in got])
        if pick is None:
            return None
        k, gpu = pick
        return got[k][1], gpu

    return choose


def gridbid(nodes: Sequence[Node], seed: int, band: int = 0) -> Chooser:
    """The engine as the one bid's market: each node that can take the pod offers the GPUs
    there that can, at its ask; the pod's limit is well above every ask (it must place).
    With ``band`` (gridbid-pack), the engine packs (``RoundConfig.pack_band``) and is shown
    every node of a bucket within the band of its cheapest, its choices."""
    asks = auction.asks(nodes, seed)
    mkt = auction.Market([], nodes, asks, [])

    def choose(c: Cluster, s: Shape) -> tuple[int, int | None] | None:
        got = c.candidates(s)
        if not got:
            return None
        # the engine scores a lone bid's offers by price (one reliability, no region preferred, carbon
        # off): per bucket (model x region) the cheapest node that can take it is the one it could pick
        by_bucket: dict[tuple[str, str], list[tuple[int, int, int]]] = {}
        share = s.milli < MILLI
        if share:  # the engine sells a GPU's free eighths: a node shows only where some GPU has enough of them
            need = engine.shares.units(s.milli) * engine.shares.UNIT_MILLI
            got = [(key, j) for key, j in got if max(key[1]) >= need]
        for key, _ in got:
            room = int((np.asarray(key[1]) >= MILLI).sum())
            for j in c.groups[key]:
                by_bucket.setdefault((nodes[j].model, nodes[j].region), []).append((asks[j], j, room))
        shown = []
        for opts in by_bucket.values():
            opts.sort()
            shown += [x for x in opts if x[0] <= opts[0][0] + band][:PACK_SHOWN] if band else opts[:1]
        # a share is sold from a node's GPUs in eighths (engine.shares): each GPU's free eighths
        offers = [engine.Offer(id=j + 1, provider_id=j // 8 + 1, machine_id=j + 1, region=nodes[j].region,
                               gpu_model=nodes[j].model, gpus=len(c.free[j]) if share else room,
                               shares=tuple(int(f) // engine.shares.UNIT_MILLI for f in c.free[j]) if share else (), ask=ask, min_duration_s=0,
                               max_duration_s=engine.limits.MAX_DURATION_S, available_from=0, available_until=None,
                               spot_allowed=True, reserved_only=False, reliability=auction.RELIABILITY,
                               created_at=auction.EPOCH, spot_only=False) for ask, j, room in sorted(shown, key=lambda x: x[1])]
        offers = [o for o in offers if o.gpus and (not o.shares or sum(o.shares))]
        bid = engine.Bid(id=1, buyer_id=1, gpus=s.gpus, gpu_milli=s.milli, gpu_models=s.models, min_memory_gib=0, min_compute_units=0.0, vendor=None,
                         same_machine=True, allowed_regions=(), preferred_regions=(), location_region=None, max_latency_ms=None,
                         max_price=max(asks) * 2, duration_s=3600, deadline=None, klass="on_demand", min_reliability=0.0,
                         weights=WEIGHTS, created_at=auction.EPOCH)
        res = engine.clear_round(engine.RoundInput(now=auction.EPOCH, offers=tuple(offers), bids=(bid,), gpu_models=mkt.models,
                                                   regions=mkt.regions, latency_ms=mkt.latency, running=(),
                                                   config=engine.RoundConfig(pack_band=band)))
        if not res.trades:
            return None
        t = res.trades[0]
        return t.offer_id - 1, t.gpu_index

    return choose


def run_fill(pods: Sequence[Pod], nodes: Sequence[Node], policy: str, seed: int = 0) -> FillResult:
    """Place ``pods`` (in arrival order, the list again from its start until the first
    failure) on an empty ``nodes`` by ``policy``."""
    if not pods or not nodes:
        raise ValueError("the fill experiment needs pods and nodes")
    shapes = [shape_of(p) for p in pods]
    frag = packing.Fragmentation(packing.Demand.of(shapes))
    choose: Chooser
    if policy == "first-fit":
        choose = first_fit
    elif policy == "best-fit":
        choose = best_fit
    elif policy == "fgd":
        choose = fgd(frag)
    elif policy == "fgd-sized":
        choose = fgd(packing.Fragmentation(packing.Demand.of(shapes, SIZED)))
    elif policy == "gridbid":
        choose = gridbid(nodes, seed)
    elif policy == "gridbid-pack":
        choose = gridbid(nodes, seed, auction.PACK_BAND)
    else:
        raise ValueError(f"unknown fill policy {policy!r}: choose from {', '.join(FILL_POLICIES)}")
    began = time.perf_counter()
    c = Cluster(nodes)
    placed, failed = 0, None
    while placed < MAX_PLACEMENTS:
        i = placed % len(pods)
        got = choose(c, shapes[i])
        if got is None:
            failed = pods[i].id
            break
        c.place(got[0], shapes[i], got[1])
        placed += 1
    held = c.held()
    lost = sum(frag.expected(f, n.model, cpu) for f, n, cpu in zip(c.free, nodes, c.cpu, strict=True)) * MILLI
    inflated = Cluster(nodes)
    submitted, skipped, k = 0, 0, 0
    while submitted < INFLATE * inflated.capacity and k < MAX_PLACEMENTS:
        s = shapes[k % len(pods)]
        k += 1
        submitted += s.gpus * min(s.milli, MILLI)
        got = choose(inflated, s)
        if got is None:
            skipped += 1
        else:
            inflated.place(got[0], s, got[1])
    return FillResult(policy, placed, round(held / c.capacity, 6), round(1 - held / c.capacity, 6),
                      round(lost / c.capacity, 6), failed, round(time.perf_counter() - began, 3),
                      round(1 - inflated.held() / inflated.capacity, 6), skipped)
