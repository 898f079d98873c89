"""The engine's vocabulary: input and output dataclasses and its one error.

Money is integer token base units (a 6-decimal stablecoin: 2_000_000 = 2.00
USD); prices are per GPU-hour. Times are unix seconds, passed in by the
caller: nothing in the engine reads the clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

CLASSES: tuple[str, ...] = ("reserved", "on_demand", "spot")
"""Priority classes, highest first."""

PRICING_RULES: tuple[str, ...] = ("uniform", "pay_as_ask")

Klass = Literal["reserved", "on_demand", "spot"]


# A round's stages, in the order each first ends: "<class> bound" is that class's LP (or
# Lagrangian) bound, column generation included, and "<class>" the rest of its work.
STAGES = (
    "validate", "market", "candidates",
    "reserved", "reserved bound", "on_demand", "on_demand bound", "spot", "spot bound",
    "pricing", "packing", "trades", "explain",
)


class Stopwatch(Protocol):
    """What ``clear_round`` tells the caller's stopwatch, if it is given one: at
    the end of each stage, ``lap(stage)`` with a name from ``STAGES`` (a stage
    may come back: its laps add up). The engine never reads the clock; the
    caller's stopwatch does (``market.stopwatch.StageTimes``)."""

    def lap(self, stage: str) -> None: ...


def no_lap(stage: str) -> None:
    """The lap of no stopwatch: the stages go untimed."""


class EngineInputError(ValueError):
    """A round input the engine refuses; ``field`` names the offending value."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class SetAside:
    """An order the engine could not take, kept out of the round; ``field`` is relative to the
    order (``max_price``, ``weights.reliability``) and ``message`` says what is wrong with it."""

    kind: str  # "bid", "offer" or "running"
    id: int | None
    field: str
    message: str


@dataclass(frozen=True, slots=True)
class GpuModel:
    id: str
    vendor: str
    memory_gib: int
    compute_units: float
    tdp_watts: int


@dataclass(frozen=True, slots=True)
class Region:
    id: str
    carbon_g_per_kwh: float
    # issue 37: the grid's intensity hour by hour from the hour that holds ``RoundInput.now``
    # (a forecast, g/kWh; past its end, its last hour); empty: ``carbon_g_per_kwh`` throughout.
    # A bid's carbon is priced at the mean over the hours its job is expected to run
    # (``Market.b_carb``).
    carbon_hourly: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Offer:
    """One machine's free GPUs of one model at one ask (per GPU-hour)."""

    id: int
    provider_id: int
    machine_id: int
    region: str
    gpu_model: str
    gpus: int
    ask: int
    min_duration_s: int
    max_duration_s: int
    available_from: int
    available_until: int | None
    spot_allowed: bool
    reserved_only: bool
    reliability: float
    created_at: int
    # what the machine's agent can run (issue 32): container images (a docker or podman
    # runtime), and jobs that publish ports or SSH (a container runtime and a public host)
    containers: bool = True
    ports: bool = True
    # lent by an owner who takes it back when it needs it (issue 31, tides): sold to spot
    # bids only, whose jobs it preempts when it does
    spot_only: bool = False
    # the machine's host as its agent reports it (issue 32); 0 = not reported, which meets no
    # bid's minimum: the CUDA version its driver supports (major x 100 + minor: 12.4 is
    # 1204), RAM, free disk for jobs, and measured download bandwidth
    cuda: int = 0
    ram_gib: int = 0
    disk_gb: int = 0
    net_down_mbps: int = 0
    # issue 38: the most of its free GPUs inside one NVLink domain of its machine (0: none
    # linked); a bid that needs NVLink takes an offer only where its GPUs fit in one
    nvlink_gpus: int = 0
    # issue 38: where not empty, it sells parts of its GPUs (MIG slices or time-shares), not
    # whole ones: for each of its ``gpus`` GPUs the eighths of it free, 0 to 8 (``shares.py``)
    shares: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Weights:
    """A buyer's scoring weights, in token base units.

    ``latency_per_ms``, ``non_preferred_region`` and ``reliability`` are per
    GPU-hour, so they compare directly with prices: a latency weight of 1,000
    makes 100 ms cost the buyer 0.10 USD per GPU-hour. ``carbon_per_kg`` is per
    kilogram of CO2 the whole job is estimated to emit. The reliability term
    is a bonus: weight x the provider's reliability (0..1) per GPU-hour.
    """

    latency_per_ms: float
    non_preferred_region: float
    carbon_per_kg: float
    reliability: float


