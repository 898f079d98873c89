"""Read a real GPU cluster trace and map it onto GridBid's catalogue, regions and teams.

This is the one module that reads a trace. It needs no Django (only the Python standard
library, numpy and ``providers.catalogue``). The shipped trace is ``alibaba-gpu-2023``:
the node list and default pod list of Alibaba PAI's "openb" cluster (alibaba/clusterdata,
cluster-trace-gpu-v2023; Weng et al., USENIX ATC 2023), copied unchanged into
``market/simulate/data/alibaba-gpu-2023/`` with its attribution. Every rule below is
deterministic: the same files, arguments and seed give the same ``Trace``, byte for byte
(seeded numpy ``Generator`` and sha256, never Python's ``hash()``).

Files
    Node list: a CSV with the header ``sn,cpu_milli,memory_mib,gpu,model`` (all five
    required), one GPU node a line. Pod list: a CSV with the columns ``name, cpu_milli,
    num_gpu, gpu_milli, qos, creation_time, deletion_time, scheduled_time`` (required) and
    ``memory_mib, gpu_spec, pod_phase`` (optional), one pod a line; the format of
    alibaba/clusterdata's cluster-trace-gpu-v2023. Times are whole seconds on the trace's
    own clock. Every number must be a whole number >= 0; ``scheduled_time`` and
    ``gpu_spec`` may be empty, ``creation_time`` and ``deletion_time`` may not.

Models (``MODEL_MAP``, trace model -> catalogue GPU model id)
    - T4 -> ``T4-16GB``, V100M16 -> ``V100-PCIe-16GB``, V100M32 -> ``V100-SXM-32GB``,
      A10 -> ``A10-24GB``: the same cards.
    - P100 -> ``V100-PCIe-16GB``: the P100 is not in the catalogue; the 16 GB PCIe V100 is
      its successor with the same 16 GB of HBM2, the same 250 W PCIe board and the nearest
      price class (the T4, also 16 GB, is a 70 W inference card).
    - G2 -> ``A100-SXM-40GB``, G3 -> ``A100-SXM-80GB``: AN ASSUMPTION. The trace calls G1-G3
      "undisclosed internal GPU codes"; all its G2 and G3 nodes hold 8 GPUs, as data-centre
      training servers do, and G3's nodes are the larger (128 CPU cores, 768 GiB), so we
      give them the catalogue's two 8-GPU SXM A100 models, the 80 GB one to G3. G1 is not
      in the shipped files and is not mapped.
    A model the map does not know, in a node list or in a pod's ``gpu_spec``, is a
    ``TraceError`` naming it, its line and the known names. A pod's ``gpu_spec``
    ("V100M16|V100M32") becomes ``Pod.models``, the sorted distinct catalogue ids of the
    models it names; empty means any model, ``()``.

Regions
    Each node gets one of ``REGIONS`` (us-east, us-central, us-west): the node indices
    (0-based, in file order) are shuffled by ``numpy.random.default_rng([30, seed])
    .permutation(n)``, and the k-th index of that permutation goes to
    ``REGIONS[k % 3]``. So the regions hold n/3 nodes each (to within one); they are not
    balanced by model. The same seed gives the same regions. ``GRID_OF_REGION`` (``market.carbon``, the one mapping) names the
    grid (EIA balancing authority) whose carbon intensity stands for each region.

Teams
    The trace names no users. A pod's team is ``int(sha256(f"{qos}|{cpu_milli}|{num_gpu}|
    {gpu_milli}|{seed}").hexdigest(), 16) % teams``, with the four fields as written in the
    pod list (the raw ``gpu_milli``) and ``teams`` 1..64 (default 12). Pods with the same
    shape and QoS, which in a production cluster tend to come from the same owner's
    repeated jobs, so share a team.

Pods kept, and their fields
    - Only GPU pods are simulated: a pod with ``num_gpu`` 0 is left out and counted in
      ``left_out["no_gpu"]``. ``num_gpu`` above 64 is an error.
    - ``gpus`` = ``num_gpu``; ``gpu_milli`` = ``min(1000, gpu_milli)`` if it is > 0, else
      1000 (the whole GPU): the share of each of its GPUs the pod really uses. It still
      holds ``gpus`` whole GPUs.
    - ``runtime``: for a pod the trace scheduled, ``deletion_time - scheduled_time``; for a
      pod it never scheduled (empty ``scheduled_time``, 897 pods in the shipped trace),
      ``deletion_time - creation_time``, how long its owner kept asking for it. A runtime
      of 0 s becomes 1 s (such pods stay in). ``deletion_time`` before ``creation_time``
      or before ``scheduled_time``, or ``scheduled_time`` before ``creation_time``, is an
      error for that line.
    - ``scheduled_in_trace`` says whether ``scheduled_time`` was given.

Window
    A pod arrives at its ``creation_time``. ``Trace.window_start`` is on the trace's clock;
    ``Pod.arrival`` is seconds after it.
    - ``days=None``: the whole trace. The window starts at the earliest GPU pod's creation
      and ``window_s`` = last creation - first creation (at least 1 s), so the last pod
      arrives at ``arrival == window_s``. ``start`` needs ``days``.
    - ``days=D`` (0 < D <= 365) with ``start=None``: the busiest stretch. Of the windows
      ``[c, c + D*86400)`` with ``c`` the creation time of some GPU pod, the one holding the
      most work of the GPU pods created in it, counted inside the window:
      ``sum(gpus * min(runtime, c + D*86400 - creation))`` (``window_work``); ties go to
      the earliest ``c``. ``window_s`` = D*86400. (Work is clipped at the window's end
      because unclipped ``gpus * runtime`` picks a near-empty week: in the shipped trace a
      handful of pods run for months, and the 7-day window with the most unclipped work,
      at day 31, holds 4 pods; the clipped rule picks day 136.7, with 1,403.)
    - ``days=D``, ``start=T`` (seconds on the trace's clock): the window ``[T, T + D*86400)``.
    GPU pods created outside the window are counted in ``left_out["outside_window"]``. A
    window into which no GPU pod arrives is a ``TraceError`` naming the window and the
    trace's first and last arrival.

Load
    ``load=F`` (0 < F <= 1) rescales time so that the offered load over the window is F,
    where ``offered_load = sum(gpus * runtime) / (GPUs in the node list * window_s)``:
    ``time_scale = work / (GPUs * window_s * F)``, work being the window's pods' whole
    ``sum(gpus * runtime)`` (not clipped); every arrival and ``window_s`` are
    multiplied by ``time_scale`` (below 1 compresses, above 1 stretches); runtimes are not
    changed. Without ``load``, ``time_scale`` is 1.0 and ``load_factor`` None. Where pods
    run past the window's end (in the shipped trace a few run for months) much of that
    work falls after it: ``load_inside`` counts only what falls inside (about 0.05 in the
    busiest week at ``load=0.6``: the week's 1,403 pods cannot fill 6,212 GPUs however
    close together they arrive; the capacity each policy needs at the SLO is the figure
    that tells them apart).

Errors
    Bad input (a missing or unreadable file, a header without the required columns, a row
    with a missing, malformed or out-of-range field, an unknown model, an empty list, a
    repeated node or pod id, an empty window, an argument out of range) raises
    ``TraceError``, a ``ValueError`` whose message names the file, the line (1-based, the
    header is line 1) and the field, what is wrong and how to fix it. Never a traceback.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from market.carbon import GRID_OF_REGION
from providers import catalogue

__all__ = [
    "GRID_OF_REGION",
    "MODEL_MAP",
    "REGIONS",
    "TRACES",
    "Node",
    "Pod",
    "RawPod",
    "Trace",
    "TraceError",
    "load",
    "load_inside",
    "offered_load",
    "read_nodes",
    "read_pods",
    "team_of",
    "window_work",
]

DAY_S = 86_400.0
MAX_DAYS = 365.0
MAX_TEAMS = 64
MAX_POD_GPUS = 64

DATA = Path(__file__).resolve().parent / "data"
TRACES: dict[str, tuple[Path, Path]] = {
    "alibaba-gpu-2023": (
        DATA / "alibaba-gpu-2023" / "openb_pod_list_default.csv",
        DATA / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv",
    ),
}

MODEL_MAP: dict[str, str] = {
    "A10": "A10-24GB",
    "G2": "A100-SXM-40GB",  # assumption: undisclosed internal model of 8-GPU nodes
    "G3": "A100-SXM-80GB",  # assumption: undisclosed internal model of 8-GPU nodes
    "P100": "V100-PCIe-16GB",  # not in the catalogue: same 16 GB HBM2, 250 W PCIe class
    "T4": "T4-16GB",
    "V100M16": "V100-PCIe-16GB",
    "V100M32": "V100-SXM-32GB",
}

REGIONS: tuple[str, ...] = ("us-east", "us-central", "us-west")

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
POD_REQUIRED = (
    "name",
    "cpu_milli",
    "num_gpu",
    "gpu_milli",
    "qos",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)
NO_TIMES = (
    "a pod list needs creation_time and deletion_time in seconds "
    "(the format of alibaba clusterdata cluster-trace-gpu-v2023)"
)


class TraceError(ValueError):
    """Bad trace input: the message names the file, the line (1-based, header = line 1),
    what is wrong and how to fix it."""


@dataclass(frozen=True, slots=True)
class Node:
    id: str  # the trace's sn
    gpus: int  # >= 1
    model: str  # GridBid catalogue GPU model id
    trace_model: str  # the model name as the trace writes it
    region: str  # GridBid region id
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class Pod:
    id: str  # the trace's name
    arrival: float  # seconds after the window's start (>= 0)
    runtime: float  # seconds it runs once placed (> 0)
    gpus: int  # whole GPUs it holds (>= 1)
    gpu_milli: int  # share of each GPU it really uses, 1..1000 (1000 = whole)
    models: tuple[str, ...]  # GridBid model ids it may run on, sorted; () = any
    qos: str
    team: int  # 0 .. teams-1
    scheduled_in_trace: bool
    cpu_milli: int = 0  # CPU it asked for, thousandths of a core (a workload's shape, for runtime prediction)


@dataclass(frozen=True, slots=True)
class RawPod:
    """One row of a pod list, checked, on the trace's clock (``read_pods``)."""

    line: int
    id: str
    cpu_milli: int
    num_gpu: int
    gpu_milli: int  # as written in the file
    models: tuple[str, ...]  # catalogue ids from gpu_spec, sorted; () = any
    qos: str
    creation: int
    deletion: int
    scheduled: int | None  # None: never scheduled in the trace

    @property
    def runtime(self) -> float:
        """Seconds it runs: from scheduled (or, never scheduled, from creation) to deletion,
        at least 1 s."""
        begin = self.creation if self.scheduled is None else self.scheduled
        return float(max(self.deletion - begin, 1))


