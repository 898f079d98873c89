"""Round inputs and results as plain JSON-able dicts, and their digests.

``input_to_dict`` is what the server stores for each round; replaying it with
``clear_round(input_from_dict(d))`` must give a result whose ``digest`` equals
the stored one. Floats are written by Python's shortest round-trip repr, and
keys are sorted, so the bytes do not depend on the machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from typing import Any

from .types import (
    Bid,
    EngineInputError,
    GpuModel,
    Offer,
    Region,
    RoundConfig,
    RoundInput,
    RoundResult,
    RunningJob,
    Weights,
)


def _plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [_plain(x) for x in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        raise ValueError(f"cannot serialise non-finite float {obj}")
    return obj


def input_to_dict(inp: RoundInput) -> dict[str, Any]:
    out: dict[str, Any] = _plain(inp)
    return out


def result_to_dict(res: RoundResult) -> dict[str, Any]:
    out: dict[str, Any] = _plain(res)
    return out


def canonical_json(obj: Any) -> bytes:
    """Sorted keys, no whitespace, UTF-8; dataclasses become dicts."""
    return json.dumps(
        _plain(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def digest(obj: Any) -> str:
    return hashlib.sha256(canonical_json(obj)).hexdigest()


def _build(cls: type[Any], path: str, d: Any, nested: dict[str, Any] | None = None) -> Any:
    if not isinstance(d, dict):
        raise EngineInputError(path, f"must be an object, got {type(d).__name__}")
    names = [f.name for f in dataclasses.fields(cls)]
    required = {
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    for k in d:
        if k not in names:
            raise EngineInputError(f"{path}.{k}", "unknown field")
    for k in names:
        if k in required and k not in d:
            raise EngineInputError(f"{path}.{k}", "is required")
    kwargs: dict[str, Any] = {}
    for k in names:
        if k not in d:
            continue
        v = d[k]
        conv = (nested or {}).get(k)
        kwargs[k] = conv(f"{path}.{k}", v) if conv is not None else v
    return cls(**kwargs)


def _list(path: str, v: Any) -> list[Any]:
    if not isinstance(v, list | tuple):
        raise EngineInputError(path, f"must be a list, got {type(v).__name__}")
    return list(v)


def _strs(path: str, v: Any) -> tuple[Any, ...]:
    return tuple(_list(path, v))


def _weights(path: str, v: Any) -> Weights:
    w: Weights = _build(Weights, path, v)
    return w


def _region(path: str, v: Any) -> Region:
    r: Region = _build(Region, path, v, {"carbon_hourly": _strs})
    return r


def _bid(path: str, v: Any) -> Bid:
    nested = {
        "gpu_models": _strs,
        "allowed_regions": _strs,
        "preferred_regions": _strs,
        "weights": _weights,
    }
    b: Bid = _build(Bid, path, v, nested)
    return b


def _offer(path: str, v: Any) -> Offer:
    o: Offer = _build(Offer, path, v, {"shares": _strs})
    return o


def _latency(path: str, v: Any) -> tuple[tuple[str, str, float], ...]:
    rows = []
    for i, row in enumerate(_list(path, v)):
        r = _list(f"{path}[{i}]", row)
        if len(r) != 3:
            raise EngineInputError(f"{path}[{i}]", "must be a (from_region, to_region, ms) triple")
        rows.append((r[0], r[1], r[2]))
    return tuple(rows)


def input_from_dict(d: Any) -> RoundInput:
    """Rebuild a RoundInput, raising EngineInputError for a bad shape."""

    def items(cls: type[Any], conv: Any = None) -> Any:
        def f(path: str, v: Any) -> tuple[Any, ...]:
            if conv is not None:
                return tuple(conv(f"{path}[{i}]", x) for i, x in enumerate(_list(path, v)))
            return tuple(_build(cls, f"{path}[{i}]", x) for i, x in enumerate(_list(path, v)))

        return f

    nested = {
        "offers": items(Offer, _offer),
        "bids": items(Bid, _bid),
        "gpu_models": items(GpuModel),
        "regions": items(Region, _region),
        "latency_ms": _latency,
        "running": items(RunningJob),
        "occupied": items(Offer, _offer),
        "config": lambda p, v: _build(RoundConfig, p, v),
    }
    inp: RoundInput = _build(RoundInput, "input", d, nested)
    return inp
