"""The GPU-model and region catalogues, shipped as data.

Pure Python with no Django import: the server, the provider agent and the
benchmarks all read the same catalogue from here.

Compute units (CU) are GridBid's normalised performance figure, in the spirit
of Vast.ai's DLPerf: a blend of dense BF16 tensor throughput (60%) and memory
bandwidth (40%), both relative to an A100 SXM 80GB, which scores 100. Deep
learning work is bound by one or the other, so neither figure alone ranks
cards the way users experience them (an RTX 4090 has half an A100's FLOPS but
also half its bandwidth; an H200 has the H100's FLOPS with 43% more bandwidth).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

REFERENCE_TFLOPS = 312.0  # A100 SXM 80GB, dense BF16
REFERENCE_BANDWIDTH_TBS = 2.039
FLOPS_WEIGHT = 0.6


@dataclass(frozen=True, slots=True)
class GpuSpec:
    id: str
    vendor: str
    name: str
    memory_gib: int
    bf16_tflops: float
    memory_bandwidth_tbs: float
    tdp_watts: int
    compute_capability: str
    usd_per_hour: float
    aliases: tuple[str, ...]

    @property
    def compute_units(self) -> float:
        score = FLOPS_WEIGHT * self.bf16_tflops / REFERENCE_TFLOPS + (
            1 - FLOPS_WEIGHT
        ) * self.memory_bandwidth_tbs / REFERENCE_BANDWIDTH_TBS
        return round(100 * score, 1)


@dataclass(frozen=True, slots=True)
class RegionSpec:
    id: str
    name: str
    country: str
    lat: float
    lon: float
    carbon_g_per_kwh: float


def _read(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files("providers").joinpath("data", name).read_text())
    return data


@cache
def gpu_models() -> dict[str, GpuSpec]:
    out: dict[str, GpuSpec] = {}
    for row in _read("gpu_models.json")["models"]:
        row = dict(row, aliases=tuple(row["aliases"]))
        out[row["id"]] = GpuSpec(**row)
    return out


@cache
def regions() -> dict[str, RegionSpec]:
    return {row["id"]: RegionSpec(**row) for row in _read("regions.json")["regions"]}


EARTH_RADIUS_KM = 6371.0
# Light in fibre covers ~200 km per ms one way; real routes are ~1.5x the
# great circle. A round trip therefore costs ~1.5 ms per 100 km, plus a few ms
# of last-mile and switching.
RTT_MS_PER_100KM = 1.5
RTT_BASE_MS = 2.0


def distance_km(a: RegionSpec, b: RegionSpec) -> float:
    p1, p2 = math.radians(a.lat), math.radians(b.lat)
    dp, dl = p2 - p1, math.radians(b.lon - a.lon)
    h = math.sin(dp / 2) ** 2 + math.cos(p1) * math.cos(p2) * math.sin(dl / 2) ** 2
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def estimated_rtt_ms(a: RegionSpec, b: RegionSpec) -> float:
    """Round-trip latency estimate between two regions, from their coordinates."""
    if a.id == b.id:
        return 1.0
    return round(RTT_BASE_MS + distance_km(a, b) * RTT_MS_PER_100KM / 100, 1)


@cache
def latency_matrix() -> dict[tuple[str, str], float]:
    regs = regions()
    return {(a, b): estimated_rtt_ms(regs[a], regs[b]) for a in regs for b in regs}


_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "amd", "instinct", "radeon", "google", "huawei"}


def normalise_gpu_name(name: str) -> str:
    """Lower-case, split on anything not alphanumeric, drop vendor words."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    # "80GB" and "80 GB" read the same; "HBM3"/"HBM3e" carry no model identity
    joined = " ".join(w for w in words if w not in _VENDOR_WORDS)
    joined = re.sub(r"\b(\d+)\s+gb\b", r"\1gb", joined)
    joined = re.sub(r"\bhbm\w*\b", "", joined)
    return " ".join(joined.split())


@dataclass(frozen=True, slots=True)
class GpuMatch:
    model: GpuSpec | None
    exact: bool
    message: str


def match_gpu_name(name: str, memory_mib: int | None = None) -> GpuMatch:
    """Map a driver-reported GPU name to a catalogue model.

    Exact alias match first; otherwise the catalogue model whose normalised
    name shares the most words with the reported one, with the reported
    memory size breaking ties (an "A100" with 81,920 MiB is the 80 GB card).
    """
    models = gpu_models()
    norm = normalise_gpu_name(name)
    if not norm:
        return GpuMatch(None, False, f"GPU name {name!r} is empty after normalising")
    mem_gib = memory_mib / 1024 if memory_mib else None
    for spec in models.values():
        candidates = {normalise_gpu_name(a) for a in spec.aliases}
        candidates.add(normalise_gpu_name(spec.name))
        candidates.add(normalise_gpu_name(spec.id))
        if norm in candidates and _memory_fits(spec, mem_gib):
            return GpuMatch(spec, True, f"GPU {name!r} is catalogue model {spec.id}")
    words = set(norm.split())
    best: tuple[float, str] | None = None
    for spec in models.values():
        ident = set(normalise_gpu_name(spec.name).split()) | {
            w for a in spec.aliases for w in normalise_gpu_name(a).split()
        }
        # the model token (h100, a100, 4090, mi300x...) must be shared
        key_tokens = {w for w in ident if re.search(r"\d", w) and not w.endswith("gb")}
        if not key_tokens & words:
            continue
        score = len(words & ident) / len(words | ident)
        if mem_gib is not None:
            score += 1.0 if _memory_fits(spec, mem_gib) else -1.0
        if best is None or (score, spec.id) > best:
            best = (score, spec.id)
    if best is None or best[0] <= 0:
        return GpuMatch(
            None,
            False,
            f"GPU {name!r} matches no catalogue model; declare it with --inventory "
            "and a catalogue model id (see `gridbid-agent detect --list-models`)",
        )
    spec = models[best[1]]
    return GpuMatch(spec, False, f"GPU {name!r} matched catalogue model {spec.id}")


def _memory_fits(spec: GpuSpec, mem_gib: float | None) -> bool:
    # drivers report a little less than the marketing size (80 GB -> 79.6 GiB)
    return mem_gib is None or abs(spec.memory_gib - mem_gib) <= max(2.0, 0.08 * spec.memory_gib)


# --- CUDA versions -----------------------------------------------------------------
# kept as one whole number, major x 100 + minor (12.4 is 1204), so a database or the
# engine compares them as numbers: as text, "12.10" sorts before "12.4"
CUDA_MAX = 9999


def cuda_code(text: str) -> int:
    """'12' or '12.4' as its code (1200, 1204); a ValueError saying how to write one."""
    s = str(text).strip()
    major, _, minor = s.partition(".")
    if not (major.isascii() and major.isdigit() and len(major) <= 2 and (not minor or (minor.isascii() and minor.isdigit() and len(minor) <= 2))):
        raise ValueError(f"{text!r} is not a CUDA version: write it like 12 or 12.4")
    return int(major) * 100 + int(minor or 0)


def cuda_text(code: int) -> str:
    """A CUDA version from its code: 1204 is '12.4'."""
    return f"{code // 100}.{code % 100}"
