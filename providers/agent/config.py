"""The agent's home directory and its TOML configuration.

Everything the agent keeps lives under one data directory: `GRIDBID_AGENT_HOME`
or `~/.gridbid-agent`. The config file holds the market URL and API token, so it
is written 0600 like the keys.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from contracts import hours

CONFIG_NAME = "agent.toml"


class ConfigError(Exception):
    """The configuration is missing or wrong; the message says how to fix it."""


def agent_home(explicit: str | os.PathLike[str] | None = None) -> Path:
    raw = explicit or os.environ.get("GRIDBID_AGENT_HOME") or Path.home() / ".gridbid-agent"
    return Path(raw).expanduser().resolve()


@dataclass
class PricingRule:
    """How one GPU model is priced; amounts are token base units per GPU-hour."""

    gpu_model: str
    kind: str = "fixed"  # "fixed" or "utilisation"
    price: int = 0  # fixed price, or the floor for "utilisation"
    premium: int = 0  # added at full utilisation
    exponent: float = 1.0  # premium x utilisation**exponent
    min_duration_s: int = 60
    max_duration_s: int = 30 * 24 * 3600
    spot_allowed: bool = True
    reclaimable: bool = False  # lent: sold to spot bids only, taken back with `gridbid-agent reclaim`
    reclaim_hours: str = ""  # ... and every day in these UTC hours (contracts.hours), e.g. "08-20"
    # ... and when a queue runs deep (providers.agent.tides): a command printing its depth,
    # taken back above reclaim_queue_above, lent again at or below release_queue_below
    # (default: half of it) held for release_after_s
    reclaim_queue_command: str = ""
    reclaim_queue_above: float = 0.0
    release_queue_below: float | None = None
    release_after_s: float = 300.0
    # the window the offer sells in (issue 40), ISO 8601 with a zone: "" is from now, and for ever
    available_from: str = ""
    available_until: str = ""

    @property
    def release_mark(self) -> float:
        """The queue depth at or below which lent GPUs taken back by the queue go out again."""
        return self.release_queue_below if self.release_queue_below is not None else self.reclaim_queue_above / 2


def moment(text: object, name: str) -> datetime | None:
    """An ISO 8601 time with its zone ("2026-12-14T08:00Z"); "" is None. ValueError saying
    what to write otherwise."""
    if text in ("", None):
        return None
    if not isinstance(text, str):
        raise ValueError(f"{name} is text, like 2026-12-14T08:00Z")
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a time: write it like 2026-12-14T08:00Z") from None
    if when.tzinfo is None:
        raise ValueError(f"{name} {text!r} has no zone: add one, like 2026-12-14T08:00Z or 2026-12-14T09:00+01:00")
    return when.astimezone(UTC)


def window_of(rule: PricingRule) -> tuple[datetime | None, datetime | None]:
    """The rule's selling window (None: from now / for ever); ValueError if it is not one."""
    start, end = moment(rule.available_from, "available_from"), moment(rule.available_until, "available_until")
    if start is not None and end is not None and end <= start:
        raise ValueError(f"available_until ({rule.available_until}) must be after available_from ({rule.available_from})")
    return start, end


@dataclass
class AgentConfig:
    market_url: str
    token: str
    machine_name: str
    region: str = "us-east"
    machine_id: int | None = None
    inventory_file: str | None = None
    runtime: str = "auto"  # auto, process, docker, podman
    heartbeat_s: float = 5.0
    poll_s: float = 5.0
    offer_sync_s: float = 30.0
    websocket: bool = True  # assignment push; REST polling always runs as well
    grace_s: float = 30.0
    max_output_bytes: int = 10 * 1024**3
    # outputs of a job without an upload_url go to the market's storage after it ends: each
    # file is tried this many times, waiting upload_retry_s, doubling, between tries
    upload_attempts: int = 6
    upload_retry_s: float = 5.0
    accept_trade_states: list[str] = field(default_factory=lambda: ["recorded"])
    require_buyer_signature: bool = True  # the market signs custodial buyers' specs; wallet buyers sign their own
    measured_tflops: float | None = None
    net_down_mbps: int | None = None  # bandwidth to the market, as `gridbid-agent benchmark` measured it
    net_up_mbps: int | None = None
    rpc_url: str | None = None  # our own chain node; unset: the one the market names
    public_host: str | None = None  # the name or address buyers reach this machine's published ports at
    host_port_min: int = 40000  # host ports published container ports are mapped to, first
    host_port_max: int = 40999  # and last
    pricing: list[PricingRule] = field(default_factory=list)

    @property
    def api(self) -> str:
        return self.market_url.rstrip("/") + "/api/v1"


