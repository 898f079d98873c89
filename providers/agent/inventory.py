"""GPU inventory: NVML, rocm-smi, or a declared inventory file, matched to the catalogue.

Detection reports what the driver says and how it was mapped to a catalogue
model, including when it could not be ("GPU 'X' matches no catalogue model").
NVML is reached only through the `pynvml` module (package nvidia-ml-py), so
tests replace that module and nothing else.

A declared inventory (JSON or TOML) describes machines without NVML, and tests:

    driver_version = "550.54.15"
    cuda_version = "12.4"
    [[gpus]]
    index = 0
    name = "NVIDIA H100 80GB HBM3"
    memory_mib = 81559
    uuid = "GPU-1b2c..."          # optional; derived from the host and index
    model = "H100-SXM-80GB"       # optional; otherwise matched by name
    [gpus.simulate]               # optional telemetry figures
    idle_utilisation = 0
    busy_utilisation = 97
    [[links]]
    a = 0
    b = 1
    kind = "nvlink"
    [machine]                     # optional: the host as declared, in place of what the
    cpu_model = "AMD EPYC 9454"   # operating system says (a machine described, not this one)
    cpu_cores = 96
    ram_gib = 512
    disk_gb = 2000
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import socket
import subprocess
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from providers import catalogue


class InventoryError(Exception):
    pass


@dataclass
class GpuInfo:
    index: int
    name: str
    memory_mib: int
    uuid: str
    vendor: str = "nvidia"
    model: str | None = None  # catalogue model id, None when unmatched
    match: str = ""  # how it was matched, for the user
    mig: str | None = None  # "enabled", "disabled", None when unsupported
    simulate: dict[str, float] = field(default_factory=dict)

    @property
    def memory_gib(self) -> int:
        return max(1, round(self.memory_mib / 1024))


@dataclass
class Inventory:
    source: str  # nvml, rocm-smi, declared, none
    gpus: list[GpuInfo]
    driver_version: str = ""
    cuda_version: str = ""
    links: dict[str, str] = field(default_factory=dict)  # "0-1" -> nvlink / pcie-switch / pcie-host / system
    machine: dict[str, Any] = field(default_factory=dict)  # declared host facts (host.DECLARABLE), over what the OS says

    def by_model(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.gpus:
            if g.model:
                out[g.model] = out.get(g.model, 0) + 1
        return out

    @property
    def interconnect(self) -> str:
        """The machine's interconnect as the market names it."""
        if len(self.gpus) < 2:
            return "none" if not self.gpus else "pcie"
        return "nvlink" if self.links and all(v == "nvlink" for v in self.links.values()) else "pcie"

    def nvlink_groups(self) -> dict[int, int]:
        """Each GPU's NVLink domain (issue 38): GPUs joined by NVLink, directly or through
        others (an NVSwitch joins all of them), share one, named by its lowest index. A GPU
        with no NVLink is in none."""
        parent = {g.index: g.index for g in self.gpus}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        linked: set[int] = set()
        for pair, kind in sorted(self.links.items()):
            if kind != "nvlink":
                continue
            a, b = (int(x) for x in pair.split("-"))
            if a in parent and b in parent:
                linked |= {a, b}
                ra, rb = root(a), root(b)
                parent[max(ra, rb)] = min(ra, rb)
        return {i: root(i) for i in sorted(linked)}

    def registration_gpus(self) -> list[dict[str, Any]]:
        """The GPUs as the market registers them, each with its NVLink domain (or none)."""
        groups = self.nvlink_groups()
        return [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_gib": g.memory_gib, "nvlink_group": groups.get(g.index)}
                for g in self.gpus]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GpuTelemetry:
    index: int
    utilisation: float  # percent
    memory_used_mib: int
    memory_total_mib: int
    temperature_c: float
    power_w: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _match(gpu: GpuInfo, declared_model: str | None = None) -> GpuInfo:
    models = catalogue.gpu_models()
    if declared_model:
        if declared_model not in models:
            raise InventoryError(f"GPU {gpu.index}: {declared_model!r} is not a catalogue model id (see `gridbid-agent detect --list-models`)")
        gpu.model = declared_model
        gpu.match = f"GPU {gpu.name!r} declared as catalogue model {declared_model}"
    else:
        m = catalogue.match_gpu_name(gpu.name, gpu.memory_mib)
        gpu.model = m.model.id if m.model else None
        gpu.match = m.message
    if gpu.model:
        gpu.vendor = models[gpu.model].vendor
    return gpu


# --- NVML ---------------------------------------------------------------------------
def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _topology_label(nvml: Any, level: int) -> str:
    names = {
        getattr(nvml, "NVML_TOPOLOGY_INTERNAL", 0): "same-board",
        getattr(nvml, "NVML_TOPOLOGY_SINGLE", 10): "pcie-switch",
        getattr(nvml, "NVML_TOPOLOGY_MULTIPLE", 20): "pcie-switch",
        getattr(nvml, "NVML_TOPOLOGY_HOSTBRIDGE", 30): "pcie-host",
        getattr(nvml, "NVML_TOPOLOGY_NODE", 40): "numa-node",
        getattr(nvml, "NVML_TOPOLOGY_SYSTEM", 50): "system",
    }
    return names.get(level, f"level-{level}")


