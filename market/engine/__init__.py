"""GridBid's matching engine: a pure function from a round's orders to trades.

No Django, Celery or web3 here, and no clock: the caller passes the time in.
``clear_round`` validates its input, then clears it deterministically.
"""

from . import limits, shares
from .clear import clear_round
from .types import (
    CLASSES,
    DEFAULT_WEIGHTS,
    PRICING_RULES,
    STAGES,
    Bid,
    BucketPrice,
    EngineInputError,
    GpuModel,
    Offer,
    Preemption,
    Region,
    RoundConfig,
    RoundInput,
    RoundResult,
    RoundStats,
    RunningJob,
    SetAside,
    Stopwatch,
    Trade,
    Unmatched,
    Weights,
)
from .validate import screen

ENGINE_VERSION = "1.17.0"  # 1.17.0 (issue 39): a round of more than parts.SPLIT_PAIRS bid x offer pairs that splits into sub-markets no bid spans (sets of GPU models) clears each on its own, by the large-round path (dives at any size, no small-class branch and bound), in a process pool with clear_round(workers=N), and joins them in a whole round's order: the same bytes whatever N (parts.py); 1.16.0 (issue 38): a bid may ask for a share of one GPU (Bid.gpu_milli, taken in eighths rounded up) from an offer that sells its GPUs in parts (Offer.shares, the eighths free per GPU); shares clear as a market of their own per model (M/8), one offer per GPU, and the trade says which GPU and how much (Trade.gpu_index, Trade.gpu_milli) at a price per whole GPU-hour (shares.py); 1.15.0 1.15.0 (issue 38): a bid may need NVLink (Bid.needs_nvlink): it takes an offer only where its GPUs fit in one NVLink domain of the machine (Offer.nvlink_gpus, the most free in one), and is told the largest where none does; 1.14.0 (issue 38): with RoundConfig.pack_band, once a round is cleared and priced a trade placed whole may move to another offer of its bucket that leaves the bucket less fragmented for the book's demand (pack.py, FGD's measure), when its value is within the band and the offer's ask within the price its buyer pays, which does not change; the trade and the statistics say so; 1.13.0 (issue 37): a region may carry an hourly carbon forecast (Region.carbon_hourly) and a bid its predicted median run time (Bid.runtime_p50_s); a bid's carbon is priced at the mean intensity over the hours its job is expected to run (market.carbon_means), not the region's one figure; 1.12.0 (issue 36, backfill): a spot bid may carry its predicted p90 run time (Bid.runtime_p90_s); it may then take an offer whose window closes after that p90 but before its duration is up, and the trade says so (Trade.backfill_until and its reason); 1.11.0 (issue 35): pairs of equal score are ordered per bid by a fixed hash of the bid's and the offer's ids (market.tie_key), not by the offer alone; in rounds whose lists are pruned a class's LP starts from the pairs the greedy with its refills would place too (assign.Solver._seed), and a class too big for its LP keeps that placement; column generation over pairs stalls on the gap between the best bound and the LP; the dive's LP solves in units of a power of two (bound.objective_scale); the class LP stops at LP_WORK_LIMIT simplex iterations or LP_MAX_FILLS placements of multi-machine jobs, and a started MILP at its first improvement; 1.10.0 (issue 29): the LP path's fractional single-machine rest is picked by an LP dive above 5,000 pairs (bound.dive_pick; the MILP, started from the dive, only where the dive is not within 0.5% of its LP bound), and its MILP stops at a proven gap of 0.1%, not 1e-6; 1.9.0 (issue 31, tides): an offer may be lent (Offer.spot_only): it sells to spot bids only, and a bid of a higher class is told why; 1.8.0 (issue 31): spot is priced apart from the classes above it (its own trades and losers set its price; BucketPrice.spot_price); a round sees offers whose GPUs spot jobs fill (RoundInput.occupied) and preempts, for a waiting reserved or on-demand bid, the fewest spot GPUs that make room, counting jobs already stopping (RunningJob.stopping), and the bid is told; 1.7.0 (issue 32): an offer carries its machine's host (CUDA version, RAM, free disk, download bandwidth) and a bid may ask for a least of each; a pair short of one is not feasible, and the explanation names what fell short; 1.6.0 (issue 32): an offer says whether its machine runs container images and publishes ports, a bid whether its job needs them, and a pair that does not fit is not feasible (its explanation says why); 1.5.0 (issue 29): a round is small by its feasible pairs (up to 50,000), not bids x offers; in a small round too big for one model, each class that fits is a MIP of its own on what the classes above left; every MIP of the LP path stops at a count of HiGHS checkpoints; 1.4.0 (issue 29): small rounds clear by a lexicographic MIP over all three classes (exact.py), spanning bids and fair share included, each class started from the heuristic, under a node and checkpoint limit, with HiGHS's bound padded for its tolerances; a tie among equal surpluses goes to the bid first in priority order; 1.3.0 (issue 29): a class whose branch and bound runs out of nodes is bounded and rounded from the capacity it started with; a round whose scores could pass 2**60 counts them in a coarser unit instead of overflowing int64; only a losing bid that could have traded on a bucket's offers moves its uniform price; a region is 0 ms from itself without a latency row, explanations of bids past their deadline or without a known latency; 1.2.2: explanations write prices in USDC/GPU-h; 1.2.1: rows written as columns need them, MILPs without presolve (other optimal vertices); 1.2: multi-machine bids as whole fills in the LP; 1.1: uniform price at the bottom of the interval

__all__ = [
    "CLASSES",
    "DEFAULT_WEIGHTS",
    "ENGINE_VERSION",
    "PRICING_RULES",
    "Bid",
    "BucketPrice",
    "EngineInputError",
    "GpuModel",
    "Offer",
    "Preemption",
    "Region",
    "RoundConfig",
    "RoundInput",
    "RoundResult",
    "RoundStats",
    "RunningJob",
    "STAGES",
    "SetAside",
    "Stopwatch",
    "Trade",
    "Unmatched",
    "Weights",
    "clear_round",
    "limits",
    "screen",
    "shares",
]