def config_path(home: Path) -> Path:
    return home / CONFIG_NAME


def load_config(home: Path) -> AgentConfig:
    path = config_path(home)
    if not path.exists():
        raise ConfigError(f"No agent configuration at {path}. Run `gridbid-agent init --market URL --token T` first.")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    return config_from_dict(raw, source=str(path))


def config_from_dict(raw: dict[str, Any], *, source: str = "config") -> AgentConfig:
    known = {f.name for f in fields(AgentConfig)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ConfigError(f"{source}: unknown setting(s) {', '.join(unknown)}")
    for required in ("market_url", "token", "machine_name"):
        if not raw.get(required):
            raise ConfigError(f"{source}: {required} is missing; run `gridbid-agent init` again")
    data = dict(raw)
    rules = []
    rule_fields = {f.name for f in fields(PricingRule)}
    for i, rule in enumerate(data.pop("pricing", []) or []):
        extra = set(rule) - rule_fields
        if extra or "gpu_model" not in rule:
            raise ConfigError(f"{source}: pricing[{i}] has unknown keys {sorted(extra)} or no gpu_model")
        try:
            hours.parse(rule.get("reclaim_hours", ""))
        except (hours.HoursError, AttributeError, TypeError) as exc:
            raise ConfigError(f"{source}: pricing[{i}].reclaim_hours: {exc}; write UTC hours like \"08-20\"") from None
        r = PricingRule(**rule)
        try:
            window_of(r)
        except ValueError as exc:
            raise ConfigError(f"{source}: pricing[{i}]: {exc}; set it with `gridbid-agent price set MODEL ... --from T --until T`") from None
        number = (int, float)
        if not isinstance(r.reclaim_queue_command, str) or not isinstance(r.reclaim_queue_above, number) \
                or not isinstance(r.release_after_s, number) or not isinstance(r.release_queue_below, (*number, type(None))):
            raise ConfigError(f"{source}: pricing[{i}]: reclaim_queue_command is text and reclaim_queue_above, release_queue_below "
                              "and release_after_s are numbers; set them with `gridbid-agent price set MODEL ... --lend --reclaim-queue CMD`")
        rules.append(r)
    config = AgentConfig(**data, pricing=rules)
    ports_check(config, source=source)
    return config


def ports_check(config: AgentConfig, *, source: str = "config") -> None:
    low, high = config.host_port_min, config.host_port_max
    if not (isinstance(low, int) and isinstance(high, int) and 1024 <= low <= high <= 65535):
        raise ConfigError(f"{source}: host_port_min..host_port_max must be whole numbers with 1024 <= min <= max <= 65535 (got {low!r}..{high!r})")
    if config.public_host is not None and (not isinstance(config.public_host, str) or not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.:-]{0,252}[A-Za-z0-9])?", config.public_host)):
        raise ConfigError(f"{source}: public_host must be a host name or IP address (got {config.public_host!r})")


def config_to_dict(config: AgentConfig) -> dict[str, Any]:
    # TOML has no null: unset optional values are simply left out
    def clean(d: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in d.items() if v is not None}

    data = clean(asdict(config))
    data["pricing"] = [clean(r) for r in data.get("pricing", [])]
    return data


def save_config(home: Path, config: AgentConfig) -> Path:
    import tomli_w

    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = config_path(home)
    write_private(path, tomli_w.dumps(config_to_dict(config)).encode())
    return path


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically with mode 0600 (it holds a secret)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)