@dataclass(frozen=True)
class Trace:
    name: str  # e.g. "alibaba-gpu-2023", or the pods file's name for --pods
    nodes: tuple[Node, ...]  # in the file's order
    pods: tuple[Pod, ...]  # sorted by (arrival, id)
    window_start: float  # in the trace's own clock (seconds)
    window_s: float  # the window's length in seconds (after --load compression)
    teams: int
    load_factor: float | None  # the --load asked for, None for the trace's own timing
    time_scale: float  # arrival times were multiplied by this (1.0 without --load)
    left_out: dict[str, int]  # counts of pods not simulated, by reason


# ---------------------------------------------------------------- reading


def _rows(path: Path, kind: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The header and the non-blank rows (with their 1-based line numbers) of a CSV file."""
    try:
        with path.open(encoding="utf-8", newline="") as f:
            reader = csv.reader(f)
            header: list[str] | None = None
            rows: list[tuple[int, list[str]]] = []
            for row in reader:
                if not row or (len(row) == 1 and not row[0].strip()):
                    continue
                if header is None:
                    header = [c.strip().lstrip("\ufeff") for c in row]
                    continue
                rows.append((reader.line_num, row))
    except FileNotFoundError:
        raise TraceError(f"{path}: no such {kind} file; check the path") from None
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise TraceError(f"{path}: cannot read the {kind} as UTF-8 CSV: {e}") from None
    if header is None:
        raise TraceError(
            f"{path}: the {kind} is empty; it needs a header line and at least one row"
        )
    return header, rows


def _check_header(
    path: Path, header: list[str], required: Sequence[str], expected: Sequence[str], kind: str
) -> dict[str, int]:
    index: dict[str, int] = {}
    for i, name in enumerate(header):
        index.setdefault(name, i)
    missing = [c for c in required if c not in index]
    if missing:
        raise TraceError(
            f"{path}, line 1: the {kind}'s header lacks the column(s) {', '.join(missing)}; "
            f"expected the header {','.join(expected)}"
        )
    return index


def _field(row: list[str], index: dict[str, int], name: str) -> str:
    i = index.get(name)
    if i is None or i >= len(row):
        return ""
    return row[i].strip()


def _whole(path: Path, line: int, name: str, text: str) -> int:
    if text.isdigit() and text.isascii():
        return int(text)
    if not text:
        raise TraceError(f"{path}, line {line}: {name} is empty; write a whole number >= 0")
    raise TraceError(
        f"{path}, line {line}: {name} is {text!r}, not a whole number >= 0; write it as digits only"
    )


def _model(path: Path, line: int, name: str, text: str) -> str:
    mapped = MODEL_MAP.get(text)
    if mapped is None:
        raise TraceError(
            f"{path}, line {line}: {name} names the unknown GPU model {text!r}; "
            f"the known trace models are {', '.join(sorted(MODEL_MAP))}"
        )
    return mapped


def _check_width(path: Path, line: int, row: list[str], header: list[str]) -> None:
    if len(row) != len(header):
        raise TraceError(
            f"{path}, line {line}: the row has {len(row)} fields but the header has "
            f"{len(header)}; write one value per column (an empty one between commas)"
        )


def _check_catalogue() -> None:
    models = catalogue.gpu_models()
    regions = catalogue.regions()
    absent = sorted({m for m in MODEL_MAP.values() if m not in models})
    absent += [r for r in REGIONS if r not in regions]
    if absent:  # a catalogue edit, not bad input: say which ids went missing
        raise TraceError(
            f"providers/data lacks the catalogue id(s) {', '.join(absent)} that "
            "market/simulate/trace.py maps the trace onto; restore them or update MODEL_MAP/REGIONS"
        )


def _regions(n: int, seed: int) -> list[str]:
    order = np.random.default_rng([30, seed]).permutation(n)
    out = [""] * n
    for k, i in enumerate(order.tolist()):
        out[i] = REGIONS[k % len(REGIONS)]
    return out


def _check_seed(seed: int) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TraceError(f"seed is {seed!r}; give a whole number >= 0")


def read_nodes(path: Path, *, seed: int = 0) -> tuple[Node, ...]:
    """The nodes of a node list, in the file's order, with catalogue models and seeded
    regions (see the module's docstring)."""
    _check_seed(seed)
    _check_catalogue()
    path = Path(path)
    header, rows = _rows(path, "node list")
    index = _check_header(path, header, NODE_COLUMNS, NODE_COLUMNS, "node list")
    parsed: list[tuple[str, int, str, str, int, int]] = []
    seen: dict[str, int] = {}
    for line, row in rows:
        _check_width(path, line, row, header)
        sn = _field(row, index, "sn")
        if not sn:
            raise TraceError(f"{path}, line {line}: sn is empty; give every node an id")
        if sn in seen:
            raise TraceError(
                f"{path}, line {line}: sn {sn!r} repeats line {seen[sn]}; node ids must be unique"
            )
        seen[sn] = line
        cpu = _whole(path, line, "cpu_milli", _field(row, index, "cpu_milli"))
        mem = _whole(path, line, "memory_mib", _field(row, index, "memory_mib"))
        gpus = _whole(path, line, "gpu", _field(row, index, "gpu"))
        if gpus < 1:
            raise TraceError(
                f"{path}, line {line}: gpu is {gpus}; a node list holds GPU nodes only "
                "(gpu >= 1): drop the CPU-only nodes"
            )
        trace_model = _field(row, index, "model")
        model = _model(path, line, "model", trace_model)
        parsed.append((sn, gpus, model, trace_model, cpu, mem))
    if not parsed:
        raise TraceError(f"{path}: the node list has a header but no nodes; add at least one")
    regions = _regions(len(parsed), seed)
    return tuple(
        Node(id=sn, gpus=g, model=m, trace_model=tm, region=r, cpu_milli=c, memory_mib=mm)
        for (sn, g, m, tm, c, mm), r in zip(parsed, regions, strict=True)
    )


def read_pods(path: Path) -> list[RawPod]:
    """Every row of a pod list (GPU and CPU-only pods), checked, in the file's order."""
    path = Path(path)
    header, rows = _rows(path, "pod list")
    names = set(header)
    for column in ("creation_time", "deletion_time"):
        if column not in names:
            raise TraceError(f"{path}, line 1: the pod list has no {column}: {NO_TIMES}")
    index = _check_header(path, header, POD_REQUIRED, POD_COLUMNS, "pod list")
    out: list[RawPod] = []
    seen: dict[str, int] = {}
    spec_cache: dict[str, tuple[str, ...]] = {"": ()}
    i_name, i_cpu, i_gpus, i_milli, i_qos, i_created, i_deleted, i_scheduled = (
        index[c] for c in POD_REQUIRED
    )
    i_spec = index.get("gpu_spec")
    width = len(header)
    for line, row in rows:
        if len(row) != width:
            _check_width(path, line, row, header)
        name = row[i_name].strip()
        if not name:
            raise TraceError(f"{path}, line {line}: name is empty; give every pod an id")
        if name in seen:
            raise TraceError(
                f"{path}, line {line}: name {name!r} repeats line {seen[name]}; "
                "pod names must be unique"
            )
        seen[name] = line
        created_text, deleted_text = row[i_created].strip(), row[i_deleted].strip()
        for column, text in (("creation_time", created_text), ("deletion_time", deleted_text)):
            if not text:
                raise TraceError(f"{path}, line {line}: the pod has no {column}: {NO_TIMES}")
        cpu = _whole(path, line, "cpu_milli", row[i_cpu].strip())
        num_gpu = _whole(path, line, "num_gpu", row[i_gpus].strip())
        if num_gpu > MAX_POD_GPUS:
            raise TraceError(
                f"{path}, line {line}: num_gpu is {num_gpu}; at most {MAX_POD_GPUS} GPUs a pod"
            )
        gpu_milli = _whole(path, line, "gpu_milli", row[i_milli].strip())
        creation = _whole(path, line, "creation_time", created_text)
        deletion = _whole(path, line, "deletion_time", deleted_text)
        sched_text = row[i_scheduled].strip()
        scheduled = _whole(path, line, "scheduled_time", sched_text) if sched_text else None
        if deletion < creation:
            raise TraceError(
                f"{path}, line {line}: deletion_time {deletion} is before creation_time "
                f"{creation}; a pod is deleted after it is created"
            )
        if scheduled is not None and scheduled < creation:
            raise TraceError(
                f"{path}, line {line}: scheduled_time {scheduled} is before creation_time "
                f"{creation}; leave scheduled_time empty for a pod never scheduled"
            )
        if scheduled is not None and deletion < scheduled:
            raise TraceError(
                f"{path}, line {line}: deletion_time {deletion} is before scheduled_time "
                f"{scheduled}; a pod is deleted after it is scheduled"
            )
        spec = "" if i_spec is None else row[i_spec].strip()
        models = spec_cache.get(spec)
        if models is None:
            parts = [p.strip() for p in spec.split("|") if p.strip()]
            models = tuple(sorted({_model(path, line, "gpu_spec", p) for p in parts}))
            spec_cache[spec] = models
        out.append(
            RawPod(
                line=line,
                id=name,
                cpu_milli=cpu,
                num_gpu=num_gpu,
                gpu_milli=gpu_milli,
                models=models,
                qos=row[i_qos].strip(),
                creation=creation,
                deletion=deletion,
                scheduled=scheduled,
            )
        )
    if not out:
        raise TraceError(f"{path}: the pod list has a header but no pods; add at least one")
    return out


# ---------------------------------------------------------------- mapping


def team_of(raw: RawPod, teams: int, seed: int) -> int:
    """The pod's team: sha256 of its QoS and shape and the seed, mod ``teams``."""
    key = f"{raw.qos}|{raw.cpu_milli}|{raw.num_gpu}|{raw.gpu_milli}|{seed}"
    return int(hashlib.sha256(key.encode()).hexdigest(), 16) % teams


def offered_load(pods: Sequence[Pod], nodes: Sequence[Node], window_s: float) -> float:
    """GPU-seconds of work offered over GPU-seconds of capacity in the window:
    ``sum(gpus * runtime) / (sum(node gpus) * window_s)``."""
    capacity = sum(n.gpus for n in nodes) * window_s
    if capacity <= 0:
        raise TraceError(f"offered_load needs GPUs and a window > 0 s (window_s={window_s})")
    return sum(p.gpus * p.runtime for p in pods) / capacity


def load_inside(pods: Sequence[Pod], nodes: Sequence[Node], window_s: float) -> float:
    """The offered load counted inside the window: ``sum(gpus * min(runtime, window_s -
    arrival)) / (sum(node gpus) * window_s)``, the utilisation of a cluster that ran every pod
    the moment it arrived. Below ``offered_load`` where pods run past the window's end."""
    capacity = sum(n.gpus for n in nodes) * window_s
    if capacity <= 0:
        raise TraceError(f"load_inside needs GPUs and a window > 0 s (window_s={window_s})")
    return sum(p.gpus * min(p.runtime, max(0.0, window_s - p.arrival)) for p in pods) / capacity


def _number(name: str, value: float, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TraceError(f"{name} is {value!r}; give a number with {low:g} < {name} <= {high:g}")
    x = float(value)
    if not (low < x <= high):  # also false for NaN
        raise TraceError(f"{name} is {value!r}; give a number with {low:g} < {name} <= {high:g}")
    return x


def window_work(
    creations: np.ndarray, gpus: np.ndarray, runtimes: np.ndarray, start: float, length: float
) -> float:
    """GPU-seconds of work that pods arriving in ``[start, start + length)`` do inside it:
    the sum of ``gpus * min(runtime, start + length - creation)`` (``creations`` sorted)."""
    end = start + length
    i = int(np.searchsorted(creations, start, side="left"))
    j = int(np.searchsorted(creations, end, side="left"))
    inside = np.minimum(runtimes[i:j], end - creations[i:j])
    return float(np.dot(gpus[i:j], inside))


def _busiest_start(
    creations: np.ndarray, gpus: np.ndarray, runtimes: np.ndarray, length: float
) -> float:
    """The creation time that starts the busiest window (the earliest of equals)."""
    best, best_work = float(creations[0]), -1.0
    for c in np.unique(creations).tolist():  # ascending: a later tie never wins
        work = window_work(creations, gpus, runtimes, float(c), length)
        if work > best_work:
            best, best_work = float(c), work
    return best


def load(
    *,
    trace: str = "alibaba-gpu-2023",
    pods: Path | None = None,
    nodes: Path | None = None,
    days: float | None = None,
    start: float | None = None,
    load: float | None = None,
    seed: int = 0,
    teams: int = 12,
) -> Trace:
    """Read a trace and map it (see the module's docstring for every rule)."""
    if trace not in TRACES and (pods is None or nodes is None):
        raise TraceError(
            f"unknown trace {trace!r}; the shipped traces are {', '.join(sorted(TRACES))} "
            "(or give both pods and nodes files)"
        )
    _check_seed(seed)
    if isinstance(teams, bool) or not isinstance(teams, int) or not 1 <= teams <= MAX_TEAMS:
        raise TraceError(f"teams is {teams!r}; give a whole number from 1 to {MAX_TEAMS}")
    length = None if days is None else _number("days", days, 0.0, MAX_DAYS) * DAY_S
    load_factor = None if load is None else _number("load", load, 0.0, 1.0)
    if start is not None:
        if length is None:
            raise TraceError(f"start is {start!r} but days is not given; give days with start")
        if (
            isinstance(start, bool)
            or not isinstance(start, int | float)
            or not math.isfinite(start)
        ):
            raise TraceError(f"start is {start!r}; give seconds on the trace's clock")

    pods_path = Path(pods) if pods is not None else TRACES[trace][0]
    nodes_path = Path(nodes) if nodes is not None else TRACES[trace][1]
    name = pods_path.name if pods is not None else trace
    node_list = read_nodes(nodes_path, seed=seed)
    raws = read_pods(pods_path)

    gpu_pods = [r for r in raws if r.num_gpu > 0]
    left_out = {"no_gpu": len(raws) - len(gpu_pods), "outside_window": 0}
    if not gpu_pods:
        raise TraceError(f"{pods_path}: no pod asks for a GPU (num_gpu >= 1); nothing to simulate")
    gpu_pods.sort(key=lambda r: (r.creation, r.id))
    creations = np.fromiter((r.creation for r in gpu_pods), dtype=np.int64, count=len(gpu_pods))
    first, last = int(creations[0]), int(creations[-1])

    if length is None:
        window_start = float(first)
        window_s = float(max(last - first, 1))
        chosen = gpu_pods
    else:
        if start is None:
            n = len(gpu_pods)
            gpus = np.fromiter((r.num_gpu for r in gpu_pods), dtype=np.float64, count=n)
            runtimes = np.fromiter((r.runtime for r in gpu_pods), dtype=np.float64, count=n)
            window_start = _busiest_start(creations.astype(np.float64), gpus, runtimes, length)
        else:
            window_start = float(start)
        window_s = length
        end = window_start + length
        chosen = [r for r in gpu_pods if window_start <= r.creation < end]
        if not chosen:
            raise TraceError(
                f"{pods_path}: no GPU pod arrives in the window "
                f"[{window_start:.10g}, {end:.10g}) s ({length / DAY_S:.10g} days from "
                f"start={window_start:.10g}); the trace's GPU pods arrive from {first} to "
                f"{last} s: choose a start in that range"
            )
        left_out["outside_window"] = len(gpu_pods) - len(chosen)

    capacity = sum(n.gpus for n in node_list)
    time_scale = 1.0
    if load_factor is not None:
        work_s = sum(r.num_gpu * r.runtime for r in chosen)
        time_scale = work_s / (capacity * window_s * load_factor)
        window_s *= time_scale

    out = [
        Pod(
            id=r.id,
            arrival=(r.creation - window_start) * time_scale,
            runtime=r.runtime,
            gpus=r.num_gpu,
            gpu_milli=min(1000, r.gpu_milli) if r.gpu_milli > 0 else 1000,
            models=r.models,
            qos=r.qos,
            team=team_of(r, teams, seed),
            scheduled_in_trace=r.scheduled is not None,
            cpu_milli=r.cpu_milli,
        )
        for r in chosen
    ]
    out.sort(key=lambda p: (p.arrival, p.id))
    return Trace(
        name=name,
        nodes=node_list,
        pods=tuple(out),
        window_start=window_start,
        window_s=window_s,
        teams=teams,
        load_factor=load_factor,
        time_scale=time_scale,
        left_out=left_out,
    )