DEFAULT_WEIGHTS = Weights(
    latency_per_ms=1_000.0,  # 0.001 USD per ms per GPU-hour
    non_preferred_region=100_000.0,  # 0.10 USD per GPU-hour
    carbon_per_kg=50_000.0,  # 0.05 USD per kg, about 50 USD a tonne
    reliability=200_000.0,  # up to 0.20 USD per GPU-hour for a perfect record
)


@dataclass(frozen=True, slots=True)
class Bid:
    id: int
    buyer_id: int
    gpus: int
    gpu_models: tuple[str, ...]
    min_memory_gib: int
    min_compute_units: float
    vendor: str | None
    same_machine: bool
    allowed_regions: tuple[str, ...]
    preferred_regions: tuple[str, ...]
    location_region: str | None
    max_latency_ms: float | None
    max_price: int
    duration_s: int
    deadline: int | None
    klass: str
    min_reliability: float
    weights: Weights
    created_at: int
    # what the job needs of the machine (issue 32): a container runtime (an image and no
    # command), and published ports or SSH (``Offer.containers``, ``Offer.ports``)
    needs_containers: bool = False
    needs_ports: bool = False
    # the least host the job needs (issue 32), in ``Offer``'s units; 0 = no minimum
    min_cuda: int = 0
    min_ram_gib: int = 0
    min_disk_gb: int = 0
    min_net_down_mbps: int = 0
    # issue 36, backfill: the run time its job finishes within 9 times in 10 (the market's
    # runtime predictor), or None. A spot bid with one may take an offer whose window closes
    # before its duration is up but after this (``Market.b_span``); past the window its
    # job is preempted, checkpoint first, like any spot job.
    runtime_p90_s: int | None = None
    # issue 37: the median run time the same prediction gives: the span its carbon is priced
    # over (its duration without one)
    runtime_p50_s: int | None = None
    # issue 38: its GPUs must share one NVLink domain (``Offer.nvlink_gpus``); implies same_machine
    needs_nvlink: bool = False
    # issue 38: below 1000 (with ``gpus`` 1), a share of one GPU in thousandths, taken in eighths
    # rounded up from an offer that sells shares (``Offer.shares``, ``shares.py``)
    gpu_milli: int = 1000


@dataclass(frozen=True, slots=True)
class RunningJob:
    """Work already placed by an earlier round: spot jobs a higher class's bid may preempt."""

    trade_id: int
    offer_id: int
    machine_id: int
    gpus: int
    klass: str
    price: int
    # told to stop already (by an earlier round, or its buyer): its GPUs are on their way back,
    # so a bid they would serve needs no other job preempted
    stopping: bool = False


