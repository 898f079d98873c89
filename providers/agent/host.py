"""The machine's host, as offers show it and bids may ask for it (issue 32): CPU model and
cores, RAM, free disk for jobs, CUDA driver and version and the GPUs' links (from the
inventory), the runtime jobs run in, and the bandwidth `gridbid-agent benchmark` measured.

Read from the operating system each time it is asked (a heartbeat), so the free disk stays
current; nothing here is made up: what cannot be read is left out, and the market shows it
as not reported.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path
from typing import Any

from providers.agent.inventory import Inventory


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name: /proc/cpuinfo on Linux, else what the platform says."""
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return " ".join(value.split())[:128]
    except OSError:
        pass
    return (platform.processor() or "")[:128]


def cpu_cores() -> int:
    """Logical cores this process may use (its affinity), or all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def ram_gib() -> int:
    """Physical memory, GiB (rounded)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    except (ValueError, OSError, AttributeError):
        return 0


def disk_free_gb(path: Path) -> int:
    """Free space where jobs write (their folders and outputs), GB of 10^9 bytes."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free // 10**9
    except OSError:
        return 0


def host_facts(*, home: Path, inv: Inventory, runtime: str, net_down_mbps: float | None = None,
               net_up_mbps: float | None = None) -> dict[str, Any]:
    """The heartbeat's `host`: what the market keeps of this machine's host."""
    facts: dict[str, Any] = {
        "cpu_model": cpu_model(), "cpu_cores": cpu_cores(), "ram_gib": ram_gib(), "disk_gb": disk_free_gb(home / "jobs"),
        "driver_version": inv.driver_version[:32], "cuda_version": inv.cuda_version, "runtime": runtime, "topology": dict(inv.links),
        **inv.machine,  # a declared inventory describes a machine, maybe not this one
    }
    if net_down_mbps is not None:
        facts["net_down_mbps"] = round(net_down_mbps)
    if net_up_mbps is not None:
        facts["net_up_mbps"] = round(net_up_mbps)
    return facts
