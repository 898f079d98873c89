"""The largest values an order may carry: the one table that the engine's validation,
the REST API, the web forms and the WebSocket stream all read.

Before this table the API took prices and weights up to 10**15 while the engine refused
anything over 10**12, so one accepted bid failed every round for everyone. Whatever the
API accepts must clear; a test places a bid and an offer at every API maximum and checks
that the engine takes them.
"""

from __future__ import annotations

MAX_PRICE = 10**12  # token base units per GPU-hour: a million USD an hour is a typo
MAX_GPUS = 1_000_000
MAX_DURATION_S = 10 * 365 * 86_400
MAX_WEIGHT = 1e12  # a score weight in base units per unit (ms, kg, region miss, reliability)
MAX_MEMORY_GIB = 100_000
MAX_COMPUTE_UNITS = 1e9
MAX_LATENCY_MS = 1e6
MAX_CUDA = 99_99  # CUDA 99.99, as major x 100 + minor
MAX_CARBON_HOURS = 24 * 14  # the longest hourly carbon forecast a region may carry (Region.carbon_hourly)
MAX_HOST = 10**9  # GiB of RAM, GB of disk, Mbit/s: far past any machine

# what a person may order through the API: tighter than what the engine can take
ORDER_MAX_DURATION_S = 365 * 86_400
ORDER_MAX_BID_GPUS = 1024
ORDER_MAX_OFFER_GPUS = 64

assert ORDER_MAX_DURATION_S <= MAX_DURATION_S and ORDER_MAX_BID_GPUS <= MAX_GPUS