def detect_nvml(nvml: Any = None) -> Inventory | None:
    """The NVIDIA GPUs NVML sees, or None when NVML is absent or finds no driver."""
    if nvml is None:
        try:
            import pynvml as nvml  # type: ignore[no-redef]
        except ImportError:
            return None
    try:
        nvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        try:
            cv = int(nvml.nvmlSystemGetCudaDriverVersion_v2())
            cuda = f"{cv // 1000}.{cv % 1000 // 10}"
        except Exception:
            cuda = ""
        handles, gpus, bus_ids = [], [], {}
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            handles.append(h)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            try:
                current, _pending = nvml.nvmlDeviceGetMigMode(h)
                mig: str | None = "enabled" if current else "disabled"
            except Exception:
                mig = None
            with contextlib.suppress(Exception):
                bus_ids[_text(nvml.nvmlDeviceGetPciInfo(h).busId).lower()] = i
            gpus.append(_match(GpuInfo(index=i, name=_text(nvml.nvmlDeviceGetName(h)), memory_mib=int(mem.total) // 2**20, uuid=_text(nvml.nvmlDeviceGetUUID(h)), mig=mig)))
        links: dict[str, str] = {}
        for i, hi in enumerate(handles):
            for j in range(i + 1, len(handles)):
                with contextlib.suppress(Exception):
                    links[f"{i}-{j}"] = _topology_label(nvml, int(nvml.nvmlDeviceGetTopologyCommonAncestor(hi, handles[j])))
            for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
                try:
                    if not nvml.nvmlDeviceGetNvLinkState(hi, link):
                        continue
                    peer = bus_ids.get(_text(nvml.nvmlDeviceGetNvLinkRemotePciInfo(hi, link).busId).lower())
                except Exception:
                    break  # no NVLink on this GPU, or past its last link
                if peer is not None and peer != i:
                    links[f"{min(i, peer)}-{max(i, peer)}"] = "nvlink"
        return Inventory("nvml", gpus, driver, cuda, links)
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def telemetry_nvml(nvml: Any = None) -> list[GpuTelemetry]:
    if nvml is None:
        import pynvml as nvml  # type: ignore[no-redef]
    nvml.nvmlInit()
    try:
        out = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            out.append(GpuTelemetry(
                index=i,
                utilisation=float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                memory_used_mib=int(mem.used) // 2**20,
                memory_total_mib=int(mem.total) // 2**20,
                temperature_c=float(nvml.nvmlDeviceGetTemperature(h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))),
                power_w=round(nvml.nvmlDeviceGetPowerUsage(h) / 1000, 1),
            ))
        return out
    finally:
        nvml.nvmlShutdown()


# --- AMD ---------------------------------------------------------------------------
Runner = Callable[[list[str]], str]


def _run(argv: list[str]) -> str:
    return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout


def detect_rocm(run: Runner | None = None, which: Callable[[str], str | None] = shutil.which) -> Inventory | None:
    """AMD GPUs from `rocm-smi --json`, or None when rocm-smi is absent."""
    if run is None:
        if which("rocm-smi") is None:
            return None
        run = _run
    try:
        raw = json.loads(run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showuniqueid", "--showdriverversion", "--json"]))
    except (subprocess.SubprocessError, OSError, ValueError):
        return None
    gpus = []
    driver = str(raw.get("system", {}).get("Driver version", ""))
    for key in sorted((k for k in raw if k.startswith("card")), key=lambda k: int(k[4:] or 0)):
        card = raw[key]
        name = card.get("Card Series") or card.get("Card series") or card.get("Card model") or card.get("Card SKU") or "AMD GPU"
        mem = int(card.get("VRAM Total Memory (B)", 0) or 0) // 2**20
        uuid = str(card.get("Unique ID") or f"AMD-{socket.gethostname()}-{key}")
        gpus.append(_match(GpuInfo(index=int(key[4:] or 0), name=str(name), memory_mib=mem, uuid=uuid, vendor="amd")))
    return Inventory("rocm-smi", gpus, driver, "")


# --- declared ------------------------------------------------------------------------
def load_declared(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise InventoryError(f"Cannot read inventory {p}: {exc.strerror}") from exc
    try:
        raw = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise InventoryError(f"{p} is not valid {'TOML' if p.suffix == '.toml' else 'JSON'}: {exc}") from exc
    return declared_inventory(raw, source=str(p))


def declared_inventory(raw: Any, *, source: str = "inventory") -> Inventory:
    """An inventory from a declared file's contents (docs/agent.md, "The inventory file")."""
    if not isinstance(raw, dict):
        raise InventoryError(f"{source}: the inventory must be a TOML table or a JSON object with a 'gpus' list")
    rows = raw.get("gpus")
    if not isinstance(rows, list) or not rows:
        raise InventoryError(f"{source}: 'gpus' must be a non-empty list")
    host = str(raw.get("host") or socket.gethostname())
    gpus: list[GpuInfo] = []
    for n, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("name"), str) or not row["name"].strip():
            raise InventoryError(f"{source}: gpus[{n}] needs a 'name'")
        index = row.get("index", n)
        mem = row.get("memory_mib")
        if not _whole(index) or index < 0 or (mem is not None and (not _whole(mem) or mem <= 0)):
            raise InventoryError(f"{source}: gpus[{n}] has a bad index or memory_mib")
        model = row.get("model")
        if mem is None and model in catalogue.gpu_models():
            mem = catalogue.gpu_models()[model].memory_gib * 1024
        if mem is None:
            raise InventoryError(f"{source}: gpus[{n}] needs memory_mib (or a catalogue model)")
        raw_simulate = row.get("simulate") or {}
        if not isinstance(raw_simulate, dict) or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in raw_simulate.values()):
            raise InventoryError(f"{source}: gpus[{n}].simulate must map names to numbers")
        uuid = row.get("uuid") or "GPU-" + hashlib.sha256(f"{host}/{index}".encode()).hexdigest()[:32]
        simulate = {str(k): float(v) for k, v in raw_simulate.items()}
        gpus.append(_match(GpuInfo(index=index, name=row["name"], memory_mib=mem, uuid=str(uuid), vendor=str(row.get("vendor", "nvidia")), mig=row.get("mig"), simulate=simulate), model))
    if len({g.index for g in gpus}) != len(gpus) or len({g.uuid for g in gpus}) != len(gpus):
        raise InventoryError(f"{source}: GPU indexes and uuids must be unique")
    links = {}
    indexes = {g.index for g in gpus}
    raw_links = raw.get("links", [])
    for n, link in enumerate(raw_links if isinstance(raw_links, list) else [None]):
        if not isinstance(link, dict) or not _whole(link.get("a")) or not _whole(link.get("b")) or not {link["a"], link["b"]} <= indexes:
            raise InventoryError(f"{source}: links[{n}] needs 'a' and 'b', the indexes of two declared GPUs")
        a, b = sorted((int(link["a"]), int(link["b"])))
        links[f"{a}-{b}"] = str(link.get("kind", "pcie-host"))
    machine = raw.get("machine", {})
    declarable = {"cpu_model": str, "cpu_cores": int, "ram_gib": int, "disk_gb": int}
    if not isinstance(machine, dict) or set(machine) - set(declarable) or not all(
            isinstance(v, declarable[k]) and not isinstance(v, bool) and (not isinstance(v, int) or v >= 0) for k, v in machine.items()):
        raise InventoryError(f"{source}: 'machine' may declare cpu_model (text) and cpu_cores, ram_gib, disk_gb (whole numbers, 0 or more), nothing else")
    return Inventory("declared", gpus, str(raw.get("driver_version", "")), str(raw.get("cuda_version", "")), links, dict(machine))


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def simulated_telemetry(inv: Inventory, busy: Iterable[int] = ()) -> list[GpuTelemetry]:
    """Telemetry for a declared inventory: figures from its `simulate` table, by load."""
    busy = set(busy)
    out = []
    models = catalogue.gpu_models()
    for g in inv.gpus:
        s = g.simulate
        on = g.index in busy
        util = s.get("busy_utilisation", 95.0) if on else s.get("idle_utilisation", 0.0)
        tdp = models[g.model].tdp_watts if g.model else 300
        out.append(GpuTelemetry(
            index=g.index,
            utilisation=util,
            memory_used_mib=int(g.memory_mib * (s.get("busy_memory_share", 0.8) if on else 0.0)),
            memory_total_mib=g.memory_mib,
            temperature_c=round(s.get("idle_temperature_c", 32.0) + util * s.get("degrees_per_percent", 0.4), 1),
            power_w=round(s.get("idle_power_w", tdp * 0.12) + util / 100 * tdp * 0.85, 1),
        ))
    return out


def detect(inventory_file: str | Path | None = None, *, nvml: Any = None, rocm_run: Runner | None = None) -> Inventory:
    """The machine's GPUs: the declared file if given, else NVML, else rocm-smi."""
    if inventory_file:
        return load_declared(inventory_file)
    inv = detect_nvml(nvml)
    if inv is not None and inv.gpus:
        return inv
    amd = detect_rocm(rocm_run)
    if amd is not None and amd.gpus:
        return amd
    return Inventory("none", [])


def telemetry(inv: Inventory, busy: Iterable[int] = ()) -> list[GpuTelemetry]:
    """Real figures from NVML; simulated ones only for a declared inventory, never made up."""
    if inv.source == "nvml":
        try:
            return telemetry_nvml()
        except Exception:
            return []
    if inv.source == "declared":
        return simulated_telemetry(inv, busy)
    return []