@dataclass(frozen=True, slots=True)
class RoundConfig:
    """How a round clears.

    ``fair_share_cap`` is the largest fraction of a scarce bucket's GPUs (a
    bucket is GPU model x region; scarce when the GPUs bid for it exceed the
    GPUs offered) that one buyer may take in one round; 1.0 switches it off.
    ``max_candidates`` is how many best offers each bid keeps in larger
    rounds (0 = 16); ``group_scan`` is kept for stored configs and no longer
    used. The upper bound in the statistics always covers every feasible
    pair, kept or pruned. ``exact_node_limit`` is the exact path's work limit
    (``exact.py``): HiGHS branch-and-bound nodes per class of a small round's
    lexicographic MIP (0 switches the exact path off), counted, never timed, so a
    replay clears the same; larger rounds' classes of at most 40 same-machine
    bids get a branch and bound of ``clear.BNB_NODES`` unless it is 0.
    ``certify`` is kept for stored
    configs: the bound is now always certified per class (LP relaxation with
    column generation over every feasible pair).
    ``price_point`` is where in the clearing interval the uniform price sits:
    0 (the default) is its bottom, the lowest price that clears the bucket, so
    buyers pay the least any rule allows and providers at least their ask;
    0.5 splits the marginal surplus evenly (a k = 1/2 double auction).
    ``pack_band`` (issue 38, ``pack.py``): base units per GPU-hour of value a trade may give
    up to move to another offer of its bucket that leaves the bucket less fragmented for the
    book's demand; 0 (the default) packs nothing. The buyer pays the same: the bucket's price.
    """

    pricing: str = "uniform"
    fair_share_cap: float = 1.0
    price_point: float = 0.0
    max_candidates: int = 16
    group_scan: int = 48
    exact_node_limit: int = 200
    certify: bool = False
    pack_band: int = 0


@dataclass(frozen=True, slots=True)
class RoundInput:
    now: int
    offers: tuple[Offer, ...]
    bids: tuple[Bid, ...]
    gpu_models: tuple[GpuModel, ...]
    regions: tuple[Region, ...]
    latency_ms: tuple[tuple[str, str, float], ...]
    running: tuple[RunningJob, ...] = ()
    config: RoundConfig = field(default_factory=RoundConfig)
    # open offers with no GPU free whose GPUs spot jobs hold: never cleared (nothing is free
    # on them), only looked at for what preempting those jobs would free. ``gpus`` is the
    # GPUs the spot jobs hold.
    occupied: tuple[Offer, ...] = ()


@dataclass(frozen=True, slots=True)
class Trade:
    bid_id: int
    offer_id: int
    machine_id: int
    provider_id: int
    buyer_id: int
    gpu_model: str
    region: str
    gpus: int
    price: int
    duration_s: int
    amount: int
    reason: str
    score: int = 0
    # backfilled (issue 36): the offer's window closes then, before the duration bought is
    # up; the job is preempted at that time if it is still running. None: it fits the window
    backfill_until: int | None = None
    # issue 38: a share of one GPU (``gpus`` 1): the thousandths it holds, in eighths (375 = 3/8);
    # ``price`` is still per whole GPU-hour and ``amount`` what the share costs; ``gpu_index``
    # the GPU of the offer it is a share of (its place in ``Offer.shares``), None for whole GPUs
    gpu_milli: int = 1000
    gpu_index: int | None = None


@dataclass(frozen=True, slots=True)
class BucketPrice:
    gpu_model: str
    region: str
    price: int | None
    volume_gpus: int
    volume_gpu_hours: float
    trades: int
    best_ask: int | None
    best_bid: int | None
    spot_price: int | None = None  # spot is priced apart (pricing.py); None: no spot trade


@dataclass(frozen=True, slots=True)
class Unmatched:
    bid_id: int
    reasons: tuple[str, ...]
    nearest: str | None


@dataclass(frozen=True, slots=True)
class Preemption:
    trade_id: int
    for_bid_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class RoundStats:
    bids: int
    offers: int
    matched_bids: int
    trades: int
    matched_gpus: int
    offered_gpus: int
    feasible_pairs: int
    candidate_pairs: int
    surplus: int
    method: str
    upper_bound: int | None
    gap: float | None
    bound_scope: str = "none"


@dataclass(frozen=True, slots=True)
class RoundResult:
    trades: tuple[Trade, ...]
    prices: tuple[BucketPrice, ...]
    unmatched: tuple[Unmatched, ...]
    preemptions: tuple[Preemption, ...]
    stats: RoundStats
